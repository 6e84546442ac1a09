"""The bisect check names the first patch of a series that does not apply or breaks a test of its prefix."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci.series_factory import FAKE_BASE, commit, init_repo, make_series, write

BISECT = Path(__file__).resolve().parents[2] / "ci" / "bisect_series.py"

ADD_MUL = {
    "src/lightning/fabric/calc.py": '"""Arithmetic."""\n\n\ndef add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n'
    "    return a * b\n",
    "tests/tests_fabric/test_calc.py": "from lightning.fabric.calc import add, mul\n\n\ndef test_add():\n"
    "    assert add(2, 3) == 5\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n",
}
BREAK_ADD = {
    "src/lightning/fabric/calc.py": '"""Arithmetic."""\n\n\ndef add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n'
    "    return a * b\n",
}
ADD_README = {"src/lightning/fabric/NOTES.md": "notes\n"}
ADD_DOCS = {"docs/source-fabric/calc.rst": "Calc\n====\n"}
ADD_NEG = {
    "src/lightning/fabric/neg.py": "def neg(a):\n    return -a\n",
    "tests/tests_fabric/test_neg.py": "from lightning.fabric.neg import neg\n\n\n"
    "def test_neg():\n    assert neg(2) == -2\n",
}


def _series(tmp_path: Path, commits: list[tuple[str, dict]]) -> tuple[Path, Path]:
    """A base tree and a series made of ``commits`` on top of it."""
    repo = tmp_path / "ws"
    init_repo(repo, FAKE_BASE)
    for subject, files in commits:
        commit(repo, subject, files)
    base = tmp_path / "base"
    write(base, FAKE_BASE)
    return base, make_series(repo, "HEAD~" + str(len(commits)), tmp_path / "patches")


def _bisect(base: Path, series: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BISECT), "--series", str(series), "--base-tree", str(base), *args],
                          capture_output=True, text=True, timeout=300)


def test_names_the_middle_patch_that_breaks_an_earlier_test(tmp_path):
    base, series = _series(tmp_path, [
        ("fabric: add mul", ADD_MUL), ("fabric: rewrite add", BREAK_ADD), ("fabric: add neg", ADD_NEG),
    ])
    proc = _bisect(base, series)  # default: two xdist workers, as in CI
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FIRST BROKEN PATCH: 2/3 0002-fabric-rewrite-add.patch (fabric: rewrite add)" in proc.stdout
    assert "breaks at the tests stage" in proc.stdout
    assert "FAILED tests_fabric.test_calc::test_add" in proc.stdout
    assert "[1/3] ok" in proc.stdout and "1 failed, 1 passed" not in proc.stdout.split("[2/3]")[0]
    assert "[3/3]" not in proc.stdout  # stops at the first break


@pytest.mark.parametrize("keep_going", [False, True])
def test_prefixes_tested_in_parallel_report_as_in_series_order(tmp_path, keep_going):
    base, series = _series(tmp_path, [
        ("fabric: add mul", ADD_MUL), ("fabric: rewrite add", BREAK_ADD), ("fabric: add neg", ADD_NEG),
    ])
    proc = _bisect(base, series, "--workers", "0", "--jobs", "2", *(["--keep-going"] if keep_going else []))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FIRST BROKEN PATCH: 2/3 0002-fabric-rewrite-add.patch (fabric: rewrite add)" in proc.stdout
    assert "FAILED tests_fabric.test_calc::test_add" in proc.stdout
    assert proc.stdout.index("[1/3] ok") < proc.stdout.index("[2/3] BROKEN (tests)")
    assert ("[3/3] BROKEN (tests)" in proc.stdout) is keep_going  # the third prefix holds the second's break


def test_names_the_patch_that_does_not_apply_when_prefixes_run_in_parallel(tmp_path):
    base, series = _series(tmp_path, [("fabric: add mul", ADD_MUL), ("fabric: rewrite add", BREAK_ADD)])
    second = series / "0002-fabric-rewrite-add.patch"
    second.write_text(second.read_text().replace(" def mul(a, b):", " def multiply(a, b):"))  # context drifts
    proc = _bisect(base, series, "--workers", "0", "--jobs", "2")
    assert proc.returncode == 1
    assert "[1/2] ok" in proc.stdout and "[2/2] BROKEN (apply)" in proc.stdout


def test_keep_going_checks_every_prefix(tmp_path):
    base, series = _series(tmp_path, [
        ("fabric: add mul", ADD_MUL), ("fabric: rewrite add", BREAK_ADD), ("fabric: add neg", ADD_NEG),
    ])
    proc = _bisect(base, series, "--workers", "0", "--keep-going")
    assert proc.returncode == 1
    assert "FIRST BROKEN PATCH: 2/3" in proc.stdout
    assert "[3/3] BROKEN (tests)" in proc.stdout  # the break persists into the later prefix


def test_a_good_series_passes_and_prefixes_without_tests_get_an_import_check(tmp_path):
    base, series = _series(tmp_path, [("fabric: add notes", ADD_README), ("fabric: add mul", ADD_MUL),
                                      ("fabric: add neg", ADD_NEG)])
    proc = _bisect(base, series, "--workers", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[1/3] ok" in proc.stdout and "import smoke test" in proc.stdout
    assert "[3/3] ok" in proc.stdout and "3 passed" in proc.stdout
    assert "all 3 prefixes apply and pass their tests" in proc.stdout


def test_a_documentation_patch_is_applied_but_not_tested_again(tmp_path):
    base, series = _series(tmp_path, [("fabric: add mul", ADD_MUL), ("docs: add the calc page", ADD_DOCS)])
    proc = _bisect(base, series, "--workers", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = proc.stdout.split("[2/2]")
    assert "2 passed" in first
    assert "ok" in second and "no test can tell this prefix from the one before" in second


def test_a_documentation_patch_after_a_break_keeps_the_break(tmp_path):
    base, series = _series(tmp_path, [("fabric: add mul", ADD_MUL), ("fabric: rewrite add", BREAK_ADD),
                                      ("docs: add the calc page", ADD_DOCS)])
    proc = _bisect(base, series, "--workers", "0", "--keep-going")
    assert proc.returncode == 1
    assert "FIRST BROKEN PATCH: 2/3 0002-fabric-rewrite-add.patch" in proc.stdout
    assert "[3/3] BROKEN (tests)" in proc.stdout  # not reported as passing: its tree still has the second's break


def test_names_the_patch_that_does_not_apply(tmp_path):
    base, series = _series(tmp_path, [("fabric: add mul", ADD_MUL), ("fabric: rewrite add", BREAK_ADD)])
    second = series / "0002-fabric-rewrite-add.patch"
    second.write_text(second.read_text().replace(" def mul(a, b):", " def multiply(a, b):"))  # context drifts
    proc = _bisect(base, series, "--workers", "0")
    assert proc.returncode == 1
    assert "[2/2] BROKEN (apply)" in proc.stdout
    assert "FIRST BROKEN PATCH: 2/2 0002-fabric-rewrite-add.patch" in proc.stdout
    assert "src/lightning/fabric/calc.py" in proc.stdout


@pytest.mark.parametrize("source", ["def broken(:\n", "import lightning.fabric.missing_module\n"])
def test_names_a_patch_without_tests_that_breaks_the_package(tmp_path, source):
    """A syntax error is caught by the byte-compile step, an import error by the import smoke test."""
    base, series = _series(tmp_path, [("fabric: add notes", ADD_README),
                                       ("fabric: add helper", {"src/lightning/fabric/__init__.py": source})])
    proc = _bisect(base, series, "--workers", "0")
    assert proc.returncode == 1
    stage = "compile" if "def broken" in source else "import"
    assert f"[2/2] BROKEN ({stage})" in proc.stdout
    assert "FIRST BROKEN PATCH: 2/2 0002-fabric-add-helper.patch" in proc.stdout


ADD_MUL_TESTS = {
    "tests/tests_fabric/test_calc_more.py": "from lightning.fabric.calc import mul\n\n\ndef test_mul_by_zero():\n"
    "    assert mul(2, 0) == 0\n",
    "src/lightning/fabric/CHANGELOG.md": "- tests for mul\n",
}


def test_a_patch_of_test_modules_runs_only_them(tmp_path):
    base, series = _series(tmp_path, [("fabric: add mul", ADD_MUL), ("fabric: test mul by zero", ADD_MUL_TESTS)])
    proc = _bisect(base, series, "--workers", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = proc.stdout.split("[2/2]")[1]
    assert "1 passed in its own test modules; the rest as the prefix before" in second


def test_a_patch_of_test_modules_after_a_break_keeps_the_break(tmp_path):
    base, series = _series(tmp_path, [("fabric: add mul", ADD_MUL), ("fabric: rewrite add", BREAK_ADD),
                                      ("fabric: test mul by zero", ADD_MUL_TESTS)])
    proc = _bisect(base, series, "--workers", "0", "--keep-going")
    assert proc.returncode == 1
    assert "FIRST BROKEN PATCH: 2/3 0002-fabric-rewrite-add.patch" in proc.stdout
    assert "[3/3] BROKEN (tests)" in proc.stdout  # its own test passes, but test_add still fails in its tree
