"""Bisect check: every prefix of ``patches/series`` applies to the pinned base and passes the tests it carries.

A patch series is reviewable upstream only if each prefix of it works. This check copies the base once, applies the
patches to that copy one at a time (so prefix k is prefix k-1 plus patch k, which is exactly "apply the first k
patches to the base") and after each patch:

1. byte-compiles the Python files the patch touched;
2. runs the series' tests present in the prefix tree (the mocked tier, with ``tests/series/run.py --src`` so the tree
   is imported directly and no wheel is built per prefix); a prefix without tests gets an import smoke test instead,
   and a patch that changes nothing under ``src/`` or ``tests/`` (documentation pages) is applied but not tested again.
   A patch that changes only test modules (and CHANGELOGs) runs those modules: the source and every other test file
   are the previous prefix's, which passed them.

It stops at the first patch that does not apply or breaks a test and names it (``--keep-going`` checks every prefix).
``--jobs N`` tests N prefixes at a time, each in a copy of its own tree (the patches still apply one after another).

    python ci/bisect_series.py [--series patches] [--base-tree DIR] [--workers 2] [--jobs 1] [-- PYTEST_ARGS...]

Exit status: 0 when every prefix passes, 1 when a patch breaks, 2 on bad input.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tooling checks this checkout's series

from ci.junit import Case, read_cases, summary  # noqa: E402
from lightning_xpu.apply import PatchFailed, apply_to_tree  # noqa: E402
from lightning_xpu.base import LIGHTNING, load_base, unpacked_sdist  # noqa: E402
from lightning_xpu.errors import ToolError  # noqa: E402
from lightning_xpu.series import Patch, Series, find_series_dir, load_series  # noqa: E402
from lightning_xpu.upstream import (  # noqa: E402
    CHECKOUT_VAR,
    export_tree,
    is_upstream_series,
    load_upstream_base,
    resolve_checkout,
)

RUNNER = REPO / "tests" / "series" / "run.py"
SUITES = ("tests_fabric", "tests_pytorch")
TEST_TIMEOUT = 300  # seconds per test: a hung test fails its prefix instead of stalling CI


@dataclass
class PrefixResult:
    """What happened at one prefix: ``ok`` or the stage that broke (``apply``, ``compile``, ``tests``, ``import``)."""

    index: int
    patch: Patch
    status: str = "ok"
    detail: str = ""
    tests: str = ""
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)
    retested: bool = True  # False: the patch changes nothing the tests see, so the prefix stands as the one before
    own_tests_only: bool = False  # True: only the patch's test modules ran; the rest stands as the prefix before

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def compile_touched(tree: Path, patch: Patch) -> str:
    """Byte-compile the Python files ``patch`` leaves in ``tree``; return the first error, or ``""``."""
    for rel in patch.files:
        path = tree / rel
        if path.suffix == ".py" and path.is_file():
            try:
                compile(path.read_bytes(), str(rel), "exec", dont_inherit=True)
            except SyntaxError as err:
                return f"{rel}:{err.lineno}: {err.msg}"
    return ""


def series_test_files(tree: Path) -> list[str]:
    """The series' test files present in ``tree``, relative to ``tree/tests``."""
    files = []
    for suite in SUITES:
        files += sorted(str(p.relative_to(tree / "tests")) for p in (tree / "tests" / suite).rglob("test_*.py"))
    return files


def own_test_modules(tree: Path, patch: Patch) -> list[str]:
    """The test modules ``patch`` leaves in ``tree`` (relative to ``tree/tests``) when it changes nothing else the
    tests see (source, conftests, helpers; CHANGELOGs aside), else ``[]``."""
    seen = [f for f in patch.files if f.startswith(_SEEN_BY_TESTS) and Path(f).name != "CHANGELOG.md"]
    if not seen or not all(f.startswith("tests/") and Path(f).name.startswith("test_") and f.endswith(".py")
                           for f in seen):
        return []
    return sorted(f[len("tests/"):] for f in seen if (tree / f).is_file())


def run_tests(tree: Path, workers: int, pytest_args: list[str], junit: Path,
              files: Sequence[str] = ()) -> tuple[int, list[Case], str]:
    """Run the mocked tier of the series' tests in ``tree`` (only ``files``, relative to ``tree/tests``, where given);
    return pytest's exit code, the cases and its output."""
    args = ["-q", "-p", "no:randomly", f"--junitxml={junit}", *(["-n", str(workers)] if workers else []),
            *(["--timeout", str(TEST_TIMEOUT)] if importlib.util.find_spec("pytest_timeout") else []), *pytest_args,
            *files]
    env = {k: v for k, v in os.environ.items() if k not in _TIER_VARIABLES}
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--tree", str(tree), "--src", "--", *args],
        env=env, capture_output=True, text=True,
    )
    return proc.returncode, read_cases(junit), proc.stdout + proc.stderr


