"""tests/series/run.py --standalone: one process per test, outcomes counted from each test's own result."""

import importlib.util
import os
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


_ARTIFACT_TESTS = '''import os
import time
from pathlib import Path

import pytest

standalone = pytest.mark.skipif(False, reason="Standalone execution", standalone=True)
TESTS_ROOT = Path(__file__).parents[1]


def _files():
    return {p for p in TESTS_ROOT.rglob("*") if "__pycache__" not in p.parts}


@standalone
@pytest.mark.parametrize("index", range(3))
def test_leaves_no_artifacts(index, tmp_path):
    # upstream's conftest fails a test when new files appear under tests/ while it runs; the others run beside it
    before = _files()
    (tmp_path / "out.txt").write_text("x")
    time.sleep(1)
    assert not Path(os.environ["TMPDIR"]).is_relative_to(TESTS_ROOT)
    assert _files() == before
'''


def test_the_runner_writes_nothing_under_the_test_tree(tmp_path):
    suite = tmp_path / "tree" / "tests" / "tests_fabric"
    suite.mkdir(parents=True)
    (suite / "test_artifacts.py").write_text(_ARTIFACT_TESTS)
    kept = tmp_path / "kept"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--tree", str(tmp_path / "tree"), "--keep", str(kept), "--standalone",
         "--parallel", "3"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "standalone: 3 passed, 0 skipped, 0 failed" in proc.stdout
    assert not [p for p in kept.iterdir() if p.name.startswith(".standalone")]


def _torch_stream_races() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("series_run", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TORCH_STREAM_RACES


_RACE_NODE = "tests_pytorch/strategies/test_fsdp_integration_xpu.py::test_strategy_sync_batchnorm"
_SANITIZER_TESTS = '''import os

import pytest

standalone = pytest.mark.skipif(False, reason="Standalone execution", standalone=True)


@standalone
def test_strategy_sync_batchnorm():
    assert os.environ["LIGHTNING_XPU_EMULATOR_SANITIZER"] == "0"


@standalone
def test_other():
    assert "LIGHTNING_XPU_EMULATOR_SANITIZER" not in os.environ


@standalone
@pytest.mark.parametrize("case", ["full-32-true", "full-bf16-mixed"])
def test_strategy_checkpoint(case):
    assert os.environ.get("LIGHTNING_XPU_EMULATOR_SANITIZER") == ("0" if case == "full-32-true" else None)
'''


def test_the_sanitizer_is_off_only_for_tests_where_torch_races(tmp_path):
    assert _RACE_NODE in _torch_stream_races()
    path = tmp_path / "tree" / "tests" / _RACE_NODE.split("::")[0]
    path.parent.mkdir(parents=True)
    path.write_text(_SANITIZER_TESTS)
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_XPU_EMULATOR_SANITIZER"}
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--tree", str(tmp_path / "tree"), "--standalone"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "standalone: 4 passed, 0 skipped, 0 failed" in proc.stdout
    assert f"the emulator's stream sanitizer is off for {_RACE_NODE}: FSDP1's" in proc.stdout
    # a race listed for one case leaves the function's other cases sanitized
    case_node = "tests_pytorch/strategies/test_fsdp_integration_xpu.py::test_strategy_checkpoint[full-32-true]"
    assert f"sanitizer is off for {case_node}" in proc.stdout


def _file_sections(series: Path) -> list[str]:
    """Each file's part of each patch: ``+++ b/<path>`` up to the next file's ``diff --git``."""
    return [section for p in sorted(series.glob("*.patch")) for section in p.read_text().split("\ndiff --git ")]


def test_every_listed_race_names_a_test_of_the_series_or_an_xpu_case_it_adds():
    patches = RUNNER.parents[2] / "patches"
    release, master = _file_sections(patches), _file_sections(patches / "master")
    for node, reason in _torch_stream_races().items():
        path, name = node.split("[")[0].split("::")
        added = any(f"+++ b/tests/{path}\n" in s and f"\n+def {name}(" in s for s in release)
        # in upstream's tree: an xpu case the master variant adds to upstream's test
        xpu_case = "xpu" in node.split("[", 1)[-1] and any(
            f"+++ b/tests/{path}\n" in s and "min_xpu_gpus" in s and f"def {name}(" in s for s in master)
        assert added or xpu_case, node
        assert (RUNNER.parents[2] / reason.rsplit("(", 1)[1].rstrip(")")).is_file(), reason
