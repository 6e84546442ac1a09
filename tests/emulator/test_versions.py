"""Torch version profiles (LIGHTNING_XPU_EMULATOR_TORCH) and the pyzes switch (LIGHTNING_XPU_EMULATOR_PYZES)."""

from __future__ import annotations

import json

import pytest

# In a fresh process: how devices are counted, whether a fork after counting can use the XPU, and what torch.xpu has.
_PROBE = """
import json, multiprocessing as mp, torch
def child(q):
    try:
        torch.ones(1, device="xpu")
        q.put("ok")
    except RuntimeError as e:
        q.put(str(e))
r = {"zes": torch.xpu._device_count_zes() if hasattr(torch.xpu, "_device_count_zes") else None}
r["available"], r["count"] = torch.xpu.is_available(), torch.accelerator.device_count()
r["initialized"] = torch.xpu.is_initialized()
ctx = mp.get_context("fork")
q = ctx.Queue()
p = ctx.Process(target=child, args=(q,)); p.start(); r["forked_child"] = q.get(); p.join()
r["api"] = {name: hasattr(torch.xpu, name) for name in (
    "set_per_process_memory_fraction", "get_per_process_memory_fraction", "can_device_access_peer",
    "is_tf32_supported", "memory_snapshot", "MemPool", "XPUGraph", "temperature", "mem_get_info",
    "is_bf16_supported", "get_device_capability")}
r["in_all"] = "set_per_process_memory_fraction" in torch.xpu.__all__
r["memory_api"] = hasattr(torch.xpu.memory, "set_per_process_memory_fraction")
torch.ones(1024, device="xpu")
r["groups"] = sorted({k.split(".")[0] for k in torch.xpu.memory_stats() if "." in k})
r["bf16"] = torch.xpu.is_bf16_supported()
print(json.dumps(r))
"""

_FOUR_GROUPS = ["active_bytes", "allocated_bytes", "requested_bytes", "reserved_bytes"]
_NINE_GROUPS = sorted(
    [*_FOUR_GROUPS, "allocation", "segment", "active", "inactive_split", "inactive_split_bytes"]
)
_POISONED = (
    "Cannot re-initialize XPU in forked subprocess. To use XPU with multiprocessing, you must use the 'spawn' start "
    "method"
)


def _api(since: float) -> dict[str, bool]:
    first = {
        "set_per_process_memory_fraction": 2.10, "get_per_process_memory_fraction": 2.10,
        "can_device_access_peer": 2.10, "is_tf32_supported": 2.10, "memory_snapshot": 2.11, "MemPool": 2.11,
        "XPUGraph": 2.11, "temperature": 2.13, "mem_get_info": 2.08, "is_bf16_supported": 2.08,
        "get_device_capability": 2.08,
    }
    return {name: since >= version for name, version in first.items()}


@pytest.mark.parametrize(
    ("env", "release", "zes", "fork_safe"),
    [
        ({}, 2.13, -1, False),  # the default: the running torch (2.13), no pyzes
        ({"LIGHTNING_XPU_EMULATOR_PYZES": "1"}, 2.13, 2, True),
        ({"LIGHTNING_XPU_EMULATOR_TORCH": "2.12", "LIGHTNING_XPU_EMULATOR_PYZES": "1"}, 2.12, None, False),
        ({"LIGHTNING_XPU_EMULATOR_TORCH": "2.11"}, 2.11, None, False),
        ({"LIGHTNING_XPU_EMULATOR_TORCH": "2.10"}, 2.10, None, False),
        ({"LIGHTNING_XPU_EMULATOR_TORCH": "2.8.0"}, 2.08, None, False),
    ],
)
def test_version_profile(run_emulated, env, release, zes, fork_safe):
    r = json.loads(run_emulated(_PROBE, env=env))
    assert r["zes"] == zes  # torch returns -1 when pyzes does not import; before 2.13 there is no such count
    assert (r["available"], r["count"], r["initialized"]) == (True, 2, False)
    # without a Level Zero Sysman count, counting registers torch's fork handler: a forked child cannot use the XPU
    assert r["forked_child"] == ("ok" if fork_safe else _POISONED)
    assert r["api"] == _api(release)
    assert r["in_all"] == r["memory_api"] == (release >= 2.10)
    assert r["groups"] == (_NINE_GROUPS if release >= 2.11 else _FOUR_GROUPS)
    assert r["bf16"] is True


def test_without_pyzes_the_first_count_enumerates(run_emulated):
    # torch._C._xpu_getDeviceCount enumerates the devices once: a later ZE_AFFINITY_MASK changes nothing
    out = run_emulated(
        """
        import json, os, torch
        r = []
        for mask in ("1", "0,2,3"):
            os.environ["ZE_AFFINITY_MASK"] = mask
            r.append(torch.xpu.device_count())
        print(json.dumps(r + [torch.xpu.is_initialized(), torch.xpu._is_in_bad_fork()]))
        """,
        devices=4,
    )
    assert json.loads(out) == [1, 1, False, False]


def test_pyzes_telemetry_needs_pyzes(run_emulated):
    out = run_emulated(
        """
        import torch
        try:
            torch.xpu.temperature(0)
        except ImportError as e:
            print(e)
        """
    )
    assert "pyzes is required" in out


def test_composite_mask_falls_back_to_the_poisoning_count(run_emulated):
    # with pyzes, torch's Sysman count parses FLAT masks only: "0.1" makes it count through the runtime
    out = run_emulated(
        """
        import os, torch
        print(torch.xpu._device_count_zes(), torch.xpu.device_count())
        pid = os.fork()
        if pid == 0:
            os._exit(0 if torch.xpu._is_in_bad_fork() else 1)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """,
        devices=4,
        env={"LIGHTNING_XPU_EMULATOR_PYZES": "1", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0.1"},
    )
    assert out.split() == ["-1", "1", "0"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LIGHTNING_XPU_EMULATOR_TORCH": "2.14"}, "LIGHTNING_XPU_EMULATOR_TORCH='2.14' is not a torch release the"),
        ({"LIGHTNING_XPU_EMULATOR_TORCH": "2.7"}, "choose one from 2.8 to 2.13"),
        ({"LIGHTNING_XPU_EMULATOR_TORCH": "latest"}, "LIGHTNING_XPU_EMULATOR_TORCH='latest' is not a torch release"),
        ({"LIGHTNING_XPU_EMULATOR_PYZES": "yes"}, "LIGHTNING_XPU_EMULATOR_PYZES must be 0 (no pyzes, the default)"),
        ({"LIGHTNING_XPU_EMULATOR_SANITIZER": "yes"}, "LIGHTNING_XPU_EMULATOR_SANITIZER must be 1 (the stream"),
    ],
)
def test_unknown_or_newer_profile_is_refused(run_emulated, env, message):
    out = run_emulated(
        f"""
        import os, torch
        from lightning_xpu import emulator
        os.environ.update({env!r})
        try:
            emulator.enable(2)
        except ValueError as e:
            print(e)
        print(emulator.is_enabled(), torch._C._has_xpu)
        """,
        devices=None,
    )
    first, last = out.strip().splitlines()
    assert message in first
    assert last == "False False"  # refused before anything was changed
