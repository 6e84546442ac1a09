"""The Intel CI scripts refuse to run without a real XPU and never pass by skipping everything."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from ci.intel.tier_summary import summarize

ROOT = Path(__file__).resolve().parents[2]
INTEL = ROOT / "ci" / "intel"
WORKFLOW = ROOT / "ci" / "github" / "workflows" / "intel-xpu.yml"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_XPU_EMULATOR"}
    return {**env, **extra}


@pytest.mark.skipif(getattr(torch.version, "xpu", None) is not None,
                    reason="the dry run needs a torch without XPU support; the `ci` tox environment has one")
@pytest.mark.parametrize("script", ["check_xpu.py", "run_xpu_tier.py"])
def test_dry_run_without_an_intel_gpu_stops_with_no_xpu_visible(tmp_path, script):
    """This machine has a CPU-only torch: both entry points stop at the first step and say why."""
    out = tmp_path / "results"
    args = ["--out", str(out)] if script == "run_xpu_tier.py" else []
    proc = subprocess.run([sys.executable, str(INTEL / script), *args], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert f"ERROR: no XPU visible: torch {torch.__version__} is not an XPU build" in output
    assert "install one with ci/intel/install_torch.sh nightly|release|floor" in output
    assert not out.exists()  # nothing was built, installed or written


def test_preflight_refuses_before_any_download(monkeypatch):
    """``tox -e xpu`` and the workflow run this before installing gigabytes of XPU wheels."""
    from ci.intel import check_xpu

    monkeypatch.setattr(check_xpu.sys, "platform", "linux")
    monkeypatch.setattr(check_xpu.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(check_xpu.os.path, "exists", lambda path: False)
    assert "no GPU render node (/dev/dri/renderD*)" in check_xpu.preflight_problem()
    monkeypatch.setattr(check_xpu.glob, "glob", lambda pattern: ["/dev/dri/renderD128"])
    monkeypatch.setattr(check_xpu.os, "access", lambda path, mode: False)
    assert "this user may not open the GPU render nodes (/dev/dri/renderD128)" in check_xpu.preflight_problem()
    assert "usermod -aG render" in check_xpu.preflight_problem()
    monkeypatch.setattr(check_xpu.os, "access", lambda path, mode: path == "/dev/dri/renderD128")
    monkeypatch.setattr(check_xpu.ctypes.util, "find_library", lambda name: None)
    assert "the Level Zero GPU driver (libze_intel_gpu.so.1) is not installed" in check_xpu.preflight_problem()
    monkeypatch.setattr(check_xpu.ctypes.util, "find_library", lambda name: f"lib{name}.so.1")
    assert check_xpu.preflight_problem() is None
    monkeypatch.setenv("LIGHTNING_XPU_EMULATOR", "2")
    assert "the XPU emulator is switched on" in check_xpu.preflight_problem()


def test_the_emulator_does_not_count_as_an_xpu(tmp_path):
    proc = subprocess.run([sys.executable, str(INTEL / "run_xpu_tier.py"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=_env(LIGHTNING_XPU_EMULATOR="2"), timeout=120)
    assert proc.returncode == 1
    assert "ERROR: no XPU visible: the XPU emulator is switched on (LIGHTNING_XPU_EMULATOR=2)" in proc.stdout


def test_check_reports_emulated_devices_and_too_few_devices(monkeypatch):
    from ci.intel import check_xpu

    monkeypatch.setattr(torch.version, "xpu", "20250101", raising=False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 2)
    monkeypatch.setattr(torch.xpu, "get_device_name", lambda i: "Intel(R) Data Center GPU Max 1100 (emulated)")
    assert "are emulated" in check_xpu.problem()
    monkeypatch.setattr(torch.xpu, "get_device_name", lambda i: "Intel(R) Data Center GPU Max 1100")
    assert check_xpu.problem(min_devices=2) is None
    assert check_xpu.problem(min_devices=4) == "2 XPU(s) visible but this run asks for at least 4"
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0.0")
    assert "torch.xpu.is_available() is False" in check_xpu.problem()
    assert "ZE_AFFINITY_MASK=0.0" in check_xpu.problem()


def _junit(path: Path, *cases: str) -> None:
    body = "".join(f'<testcase classname="tests_fabric.test_xpu" name="test_{i}">{inner}</testcase>'
                   for i, inner in enumerate(cases))
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')


def test_summary_fails_when_every_xpu_test_skipped(tmp_path):
    _junit(tmp_path / "junit-lightning.xml", '<skipped message="Requires: [min_xpu_gpus=2]"/>')
    _junit(tmp_path / "junit-lightning-standalone.standalone-0.xml", '<skipped message="Requires: [standalone]"/>')
    text, ok = summarize(tmp_path)
    assert not ok
    assert "FAILED: no XPU test executed" in text
    assert "- 1 x Requires: [min_xpu_gpus=2]" in text


def test_summary_fails_on_a_failed_test_and_passes_otherwise(tmp_path):
    _junit(tmp_path / "junit-lightning.xml", "", '<skipped message="needs 4"/>')
    _junit(tmp_path / "junit-standalone-standalone.standalone-0.xml", "")
    text, ok = summarize(tmp_path)
    assert ok and "## XPU tier: PASSED" in text and "2 XPU test(s) executed" in text
    assert "| standalone-standalone | 1 passed |" in text
    _junit(tmp_path / "junit-standalone.xml", '<failure message="assert xpu == cpu"/>')
    text, ok = summarize(tmp_path)
    assert not ok
    assert "`standalone: tests_fabric.test_xpu::test_0: assert xpu == cpu`" in text


def test_install_script_rejects_an_unknown_channel():
    proc = subprocess.run(["bash", str(INTEL / "install_torch.sh"), "stable"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr


def test_workflow_runs_the_scripts_on_intel_runners_for_each_torch_channel():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert "schedule" in triggers and "pull_request" in triggers and "workflow_dispatch" in triggers
    job = workflow["jobs"]["xpu-tier"]
    assert job["runs-on"] == ["self-hosted", "linux", "intel-xpu"]
    assert job["strategy"]["matrix"]["torch"] == ["nightly", "release", "floor"]
    assert job["strategy"]["matrix"]["lightning"] == ["2.6.6"]
    assert job["strategy"]["fail-fast"] is False
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert job["env"]["XPU_TORCH"] == "${{ matrix.torch }}"
    assert 'ci/intel/install_torch.sh "$XPU_TORCH"' in runs
    assert "ci/intel/run_xpu_tier.py" in runs
    for script in ("install_torch.sh", "run_xpu_tier.py", "check_xpu.py"):
        assert (INTEL / script).is_file()


def test_workflow_is_safe_on_a_self_hosted_runner():
    """What ``zizmor --offline`` (tox -e lint) checks, readable without it: pinned actions, no token, no expansion."""
    for workflow in sorted(WORKFLOW.parent.glob("*.yml")):
        text = workflow.read_text()
        uses = re.findall(r"uses: (\S+)(.*)", text)
        assert uses, workflow
        for action, comment in uses:  # a tag or branch can be moved; a commit cannot
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), f"{workflow.name}: {action} is not pinned"
            assert re.fullmatch(r"\s+# v\d+\.\d+\.\d+", comment), f"{workflow.name}: {action} names no version"
        for job in yaml.safe_load(text)["jobs"].values():
            for step in job["steps"]:
                if step.get("uses", "").startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False  # later jobs on the machine reuse .git/config
                assert "${{" not in step.get("run", ""), f"{workflow.name}: pass {step['run']!r}'s values via env:"


def test_the_tier_refuses_a_lightning_that_is_not_this_series(monkeypatch):
    from ci.intel import run_xpu_tier

    def doctor(version: str | None):
        row = ({"installed": True, "version": version, "series_version": int(version.rsplit(".", 1)[1])}
               if version else {"installed": False})
        rows = [{"root": root, **row} for root in ("lightning", "pytorch_lightning", "lightning_fabric")]
        out = json.dumps({"lightning": rows})
        return lambda *args, **kwargs: subprocess.CompletedProcess(args, 0, stdout=out, stderr="")

    monkeypatch.setattr(run_xpu_tier.subprocess, "run", doctor("2.6.6+xpu.3"))
    run_xpu_tier.check_installed(3)
    with pytest.raises(run_xpu_tier.StepFailed, match=r"not this series \(xpu.4\): lightning \(2.6.6\+xpu.3\)"):
        run_xpu_tier.check_installed(4)
    monkeypatch.setattr(run_xpu_tier.subprocess, "run", doctor(None))
    with pytest.raises(run_xpu_tier.StepFailed, match="lightning_fabric \\(not installed\\)"):
        run_xpu_tier.check_installed(3)
