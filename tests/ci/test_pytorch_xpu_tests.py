"""ci/pytorch_xpu_tests.py: each failure of PyTorch's XPU tests on the emulator is explained, no explanation stale."""

from __future__ import annotations

import textwrap

from ci.junit import Case
from ci.pytorch_xpu_tests import check, expected_failure, main, markdown

LDD = "test_xpu.TestXpu::test_torch_version_xpu"
FRACTION = "test_xpu.TestXpu::test_set_per_process_memory_fraction"
MEMPOOL = "test_xpu.TestMemPool::test_mempool_id"


def test_explained_failures_pass_the_check_and_others_do_not():
    cases = [Case(LDD, "failed", "CalledProcessError"), Case("test_xpu.TestXpu::test_streams", "passed"),
             Case("test_xpu.TestXpu::test_events", "failed", "AssertionError: boom")]
    unexplained, stale = check(cases, (2, 13), "max1550")
    assert unexplained == ["test_xpu.TestXpu::test_events: AssertionError: boom"] and stale == []


def test_an_explained_test_that_passes_is_a_stale_explanation():
    unexplained, stale = check([Case(LDD, "passed")], (2, 13), "max1550")
    assert unexplained == [] and len(stale) == 1 and stale[0].startswith(LDD)


def test_explanations_follow_the_profile_and_the_device():
    assert expected_failure(MEMPOOL, (2, 13), "max1550") is None  # emulated from 2.11
    assert "2.11+" in expected_failure(MEMPOOL, (2, 8), "max1550")
    assert "host memory" in expected_failure(FRACTION, (2, 13), "max1550")
    assert expected_failure(FRACTION, (2, 13), "b580") is None  # a 12 GiB device fits the host
    assert "2.10+" in expected_failure(FRACTION, (2, 8), "b580")  # torch 2.8 has no memory fraction


def test_markdown_lists_each_test_with_its_reason():
    text = markdown({"test_xpu.py": [Case(LDD, "failed", "x"), Case("test_xpu.T::test_ok", "passed")]}, (2, 13),
                    "max1550")
    assert "### `test_xpu.py`: 1 passed, 1 failed" in text
    assert f"| `{LDD}` | failed | an XPU build of torch: runs `ldd`" in text
    assert "| `test_xpu.T::test_ok` | passed |  |" in text


def test_run_writes_junit_per_file_and_reports(tmp_path):
    # a fake PyTorch test/ directory: one suite file of plain tests (no torch, no emulator needed)
    tests = tmp_path / "test"
    tests.mkdir()
    (tests / "test_xpu.py").write_text(textwrap.dedent(
        """
        import os
        class TestXpu:
            def test_streams(self):
                assert os.environ["LIGHTNING_XPU_EMULATOR"] == "2"
                assert os.environ["LIGHTNING_XPU_EMULATOR_TORCH"] == "2.13"
            def test_torch_version_xpu(self):
                raise AssertionError("no libtorch_xpu.so")
        """
    ))
    out, md = tmp_path / "out", tmp_path / "report.md"
    assert main(["run", str(tests), str(out), "--torch", "2.13", "--markdown", str(md)]) == 0
    assert (out / "test_xpu.py.xml").is_file() and not (out / "distributed__test_c10d_xccl.py.xml").exists()
    assert "| `test_xpu.TestXpu::test_streams` | passed |" in md.read_text()
    # an explained test that passed: a stale explanation, exit 1
    (out / "test_xpu.py.xml").write_text(
        f'<testsuites><testsuite><testcase classname="test_xpu.TestXpu" name="{LDD.split("::")[1]}"/>'
        "</testsuite></testsuites>"
    )
    assert main(["report", str(out), "--torch", "2.13"]) == 1
