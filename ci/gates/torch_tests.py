"""Upstream's CPU tests on an old torch release (2.1.2, the oldest of upstream's matrix), patched against unpatched.

With an upstream checkout the tests are upstream's own test files that the series touches, run the way its CPU
workflows run them (``ci-tests-fabric.yml`` / ``ci-tests-pytorch.yml``: from ``tests/``, under upstream's conftests
and ``pyproject.toml`` options, ``--timeout``; Lightning imported from ``src/``), on the base and at each pull
request's end. Without one (the release series on the 2.6.6 sdists, which carry no tests) they are the series' own
test files at upstream's paths, run by ``tests/series/run.py`` with its stand-in for upstream's conftest; unpatched
there is nothing, so every case must pass, or skip with a reason.

A finding is a case that passed unpatched and does not pass patched (failed, errored, skipped or gone; a test the
series parametrised is judged by its non-XPU cases), a case that fails or errors patched and did not unpatched (new
tests included), and a module that no longer collects.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from ci.gates.venvs import TORCH_CPU_INDEX
from ci.junit import Case, read_cases
from ci.replay_upstream import _renamed
from lightning_xpu.errors import ToolError

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "tests" / "series" / "run.py"
TIMEOUT = 90  # seconds per test: upstream's ci-tests-pytorch.yml (ci-tests-fabric.yml: 60)
RUN_TIMEOUT = 3600  # seconds per pytest run
_TIER_VARIABLES = ("LIGHTNING_XPU_EMULATOR", "RUN_ONLY_XPU_TESTS", "RUN_ONLY_CUDA_TESTS", "PL_RUN_STANDALONE_TESTS")
# what upstream's tests of the touched files import besides Lightning and the series' test requirements
UPSTREAM_TEST_EXTRAS = ["pytest-rerunfailures", "cloudpickle", "scikit-learn", "pandas"]


def venv_steps(torch: str, upstream: bool) -> list[list[str]]:
    """The pip steps of a test environment on ``torch`` (the CPU build where PyTorch's CPU index is reachable, else
    PyPI's, with the libraries it requires)."""
    # numpy 1.x: upstream's requirements/*/test.txt pin `numpy <1.27` below Python 3.12, and torch before 2.3 was
    # built against numpy 1
    reqs = [*TORCH_CPU_INDEX, f"torch=={torch}", "numpy<2" if sys.version_info < (3, 12) else "numpy",
            "-r", str(REPO / "ci" / "requirements-tests.txt"), "-r", str(REPO / "ci" / "requirements-lightning.txt")]
    return [reqs + (UPSTREAM_TEST_EXTRAS if upstream else [])]


def _env(tree: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _TIER_VARIABLES}
    # CPU only, as upstream's CPU workflows: PyPI's CUDA build must not find a GPU where one exists
    env["CUDA_VISIBLE_DEVICES"] = ""
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree / "src"), env.get("PYTHONPATH")]))
    return env


def run_upstream_files(python: Path, tree: Path, files: list[str], junit: Path, workers: int) -> list[Case]:
    """Upstream's test ``files`` (relative to ``tree/tests``) in ``tree``, under upstream's own test environment."""
    if not files:
        return []
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "--color=no", f"--junitxml={junit}",
           "--continue-on-collection-errors", "--timeout", str(TIMEOUT), *(["-n", str(workers)] if workers else []),
           *files]
    return _run(cmd, tree / "tests", _env(tree), junit)


def run_series_tests(python: Path, tree: Path, junit: Path, workers: int) -> list[Case]:
    """The series' own test files in ``tree`` (the release series on the sdists), under ``tests/series/run.py``."""
    if not any((tree / "tests" / suite).is_dir() for suite in ("tests_fabric", "tests_pytorch")):
        return []
    cmd = [str(python), str(RUNNER), "--tree", str(tree), "--src", "--", "-q", "--color=no", "-p", "no:randomly",
           f"--junitxml={junit}", "--continue-on-collection-errors", "--timeout", str(TIMEOUT),
           *(["-n", str(workers)] if workers else [])]
    return _run(cmd, REPO, _env(None), junit)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], junit: Path) -> list[Case]:
    junit.unlink(missing_ok=True)
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ToolError(f"the tests ran longer than {RUN_TIMEOUT}s: {' '.join(cmd[-5:])}") from None
    cases = read_cases(junit)
    if not cases and proc.returncode not in (0, 5):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
        raise ToolError(f"pytest could not run the tests (exit {proc.returncode}):\n{tail}")
    return cases


def module_of(case: Case) -> str:
    """The dotted test module of a case, relative to ``tests/`` (``tests_fabric.x.test_y``)."""
    return case.id.split("::", 1)[0].removeprefix("tests.")


def in_files(cases: Iterable[Case], files: Iterable[str]) -> list[Case]:
    """The cases whose module is one of ``files`` (paths relative to ``tests/``)."""
    modules = tuple(f.removesuffix(".py").replace("/", ".") for f in files)
    return [c for c in cases if any(module_of(c) == m or module_of(c).startswith(m + ".") for m in modules)]


def findings(before: list[Case], after: list[Case]) -> list[str]:
    """What the patched run loses or breaks against the unpatched one (``before`` empty: every case must pass or
    skip with a reason)."""
    old = {c.id: c for c in before}
    new = {c.id: c for c in after}
    lines = []
    for test_id, case in old.items():
        if case.outcome != "passed":
            continue
        now = new.get(test_id) or _renamed(test_id, old, after) or Case(test_id, "missing")
        if now.outcome != "passed":
            renamed = f" (as {now.id.split('::', 1)[-1]})" if now.id != test_id else ""
            lines.append(f"passed unpatched, {now.outcome} patched{renamed}: {test_id}"
                         + (f": {now.message}" if now.message else ""))
    for case in after:
        was = old.get(case.id)
        if case.outcome in ("failed", "error") and (was is None or was.outcome not in ("failed", "error")):
            if was is not None and was.outcome == "passed":
                continue  # reported above
            kind = "collection error" if _is_collection(case) else f"new {case.outcome}"
            lines.append(f"{kind}: {case.id}" + (f": {case.message}" if case.message else ""))
        elif case.outcome == "skipped" and not case.message.strip() and was is None:
            lines.append(f"skipped without a reason: {case.id}")
    return lines


def _is_collection(case: Case) -> bool:
    """pytest's JUnit record of a module that failed to import: no class name, the module as the case's name."""
    return case.outcome == "error" and "::" not in case.id
