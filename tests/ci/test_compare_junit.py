"""ci/cuda/compare_junit.py: outcomes of two JUnit reports, per test or per test function."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ci" / "cuda"))
import compare_junit  # noqa: E402


def _report(path: Path, cases: dict[str, str]) -> Path:
    body = []
    for name, outcome in cases.items():
        child = {"passed": "", "failure": "<failure/>", "skipped": "<skipped/>"}[outcome]
        body.append(f'<testcase classname="tests_x.test_a" name="{name}">{child}</testcase>')
    path.write_text(f"<testsuites><testsuite>{''.join(body)}</testsuite></testsuites>")
    return path


def test_by_function_compares_the_cuda_cases_of_a_test_that_gained_an_accelerator_parameter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _report(tmp_path / "before.xml", {"test_kept": "passed", "test_broken": "passed", "test_p[1]": "passed"})
    after = _report(tmp_path / "after.xml", {
        "test_kept[cuda]": "passed", "test_kept[xpu]": "skipped",
        "test_broken[gpu]": "failure", "test_broken[xpu]": "skipped",
        "test_p[1-cuda]": "passed", "test_p[1-xpu]": "skipped",
    })
    assert compare_junit.compare_functions(str(before), str(after)) == 0
    out = capsys.readouterr().out
    assert "1 function(s) with other outcomes" in out
    assert "{'passed': 1} -> {'failure': 1}  tests_x.test_a::test_broken" in out
    # compared per test, every case of the three is new or gone
    compare_junit.main(str(before), str(after))
    assert "9 changed outcome(s)" in capsys.readouterr().out
