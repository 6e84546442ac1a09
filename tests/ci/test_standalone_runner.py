"""tests/series/run.py --standalone: one process per test, outcomes counted from each test's own result."""

import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[1] / "series" / "run.py"

_TESTS = '''import pytest

standalone = pytest.mark.skipif(False, reason="Standalone execution", standalone=True)


@standalone
def test_passes():
    pass


@pytest.mark.skipif(True, reason="needs what this machine lacks", standalone=True)
def test_skips():
    pass


@standalone
def test_fails():
    assert 1 == 2


def test_not_standalone():
    pass
'''


def test_the_runner_counts_passed_skipped_and_failed_tests_apart(tmp_path):
    suite = tmp_path / "tree" / "tests" / "tests_fabric"
    suite.mkdir(parents=True)
    (suite / "test_outcomes.py").write_text(_TESTS)
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--tree", str(tmp_path / "tree"), "--standalone", "--parallel", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "standalone: 1 passed, 1 skipped, 1 failed" in proc.stdout
    assert "SKIPPED tests_fabric/test_outcomes.py::test_skips" in proc.stdout
    assert "FAILED tests_fabric/test_outcomes.py::test_fails" in proc.stdout
    assert "test_not_standalone" not in proc.stdout