# the mocked tier: no emulated device, no tier filter left over from the caller's environment
_TIER_VARIABLES = ("LIGHTNING_XPU_EMULATOR", "RUN_ONLY_XPU_TESTS", "RUN_ONLY_CUDA_TESTS", "PL_RUN_STANDALONE_TESTS")


def import_smoke(tree: Path) -> str:
    """Import both packages from ``tree/src``; return the error, or ``""``."""
    env = {k: v for k, v in os.environ.items() if k not in _TIER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", "import lightning.fabric, lightning.pytorch"],
        env=env, capture_output=True, text=True, cwd=tree,
    )
    return "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["import failed"])[-1]


def touched_test_files(tree: Path, series: Series, index: int) -> list[str]:
    """The test files the first ``index`` patches touch that exist in ``tree``, relative to ``tree/tests``."""
    files = {f for p in series.patches[:index] for f in p.files}
    return sorted(f[len("tests/"):] for f in files if f.startswith("tests/") and Path(f).name.startswith("test_")
                  and f.endswith(".py") and (tree / f).is_file())


def run_upstream_tests(tree: Path, files: list[str], workers: int, pytest_args: list[str],
                       junit: Path) -> tuple[int, list[Case], str]:
    """Run test files of an upstream tree in upstream's own test environment (its conftests), importing ``src/``."""
    args = ["-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *(["-n", str(workers)] if workers else []),
            *(["--timeout", str(TEST_TIMEOUT)] if importlib.util.find_spec("pytest_timeout") else []), *pytest_args]
    env = {k: v for k, v in os.environ.items() if k not in _TIER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", *args, *files], cwd=tree / "tests", env=env,
                          capture_output=True, text=True)
    return proc.returncode, read_cases(junit), proc.stdout + proc.stderr


def check_prefix(index: int, patch: Patch, series: Series, tree: Path, workers: int, pytest_args: list[str],
                 scratch: Path, upstream: bool = False) -> PrefixResult:
    """Apply ``patch`` onto ``tree`` (which holds the previous prefix) and check the new prefix.

    ``upstream``: the tree is an upstream commit with its own tests and conftests; the test files the prefix touches
    run there, in upstream's environment, instead of the series' tests under this repository's harness.
    """
    result = PrefixResult(index, patch)
    start = time.monotonic()
    try:
        apply_to_tree(Series(series.directory, (patch,)), tree)
    except PatchFailed as err:
        result.status, result.detail = "apply", str(err)
        return result
    if not any(f.startswith(_SEEN_BY_TESTS) for f in patch.files):
        result.tests = "changes nothing under src/ or tests/: no test can tell this prefix from the one before"
        result.retested = False
        result.seconds = time.monotonic() - start
        return result
    own = [] if upstream else own_test_modules(tree, patch)
    files = touched_test_files(tree, series, index) if upstream else own or series_test_files(tree)
    result.own_tests_only = bool(own)
    if error := compile_touched(tree, patch):
        result.status, result.detail = "compile", error
    elif files:
        junit = scratch / f"prefix-{index:03d}.xml"
        if upstream:
            code, cases, output = run_upstream_tests(tree, files, workers, pytest_args, junit)
        else:
            code, cases, output = run_tests(tree, workers, pytest_args, junit, own)
        result.tests = summary(cases) + (" in its own test modules; the rest as the prefix before" if own else "")
        broken = [c for c in cases if c.outcome in ("failed", "error")]
        result.failed = [f"{c.id}: {c.message}" if c.message else c.id for c in broken]
        if code != 0:
            result.status = "tests"
            result.detail = f"pytest exited with {code}" if cases else _tail(output)
    else:
        result.tests = "no series tests yet; import smoke test"
        if error := import_smoke(tree):
            result.status, result.detail = "import", error
    result.seconds = time.monotonic() - start
    return result


# what the tests import or read; a patch outside these (the documentation pages) gets applied but not tested again
_SEEN_BY_TESTS = ("src/", "tests/")


def _tail(output: str, lines: int = 15) -> str:
    return "\n".join(output.strip().splitlines()[-lines:])


def base_tree(series_dir: Path) -> Path:
    """The unpacked pinned ``lightning`` sdist (downloaded and verified once, then cached)."""
    base = load_base(series_dir)
    return unpacked_sdist(base.sdist(LIGHTNING), base.version)


