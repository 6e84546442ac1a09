"""JUnit XML from pytest is read into per-test outcomes with the error pytest reported."""

import subprocess
import sys

from ci.junit import read_cases, summary


def test_outcomes_and_messages_of_a_real_pytest_run(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n\ndef test_ok():\n    pass\n\n\ndef test_bad():\n    assert 1 + 1 == 3\n\n\n"
        "def test_fixture(xpu_count_1):\n    pass\n\n\n@pytest.mark.skip(reason='needs 2 XPUs')\ndef test_skip():\n"
        "    pass\n"
    )
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                    "test_sample.py"], cwd=tmp_path, capture_output=True)
    cases = {c.id.split("::")[1]: c for c in read_cases(junit)}
    assert (cases["test_ok"].outcome, cases["test_ok"].message) == ("passed", "")
    assert (cases["test_bad"].outcome, cases["test_bad"].message) == ("failed", "assert (1 + 1) == 3")
    assert (cases["test_fixture"].outcome, cases["test_fixture"].message) == (
        "error", "fixture 'xpu_count_1' not found")
    assert (cases["test_skip"].outcome, cases["test_skip"].message) == ("skipped", "needs 2 XPUs")
    assert summary(list(cases.values())) == "1 passed, 1 failed, 1 error, 1 skipped"


def test_a_missing_or_empty_file_has_no_cases(tmp_path):
    assert read_cases(tmp_path / "absent.xml") == []
    (tmp_path / "empty.xml").write_text("")
    assert read_cases(tmp_path / "empty.xml") == []
