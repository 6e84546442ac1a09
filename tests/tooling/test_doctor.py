"""The doctor's verdict: usable, emulated or not usable with the reason and the next step; the exit status follows."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from lightning_xpu import __version__
from lightning_xpu.series import load_series
from lightning_xpu.verdict import diagnose

from .conftest import PATCHES, run_cli

ARC = "Intel(R) Arc(TM) B580 Graphics"
XPU_WHEELS = "pip install torch --index-url https://download.pytorch.org/whl/xpu"


def _report(**changes: Any) -> dict[str, Any]:
    """A report of a working machine (two Intel GPUs, the patched Lightning), with ``changes`` applied by path."""
    data: dict[str, Any] = {
        "python": "3.11", "platform": "Linux", "emulator": False, "ccl_bindings": False, "shim_series_version": 34,
        "torch": {"installed": True, "version": "2.13.0+xpu", "cuda": None, "xpu_build": "20250101", "xccl": True,
                  "xpu_default_backend": "xccl",
                  "xpu": {"module": True, "compiled": True, "available": True, "device_count": 2},
                  "devices": [{"index": 0, "name": ARC, "total_memory": 12 * 2**30},
                              {"index": 1, "name": ARC, "total_memory": 12 * 2**30}]},
        "gpu_nodes": {"render_nodes": [{"path": "/dev/dri/renderD128", "group": "render", "accessible": True}],
                      "wsl": False},
        "lightning": [{"root": root, "installed": True, "version": "2.6.6+xpu.34", "path": f"/sp/{root}",
                       "series_version": 34, "patched_in_place": False}
                      for root in ("lightning", "pytorch_lightning", "lightning_fabric")],
        "env": {"ZE_AFFINITY_MASK": None, "ONEAPI_DEVICE_SELECTOR": None, "ZE_FLAT_DEVICE_HIERARCHY": None,
                "LIGHTNING_XPU_EMULATOR": None},
    }
    for path, value in changes.items():
        *parents, key = path.split("__")
        target = data
        for name in parents:
            target = target[int(name)] if isinstance(target, list) else target[name]
        target[key] = copy.deepcopy(value)
    return data


NO_XPUS = {"torch__xpu__device_count": 0, "torch__xpu__available": False, "torch__devices": []}
CPU_TORCH = {**NO_XPUS, "torch__version": "2.13.0+cpu", "torch__xpu_build": None, "torch__xpu__compiled": False}


def test_a_working_machine_is_usable_and_exits_0() -> None:
    verdict = diagnose(_report())
    assert (verdict.state, verdict.exit_status, verdict.next_step) == ("usable", 0, None)
    assert verdict.line() == f"verdict: usable: Lightning 2.6.6+xpu.34 runs on 2 Intel GPU(s): {ARC}"


def test_emulated_xpus_are_their_own_verdict_with_exit_status_3() -> None:
    report = _report(**{**CPU_TORCH, "emulator": True, "torch__xpu__compiled": True, "torch__xpu__device_count": 1,
                        "env__LIGHTNING_XPU_EMULATOR": "2",
                        "torch__devices": [{"index": 0, "name": "Max 1550 (emulated)", "total_memory": 2**36}]})
    verdict = diagnose(report)
    assert (verdict.state, verdict.exit_status) == ("emulated", 3)
    assert "EMULATED XPU(s) (LIGHTNING_XPU_EMULATOR=2), not on an Intel GPU" in verdict.reason


@pytest.mark.parametrize(
    ("changes", "reason", "next_step"),
    [
        pytest.param(CPU_TORCH, "torch 2.13.0+cpu is a CPU-only build, without XPU support",
                     f"pip uninstall -y torch && {XPU_WHEELS}", id="cpu-torch"),
        pytest.param({**CPU_TORCH, "torch__version": "2.13.0", "torch__cuda": "12.8"},
                     "torch 2.13.0 is a CUDA 12.8 build, without XPU support", XPU_WHEELS, id="cuda-torch"),
        pytest.param({"torch__version": "2.7.1+xpu"}, "torch 2.7.1+xpu is older than 2.8",
                     "pip install --upgrade torch --index-url https://download.pytorch.org/whl/xpu", id="old-torch"),
        pytest.param({"torch": {"installed": False}}, "torch is not installed", XPU_WHEELS, id="no-torch"),
        pytest.param({"torch": {"installed": True, "import_error": "RuntimeError: torch 2.13.0 is a real XPU build"},
                      "env__LIGHTNING_XPU_EMULATOR": "2"}, "`import torch` fails: RuntimeError: torch 2.13.0 is a real",
                     "unset LIGHTNING_XPU_EMULATOR", id="import-fails"),
        pytest.param({**NO_XPUS, "gpu_nodes__render_nodes": []},
                     "sees no Intel GPU: this machine has no GPU render node", "install the Intel GPU driver",
                     id="no-driver"),
        pytest.param({**NO_XPUS, "gpu_nodes__render_nodes": [
            {"path": "/dev/dri/renderD128", "group": "render", "accessible": False}]},
            "this user may not open /dev/dri/renderD128 (group render)", "sudo usermod -aG render $USER",
            id="render-group"),
        pytest.param({**NO_XPUS, "env__ZE_AFFINITY_MASK": "5"}, "ZE_AFFINITY_MASK='5' selects no device",
                     "unset ZE_AFFINITY_MASK", id="affinity-mask"),
        pytest.param(NO_XPUS, "the Level Zero runtime finds no device", "clinfo -l", id="no-device"),
        pytest.param({"torch__devices": [{"index": 0, "error": "device lost"}]}, "xpu:0 cannot be queried (device "
                     "lost)", "check the Intel GPU driver", id="device-error"),
        pytest.param({**CPU_TORCH, "env__LIGHTNING_XPU_EMULATOR": "2"}, "the emulator did not start in this process",
                     "python -m lightning_xpu.emulator --install-hook", id="emulator-hook-missing"),
        pytest.param({"lightning": [{"root": "lightning", "installed": False}]}, "Lightning is not installed",
                     "lightning-xpu build --install", id="no-lightning"),
        pytest.param({"lightning__1__version": "2.6.6", "lightning__1__series_version": None},
                     "pytorch_lightning 2.6.6 is installed without the XPU patches", "lightning-xpu build --install",
                     id="unpatched-lightning"),
    ],
)
def test_not_usable_names_the_reason_and_the_next_step(changes: dict[str, Any], reason: str, next_step: str) -> None:
    verdict = diagnose(_report(**changes))
    assert (verdict.state, verdict.exit_status) == ("not usable", 1)
    assert reason in verdict.reason
    assert next_step in verdict.next_step
    assert verdict.line().startswith("verdict: not usable: ") and f". Next: {verdict.next_step}" in verdict.line()


def test_an_error_that_ends_with_a_full_stop_gets_no_second_one() -> None:
    error = "ValueError: Unknown emulated XPU profile 'h100' in LIGHTNING_XPU_EMULATOR_DEVICE; choose one of: lnl."
    verdict = diagnose(_report(torch={"installed": True, "import_error": error}, env__LIGHTNING_XPU_EMULATOR="2"))
    assert verdict.line() == (f"verdict: not usable: `import torch` fails: {error} Next: unset LIGHTNING_XPU_EMULATOR, "
                              "or fix what the error names")


def test_an_older_series_is_usable_with_a_note() -> None:
    verdict = diagnose(_report(shim_series_version=35))
    assert verdict.state == "usable" and "this tool's series is version 35" in verdict.reason


def test_the_report_ends_with_the_verdict_and_the_exit_status_follows_it() -> None:
    import torch

    text = run_cli("doctor", env={"LIGHTNING_XPU_EMULATOR": "0"})
    as_json = run_cli("doctor", "--json", env={"LIGHTNING_XPU_EMULATOR": "0"})
    verdict = json.loads(as_json.stdout)["verdict"]
    last = text.stdout.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"verdict: {verdict['state']}: ")
    assert text.returncode == as_json.returncode == verdict["exit_status"], text.stderr
    if not torch.xpu._is_compiled():  # the tooling tier's CPU environments: the version and the XPU wheels named
        assert text.returncode == 1
        assert last.startswith(f"verdict: not usable: torch {torch.__version__} is a ")
        assert "without XPU support" in last
        assert last.endswith(f". Next: pip uninstall -y torch && {XPU_WHEELS}")


def test_version_names_the_tool_and_the_series() -> None:
    proc = run_cli("--version")
    patches = load_series(PATCHES).version
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"lightning-xpu {__version__} (series of {patches} patches: lightning 2.6.6+xpu.{patches})\n"
