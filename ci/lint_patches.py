"""Lint the code inside the patch series with upstream Lightning's ruff rules.

Applies the series to a copy of the pinned base, then runs ``ruff check`` and ``ruff format --check`` (rules from
``ci/ruff-upstream.toml``) on every Python file the series adds or changes. Findings that the unpatched base file
already has are upstream's, not the series', and are left out; what remains is reported per file.

    python ci/lint_patches.py [--series patches] [--base-tree DIR]

For a series made against an upstream commit (``--series patches/master``) the base is that commit of the checkout in
``$LIGHTNING_UPSTREAM_CHECKOUT``; without one, only the files the series creates are linted, and the report says what
was left out.

Exit status: 0 when the series adds no finding, 1 when it does, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ci.bisect_series import base_tree  # noqa: E402
from lightning_xpu._git import run_git  # noqa: E402
from lightning_xpu.apply import PatchFailed, apply_to_tree  # noqa: E402
from lightning_xpu.errors import ToolError  # noqa: E402
from lightning_xpu.series import Series, find_series_dir, load_series  # noqa: E402
from lightning_xpu.upstream import (  # noqa: E402
    CHECKOUT_VAR,
    export_tree,
    is_upstream_series,
    load_upstream_base,
    resolve_checkout,
)

CONFIG = Path(__file__).resolve().parent / "ruff-upstream.toml"


def ruff(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    return subprocess.run([exe, *args], cwd=tree, capture_output=True, text=True)


def check_findings(tree: Path, files: list[str]) -> list[dict]:
    """``ruff check`` findings (JSON records) for ``files`` in ``tree``."""
    if not files:
        return []
    proc = ruff(tree, "check", "--no-cache", "--output-format", "json", *files)
    if proc.returncode not in (0, 1):
        raise ToolError(f"ruff check failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout or "[]")


def unformatted(tree: Path, files: list[str]) -> set[str]:
    """The files ``ruff format`` would change (compared by content: its ``--check`` output differs by version)."""
    changed = set()
    for rel in files:
        source = (tree / rel).read_text()
        exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
        proc = subprocess.run([exe, "format", "--no-cache", "--stdin-filename", rel, "-"], cwd=tree, input=source,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolError(f"ruff format failed on {rel}: {proc.stderr.strip()}")
        if proc.stdout != source:
            changed.add(rel)
    return changed


def _key(finding: dict, tree: Path) -> tuple[str, str, str]:
    return str(Path(finding["filename"]).relative_to(tree)), finding["code"] or "", finding["message"]


def _print_findings(new: list[dict], reformat: set[str], tree: Path) -> None:
    for finding in new:
        rel = Path(finding["filename"]).relative_to(tree)
        row = finding["location"]["row"]
        print(f"{rel}:{row}:{finding['location']['column']}: {finding['code']} {finding['message']}")
    for rel in sorted(reformat):
        print(f"{rel}: not formatted as upstream's `ruff format` would; "
              "run `ruff format --config ci/ruff-upstream.toml` on it in the workspace")


def lint(series_dir: Path | None, source: Path) -> int:
    series = load_series(find_series_dir(series_dir))
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-lint-") as tmp:
        base, patched = Path(tmp) / "base", Path(tmp) / "patched"
        shutil.copytree(source, patched, symlinks=True)
        apply_to_tree(series, patched)
        files = [f for f in series.files if f.endswith(".py") and (patched / f).is_file()]
        existing = [f for f in files if (source / f).is_file()]
        base.mkdir()
        for rel in existing:
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, base / rel)
        for tree in (base, patched):
            shutil.copy2(CONFIG, tree / "ruff.toml")

        # a finding the base file already has (same file, rule and message) is upstream's
        baseline = Counter(_key(f, base) for f in check_findings(base, existing))
        new = []
        for finding in check_findings(patched, files):
            key = _key(finding, patched)
            if baseline[key]:
                baseline[key] -= 1
            else:
                new.append(finding)
        reformat = unformatted(patched, files) - unformatted(base, existing)

        _print_findings(new, reformat, patched)
    print(f"lint: {len(files)} Python files touched by {len(series.patches)} patches; "
          f"{len(new)} ruff finding(s), {len(reformat)} file(s) to reformat (upstream's rules, ruff "
          f"{ruff(Path.cwd(), '--version').stdout.split()[-1]})")
    return 1 if new or reformat else 0


def created_files(series: Series) -> list[str]:
    """The files the series creates (their first change in the series is a ``new file``)."""
    seen: dict[str, bool] = {}
    for patch in series.patches:
        text = patch.path.read_text(encoding="utf-8")
        for section in text.split("\ndiff --git a/")[1:]:
            path = section.split(" b/", 1)[1].split("\n", 1)[0]
            if path not in seen:
                seen[path] = "\nnew file mode " in section.split("\n@@", 1)[0]
    return [path for path, new in seen.items() if new]


def created_tree(series: Series, tree: Path) -> list[str]:
    """Write into ``tree`` the files the series creates, as the series leaves them; return their paths."""
    created = created_files(series)
    (tree / "src" / "lightning").mkdir(parents=True)
    for patch in series.patches:
        touched = [f"--include={path}" for path in created if path in patch.files]
        if touched:
            run_git(["apply", "--whitespace=nowarn", *touched, str(patch.path)], tree,
                    env={"GIT_CEILING_DIRECTORIES": str(tree.parent)})
    return created


def lint_created_files(series_dir: Path) -> int:
    """Lint only what an upstream-based series creates: its changes to upstream's files need the checkout."""
    series = load_series(series_dir)
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-lint-") as tmp:
        tree = Path(tmp) / "tree"
        created = created_tree(series, tree)
        files = [f for f in created if f.endswith(".py")]
        shutil.copy2(CONFIG, tree / "ruff.toml")
        new = check_findings(tree, files)
        reformat = unformatted(tree, files)
        _print_findings(new, reformat, tree)
    skipped = [f for f in series.files if f.endswith(".py") and f not in created]
    print(f"lint: {len(files)} Python files the series creates; {len(new)} ruff finding(s), {len(reformat)} file(s) "
          f"to reformat. Not linted: its changes to {len(skipped)} existing upstream files, which need upstream's "
          f"files (set {CHECKOUT_VAR} to a clone of upstream with the base commit)")
    return 1 if new or reformat else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=Path, help="series directory (default: this checkout's patches/)")
    parser.add_argument("--base-tree", type=Path, help="an unpacked base tree (default: the pinned sdist, or for a "
                        f"series based on an upstream commit, that commit of ${CHECKOUT_VAR})")
    ns = parser.parse_args(argv)
    try:
        series_dir = ns.series.resolve() if ns.series else None
        if ns.base_tree:
            return lint(series_dir, ns.base_tree.resolve())
        directory = find_series_dir(series_dir)
        if not is_upstream_series(directory):
            return lint(series_dir, base_tree(directory))
        if not os.environ.get(CHECKOUT_VAR):
            return lint_created_files(directory)
        with tempfile.TemporaryDirectory(prefix="lightning-xpu-upstream-") as tmp:
            upstream = load_upstream_base(directory)
            export_tree(resolve_checkout(None, upstream), upstream, Path(tmp))
            return lint(series_dir, Path(tmp))
    except (ToolError, PatchFailed) as err:
        print(f"lint: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
