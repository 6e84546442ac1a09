"""The ``lightning-xpu`` command line: workspace, export, port, apply, build, doctor."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_xpu.errors import ToolError


def _series(args: argparse.Namespace):  # noqa: ANN202
    """The series and its base: a ``Base`` (the sdists) or an ``UpstreamBase`` (a commit of upstream's history)."""
    from lightning_xpu.base import load_base
    from lightning_xpu.series import find_series_dir, load_series
    from lightning_xpu.upstream import is_upstream_series, load_upstream_base

    directory = find_series_dir(args.series)
    if is_upstream_series(directory):
        return load_series(directory), load_upstream_base(directory)
    if getattr(args, "upstream", None) is not None:
        raise ToolError(f"--upstream is for a series made against an upstream commit; {directory}/base.toml pins "
                        "the released sdists")
    return load_series(directory), load_base(directory)


def _release_only(base: object, what: str) -> None:
    from lightning_xpu.upstream import UpstreamBase

    if isinstance(base, UpstreamBase):
        raise ToolError(f"{what} needs the release series (patches/): this one is made against {base.ref} "
                        f"{base.short} of upstream's git history, for review there")


def cmd_workspace(args: argparse.Namespace) -> int:
    from lightning_xpu.upstream import UpstreamBase, resolve_checkout
    from lightning_xpu.workspace import create_upstream_workspace, create_workspace

    series, base = _series(args)
    if isinstance(base, UpstreamBase):
        checkout = resolve_checkout(args.upstream, base)
        repo = create_upstream_workspace(series, base, checkout, args.dir)
        print(f"Created workspace {repo}: upstream {base.ref} {base.short} base commit (tag lightning-xpu/base) "
              f"and {series.version} patch commits.")
        return 0
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
    from lightning_xpu.upstream import is_upstream_series, load_upstream_base

    base = load_upstream_base(series_dir) if is_upstream_series(series_dir) else load_base(series_dir)
    names = export_workspace(args.dir, series_dir, base)
    print(f"Exported {len(names)} patches and the series file to {series_dir}.")
    return 0


def cmd_port(args: argparse.Namespace) -> int:
    from lightning_xpu.base import LIGHTNING, unpacked_sdist
    from lightning_xpu.port import port

    series, base = _series(args)
    _release_only(base, "port")
    carry = None
    if args.carry is not None:
        from lightning_xpu.series import find_series_dir, load_series

        carry = load_series(find_series_dir(args.carry))
    result = port(series, args.dir, unpacked_sdist(base.sdist(LIGHTNING), base.version), carry)
    for name, how in result.applied:
        print(f"ported  {name}  ({how})")
    for name, files in result.carried:
        print(f"carried into {name}: the earlier master variant's edits of {', '.join(files)}")
    for name in result.already_present:
        print(f"skipped {name}  (its change is already in the workspace; no commit)")
    if result.check:
        print("check: a release patch and its earlier master version add different lines to these files; the "
              "release version is what was applied, so redo any master-only change in them by hand:")
        for name, files in result.check:
            print(f"  {name}: {', '.join(files)}")
    if result.not_carried:
        print("warning: no release patch has the subject of these patches of --carry, so their edits were not "
              "carried over: " + ", ".join(result.not_carried))
    if result.out_of_order:
        print("warning: these patches come before others already in the workspace but were appended at its end: "
              + ", ".join(result.out_of_order) + "; reorder with `git rebase -i lightning-xpu/base`")
    if result.master_only:
        print("note: commits in the workspace whose subject no release patch has: " + "; ".join(result.master_only))
    if result.conflict:
        raise ToolError(f"{result.conflict} conflicts in {', '.join(result.conflicted_files) or 'the workspace'}; "
                        f"resolve it in {Path(args.dir).resolve()}, `git add` the files, `git am --continue`, then "
                        "run this command again for the remaining patches")
    print(f"Ported {len(result.applied)} patches; export with "
          f"`lightning-xpu export {args.dir} --series patches/master`.")
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    series, base = _series(args)
    if args.installed:
        _release_only(base, "--installed")
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
    from lightning_xpu.apply import PatchFailed, apply, master_variant_hint
    from lightning_xpu.upstream import UpstreamBase, is_upstream_series

    if args.target is None:
        if not args.check:
            raise ToolError("give a TARGET directory, --installed, or --check to check against the pinned base")
        if isinstance(base, UpstreamBase):
            return _check_upstream(series, base, args.upstream)
        from lightning_xpu.base import LIGHTNING, unpacked_sdist

        target = unpacked_sdist(base.sdist(LIGHTNING), base.version)
        result = apply(series, target, check=True)
        print(f"All {len(result.applied)} patches apply to the pinned base lightning {base.version}.")
        return 0
    series = _pick_master_variant(series, base, args)
    try:
        result = apply(series, args.target, check=args.check)
    except PatchFailed as err:
        if is_upstream_series(series.directory):
            raise
        raise PatchFailed(f"{err}; {master_variant_hint(series.directory)}") from None
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


def _pick_master_variant(series, base: object, args: argparse.Namespace):  # noqa: ANN001, ANN202
    """The default release series hands an upstream checkout that has the master variant's base to that variant."""
    from lightning_xpu.apply import master_variant_for
    from lightning_xpu.series import load_series
    from lightning_xpu.upstream import UpstreamBase, load_upstream_base

    if args.series is not None or isinstance(base, UpstreamBase):
        return series
    master = master_variant_for(series.directory, args.target)
    if master is None:
        return series
    upstream = load_upstream_base(master)
    print(f"{args.target} has upstream {upstream.ref} at {upstream.short} in its history: applying the master "
          f"variant {master}.")
    return load_series(master)


def _check_upstream(series, base, checkout: Path | None) -> int:  # noqa: ANN001
    """``apply --check`` for a series made against an upstream commit: apply it to that commit's files."""
    import tempfile

    from lightning_xpu.apply import apply
    from lightning_xpu.upstream import export_tree, resolve_checkout

    checkout = resolve_checkout(checkout, base)
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-check-") as tmp:
        export_tree(checkout, base, Path(tmp))
        result = apply(series, Path(tmp), check=True)
    print(f"All {len(result.applied)} patches apply to upstream {base.ref} {base.short}.")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from lightning_xpu.wheels import build, install

    series, base = _series(args)
    _release_only(base, "build")
    wheels = build(series, base, args.dist, reuse=not args.rebuild)
    for wheel in wheels:
        print(wheel)
    if args.install:
        install(wheels)
        print(f"Installed lightning, pytorch-lightning and lightning-fabric {base.version}+{series.local_version}.")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from lightning_xpu.doctor import collect, format_report
    from lightning_xpu.verdict import diagnose

    data = collect()
    verdict = diagnose(data)
    if args.json:
        print(json.dumps({**data, "verdict": verdict.as_dict()}, indent=2))
    else:
        print(format_report(data) + "\n\n" + verdict.line())
    return verdict.exit_status


class _VersionAction(argparse.Action):
    """``--version``: this tool's version and the series it builds, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version of lightning-xpu and of the series it ships, then exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from lightning_xpu import __version__

        text = f"lightning-xpu {__version__}"
        try:
            from lightning_xpu.base import load_base
            from lightning_xpu.series import find_series_dir, load_series

            directory = find_series_dir()
            series, version = load_series(directory), load_base(directory).version
            text += f" (series of {series.version} patches: lightning {version}+{series.local_version})"
        except ToolError as err:
            text += f" (no series: {err})"
        print(text)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-xpu",
        description="Intel GPU (xpu) support for PyTorch Lightning as a patch series against lightning 2.6.6.",
        epilog="Downloads are cached in $LIGHTNING_XPU_CACHE (default ~/.cache/lightning-xpu).",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    series_help = "directory holding `series`, the patches and base.toml (default: the checkout's patches/)"

    p = sub.add_parser("workspace", help="create a git repo: the base as one commit, each patch a commit",
                       description="Create DIR as a git repository holding the pinned base as one commit (tagged "
                                   "lightning-xpu/base) and every patch of the series as its own commit. The base is "
                                   "the lightning sdist, or, for a series whose base.toml names an upstream commit "
                                   "(patches/master), that commit of an upstream checkout (--upstream).")
    p.add_argument("dir", type=Path, metavar="DIR", help="new or empty directory")
    p.add_argument("--series", type=Path, metavar="DIR", help=series_help)
    p.add_argument("--upstream", type=Path, metavar="CHECKOUT",
                   help="for a series made against an upstream commit (base.toml [upstream]): a git clone of "
                        "upstream that has it (default: $LIGHTNING_UPSTREAM_CHECKOUT)")
    p.set_defaults(func=cmd_workspace)

    p = sub.add_parser("export", help="regenerate patches/ and series from a workspace's commits",
                       description="Write one NNNN-subject.patch per commit after lightning-xpu/base in the "
                                   "workspace DIR, and the series file, into the series directory. Deterministic.")
    p.add_argument("dir", type=Path, metavar="DIR", help="a workspace made by `lightning-xpu workspace`")
    p.add_argument("--series", type=Path, metavar="DIR", help=series_help + "; the export writes here")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("port", help="replay release patches a master-variant workspace lacks onto it (git am -3)",
                       description="Apply to DIR, a workspace of the master variant (`lightning-xpu workspace "
                                   "--series patches/master --upstream CHECKOUT DIR`), every patch of the release "
                                   "series whose subject no commit in DIR has, in order, with git am -3, the "
                                   "CHANGELOG merge driver and git rerere. Stops at a real conflict with the git am "
                                   "session open; resolve, `git am --continue` and run it again.")
    p.add_argument("dir", type=Path, metavar="DIR", help="a workspace of the master variant")
    p.add_argument("--series", type=Path, metavar="DIR", help=series_help + "; the release series to port")
    p.add_argument("--carry", type=Path, metavar="DIR",
                   help="an earlier master variant (patches/master): after each release patch, also apply the edits "
                        "its same-subject patch there makes to files the release patch does not touch")
    p.set_defaults(func=cmd_port)

    p = sub.add_parser("apply", help="apply the series to a checkout, a source tree or the installed Lightning",
                       description="Apply the series atomically: to an upstream git checkout (git am -3), a plain "
                                   "source tree such as an unpacked sdist (git apply), or with --installed to the "
                                   "Lightning installed in this environment (with a backup; --revert restores it). "
                                   "On failure the target is unchanged and the patch, file and hunk are named. Without "
                                   "--series, a checkout whose history has the master variant's base commit "
                                   "(patches/master/base.toml) gets the master variant.")
    p.add_argument("target", type=Path, nargs="?", metavar="TARGET", help="git checkout or source tree")
    p.add_argument("--check", action="store_true",
                   help="dry run; without TARGET, check the series against the pinned base")
    p.add_argument("--installed", action="store_true", help="patch the installed lightning in place")
    p.add_argument("--revert", action="store_true", help="with --installed: restore the original files")
    p.add_argument("--series", type=Path, metavar="DIR", help=series_help)
    p.add_argument("--upstream", type=Path, metavar="CHECKOUT",
                   help="for a series made against an upstream commit (base.toml [upstream]): a git clone of "
                        "upstream that has it (default: $LIGHTNING_UPSTREAM_CHECKOUT)")
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("build", help="build the patched lightning, pytorch-lightning and lightning-fabric wheels",
                       description="Build the three drop-in wheels at version BASE+xpu.N (N = number of patches) "
                                   "into dist/, using upstream's mirroring for the standalone packages.")
    p.add_argument("--install", action="store_true",
                   help="install the wheels into this environment (keeps the installed torch)")
    p.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR", help="output directory (default: dist)")
    p.add_argument("--rebuild", action="store_true",
                   help="build even where $LIGHTNING_XPU_CACHE/wheels holds wheels of the same series, base and shim")
    p.add_argument("--series", type=Path, metavar="DIR", help=series_help)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("doctor", help="report torch, XPU devices, xccl/ccl and the installed Lightning, then a verdict",
                       description="Print torch version and build, torch.xpu availability, devices and memory, "
                                   "the GPU render nodes, xccl/ccl availability, which Lightning is installed and "
                                   "whether it is patched, and the Level Zero / oneAPI environment variables. The last "
                                   "line is the verdict: usable, emulated, or not usable with the reason and the next "
                                   "step. Exit status: 0 usable, 1 not usable, 3 emulated (LIGHTNING_XPU_EMULATOR).")
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
