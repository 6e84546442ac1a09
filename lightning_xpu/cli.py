"""The ``lightning-xpu`` command line: workspace, export, apply, build, doctor."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_xpu.errors import ToolError


def _series(args: argparse.Namespace):  # noqa: ANN202
    from lightning_xpu.base import load_base
    from lightning_xpu.series import find_series_dir, load_series

    directory = find_series_dir(args.series)
    return load_series(directory), load_base(directory)


def cmd_workspace(args: argparse.Namespace) -> int:
    from lightning_xpu.workspace import create_workspace

    series, base = _series(args)
    repo = create_workspace(series, base, args.dir)
    print(f"Created workspace {repo}: lightning {base.version} base commit (tag lightning-xpu/base) "
          f"and {series.version} patch commits.")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from lightning_xpu.series import find_series_dir
    from lightning_xpu.workspace import export_workspace

    series_dir = find_series_dir(args.series)
    if args.series is None and series_dir.parent.name == "lightning_xpu":
        raise ToolError("the default series is the copy inside the installed package; "
                        "pass --series DIR pointing at a checkout's patches/ directory")
    from lightning_xpu.base import load_base

    names = export_workspace(args.dir, series_dir, load_base(series_dir))
    print(f"Exported {len(names)} patches and the series file to {series_dir}.")
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    series, base = _series(args)
    if args.revert and not args.installed:
        raise ToolError("--revert only works together with --installed")
    if args.installed:
        if args.target is not None:
            raise ToolError("give either a TARGET or --installed, not both")
        from lightning_xpu.installed import apply_installed, revert_installed

        if args.revert:
            if args.check:
                raise ToolError("--check cannot be combined with --revert")
            result = revert_installed()
            print(f"Reverted {result.site_packages}: restored {result.changed + result.removed} files, "
                  f"deleted {result.added} added files; Lightning is pristine {base.version} again.")
            return 0
        result = apply_installed(series, base, check=args.check)
        verb = "Would patch" if args.check else "Patched"
        print(f"{verb} {', '.join(result.roots)} in {result.site_packages} to {result.version}: "
              f"{result.changed} changed, {result.added} added, {result.removed} removed files.")
        return 0
    from lightning_xpu.apply import apply

    if args.target is None:
        if not args.check:
            raise ToolError("give a TARGET directory, --installed, or --check to check against the pinned base")
        from lightning_xpu.base import LIGHTNING, unpacked_sdist

        target = unpacked_sdist(base.sdist(LIGHTNING), base.version)
        result = apply(series, target, check=True)
        print(f"All {len(result.applied)} patches apply to the pinned base lightning {base.version}.")
        return 0
    result = apply(series, args.target, check=args.check)
    what = "git checkout" if result.kind == "git" else "source tree"
    if args.check:
        print(f"All {len(result.applied)} patches apply to the {what} {result.target}.")
    else:
        how = " as commits" if result.kind == "git" else ""
        print(f"Applied {len(result.applied)} patches{how} to the {what} {result.target}.")
        if result.already_present:
            print(f"Skipped {len(result.already_present)} patches whose changes were already present (no commit): "
                  + ", ".join(result.already_present))
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from lightning_xpu.wheels import build, install

    series, base = _series(args)
    wheels = build(series, base, args.dist)
    for wheel in wheels:
        print(wheel)
    if args.install:
        install(wheels)
        print(f"Installed lightning, pytorch-lightning and lightning-fabric {base.version}+{series.local_version}.")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from lightning_xpu.doctor import collect, format_report

    data = collect()
    print(json.dumps(data, indent=2) if args.json else format_report(data))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-xpu",
        description="Intel GPU (xpu) support for PyTorch Lightning as a patch series against lightning 2.6.6.",
        epilog="Downloads are cached in $LIGHTNING_XPU_CACHE (default ~/.cache/lightning-xpu).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    series_help = "directory holding `series`, the patches and base.toml (default: the checkout's patches/)"

    p = sub.add_parser("workspace", help="create a git repo: the base as one commit, each patch a commit",
                       description="Create DIR as a git repository holding the pinned lightning sdist as one commit "
                                   "(tagged lightning-xpu/base) and every patch of the series as its own commit.")
    p.add_argument("dir", type=Path, metavar="DIR", help="new or empty directory")
    p.add_argument("--series", type=Path, metavar="DIR", help=series_help)
    p.set_defaults(func=cmd_workspace)

    p = sub.add_parser("export", help="regenerate patches/ and series from a workspace's commits",
                       description="Write one NNNN-subject.patch per commit after lightning-xpu/base in the "
                                   "workspace DIR, and the series file, into the series directory. Deterministic.")
    p.add_argument("dir", type=Path, metavar="DIR", help="a workspace made by `lightning-xpu workspace`")
    p.add_argument("--series", type=Path, metavar="DIR", help=series_help + "; the export writes here")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("apply", help="apply the series to a checkout, a source tree or the installed Lightning",
                       description="Apply the series atomically: to an upstream git checkout (git am -3), a plain "
                                   "source tree such as an unpacked sdist (git apply), or with --installed to the "
                                   "Lightning installed in this environment (with a backup; --revert restores it). "
                                   "On failure the target is unchanged and the patch, file and hunk are named.")
    p.add_argument("target", type=Path, nargs="?", metavar="TARGET", help="git checkout or source tree")
    p.add_argument("--check", action="store_true",
                   help="dry run; without TARGET, check the series against the pinned base")
    p.add_argument("--installed", action="store_true", help="patch the installed lightning in place")
    p.add_argument("--revert", action="store_true", help="with --installed: restore the original files")
    p.add_argument("--series", type=Path, metavar="DIR", help=series_help)
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("build", help="build the patched lightning, pytorch-lightning and lightning-fabric wheels",
                       description="Build the three drop-in wheels at version BASE+xpu.N (N = number of patches) "
                                   "into dist/, using upstream's mirroring for the standalone packages.")
    p.add_argument("--install", action="store_true",
                   help="install the wheels into this environment (keeps the installed torch)")
    p.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR", help="output directory (default: dist)")
    p.add_argument("--series", type=Path, metavar="DIR", help=series_help)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("doctor", help="report torch, XPU devices, xccl/ccl and the installed Lightning",
                       description="Print torch version and build, torch.xpu availability, devices and memory, "
                                   "xccl/ccl availability, which Lightning is installed and whether it is patched, "
                                   "and the Level Zero / oneAPI environment variables.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ToolError as err:
        print(f"lightning-xpu: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lightning-xpu: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