def report_line(result: PrefixResult, total: int) -> str:
    width = len(str(total))
    status = "ok" if result.ok else f"BROKEN ({result.status})"
    tests = f"  [{result.tests}]" if result.tests else ""
    return f"[{result.index:>{width}}/{total}] {status:<17} {result.patch.name}{tests}  {result.seconds:.1f}s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=Path, help="series directory (default: this checkout's patches/)")
    parser.add_argument("--base-tree", type=Path, help="an unpacked base tree to copy (default: the pinned sdist)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per prefix; 0 runs in-process")
    parser.add_argument("--jobs", type=int, default=1, help="prefixes tested at a time, each in its own tree copy")
    parser.add_argument("--keep-going", action="store_true",
                        help="check every prefix instead of stopping at the first break")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (put them after --)")
    ns = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="lightning-xpu-upstream-") as upstream_tree:
        try:
            series = load_series(find_series_dir(ns.series.resolve() if ns.series else None))
            upstream = is_upstream_series(series.directory)
            if ns.base_tree:
                source = ns.base_tree.resolve()
            elif not upstream:
                source = base_tree(series.directory)
            elif not os.environ.get(CHECKOUT_VAR):
                print(f"bisect: skipped: {series.directory} is made against an upstream commit, and checking its "
                      f"prefixes needs upstream's files and tests; set {CHECKOUT_VAR} to a clone of upstream that "
                      "has the commit (this CI cannot reach GitHub)")
                return 0
            else:
                base = load_upstream_base(series.directory)
                source = Path(upstream_tree)
                export_tree(resolve_checkout(None, base), base, source)
        except ToolError as err:
            print(f"bisect: {err}", file=sys.stderr)
            return 2
        return _bisect(series, source, ns, upstream)


def _check_in_parallel(series: Series, tree: Path, ns: argparse.Namespace, scratch: Path,
                       upstream: bool) -> Iterator[PrefixResult]:
    """Check ``ns.jobs`` prefixes at a time, yielding the results in series order.

    Each prefix is checked in a copy of the tree that holds the one before it; ``tree`` itself moves on by one patch
    per prefix. The checks not yet started are cancelled when the caller stops at a broken prefix.
    """

    def check_copy(index: int, patch: Patch, copy: Path) -> PrefixResult:
        try:
            return check_prefix(index, patch, series, copy, ns.workers, ns.pytest_args, scratch, upstream)
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    pool = ThreadPoolExecutor(ns.jobs)
    checks: list[Future[PrefixResult]] = []
    try:
        for index, patch in enumerate(series.patches, 1):
            copy = scratch / f"prefix-{index:03d}"
            shutil.copytree(tree, copy, symlinks=True)
            checks.append(pool.submit(check_copy, index, patch, copy))
            try:
                apply_to_tree(Series(series.directory, (patch,)), tree)
            except PatchFailed:
                break  # its check reports the failure; no later prefix exists
        for check in checks:
            yield check.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _bisect(series: Series, source: Path, ns: argparse.Namespace, upstream: bool) -> int:
    if not source.is_dir():
        print(f"bisect: base tree {source} is not a directory", file=sys.stderr)
        return 2
    total = len(series.patches)
    if not total:
        print(f"bisect: the series in {series.directory} is empty; nothing to check")
        return 0
    print(f"bisect: {total} patches from {series.directory} onto {source}")

    started = time.monotonic()
    results: list[PrefixResult] = []
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-bisect-") as tmp:
        tree, scratch = Path(tmp) / "tree", Path(tmp)
        shutil.copytree(source, tree, symlinks=True)
        if ns.jobs > 1:
            checks = _check_in_parallel(series, tree, ns, scratch, upstream)
        else:
            checks = (check_prefix(index, patch, series, tree, ns.workers, ns.pytest_args, scratch, upstream)
                      for index, patch in enumerate(series.patches, 1))
        for result in checks:
            # --keep-going: the earlier break persists where the prefix did not run the tests that broke
            if (not result.retested or (result.own_tests_only and result.ok)) and results and not results[-1].ok:
                result.status, result.detail = results[-1].status, f"as prefix {results[-1].index}"
            results.append(result)
            print(report_line(result, total), flush=True)
            if not result.ok and (result.status == "apply" or not ns.keep_going):
                break  # a patch that does not apply leaves no tree for the later prefixes
        checks.close()  # cancels the parallel checks not yet started and waits for the running ones

    broken = [r for r in results if not r.ok]
    elapsed = time.monotonic() - started
    if not broken:
        print(f"bisect: all {total} prefixes apply and pass their tests ({elapsed:.0f}s)")
        return 0
    first = broken[0]
    print(f"\nbisect: FIRST BROKEN PATCH: {first.index}/{total} {first.patch.name} ({first.patch.subject})")
    print(f"bisect: it breaks at the {first.status} stage: {first.detail}")
    for test in first.failed[:20]:
        print(f"  FAILED {test}")
    if len(first.failed) > 20:
        print(f"  ... and {len(first.failed) - 20} more")
    print(f"bisect: {len(results)} of {total} prefixes checked in {elapsed:.0f}s")
    return 1


if __name__ == "__main__":
    sys.exit(main())
