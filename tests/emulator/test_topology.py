"""Device properties, ZE_FLAT_DEVICE_HIERARCHY, ZE_AFFINITY_MASK and the integrated-GPU profile."""

from __future__ import annotations

import json

import pytest

GiB = 2**30

_DESCRIBE = """
import json, torch
n = torch.xpu.device_count()
props = [torch.xpu.get_device_properties(i) for i in range(n)]
print(json.dumps([n] + [[p.total_memory // 2**30, p.memory_bus_width, p.last_level_cache_size // 2**20,
                         p.gpu_eu_count, str(p.uuid)[:8]] for p in props]))
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, [4] + [[64, 4096, 204, 512]] * 4),  # FLAT (the default): a stack is a device
        ({"ZE_FLAT_DEVICE_HIERARCHY": "COMBINED"}, [4] + [[64, 4096, 204, 512]] * 4),
        ({"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, [2] + [[128, 8192, 408, 1024]] * 2),  # a card is a device
        ({"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0.1"}, [1, [64, 4096, 204, 512]]),
        (
            {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "1,0.1"},
            [2, [64, 4096, 204, 512], [128, 8192, 408, 1024]],
        ),
        ({"ZE_AFFINITY_MASK": "1,3"}, [2] + [[64, 4096, 204, 512]] * 2),
        ({"ZE_AFFINITY_MASK": "9"}, [0]),  # selects nothing: no device, as on Level Zero
    ],
)
def test_max1550_hierarchy_and_affinity_mask(run_emulated, env, expected):
    r = json.loads(run_emulated(_DESCRIBE, devices=4, env=env))
    assert [r[0]] + [d[:4] for d in r[1:]] == expected
    assert len({d[4] for d in r[1:]}) == r[0]  # distinct uuids


def test_affinity_mask_is_read_until_the_runtime_enumerates(run_emulated):
    # torch 2.13+ with pyzes; without it the first count enumerates (test_versions.py)
    out = run_emulated(
        """
        import json, os, torch
        r = []
        for mask in ("1", "0,2,3"):
            os.environ["ZE_AFFINITY_MASK"] = mask
            r.append(torch.xpu.device_count())          # counting does not initialise: read every time
        r.append(torch.xpu.is_initialized())
        torch.xpu.init()
        os.environ["ZE_AFFINITY_MASK"] = "0"
        r.append(torch.xpu.device_count())              # fixed when the runtime initialised
        os.environ["ZE_AFFINITY_MASK"] = "0.1"
        print(json.dumps(r + [torch.xpu.device_count()]))
        """,
        devices=4,
        env={"LIGHTNING_XPU_EMULATOR_PYZES": "1"},
    )
    assert json.loads(out) == [1, 3, False, 3, 3]


def test_composite_notation_needs_the_composite_hierarchy(run_emulated):
    out = run_emulated(
        """
        import torch
        try:
            torch.xpu.init()
        except ValueError as e:
            print(str(e).splitlines()[0])
        """,
        devices=4,
        env={"ZE_AFFINITY_MASK": "0.1"},
    )
    assert "uses COMPOSITE notation, but ZE_FLAT_DEVICE_HIERARCHY is FLAT" in out


@pytest.mark.parametrize("profile", ["max1550", "max1100", "arc-a770", "b580", "lnl"])
def test_properties_have_every_field_of_torch_213(run_emulated, profile):
    out = run_emulated(
        """
        import json, torch
        p = torch.xpu.get_device_properties(0)
        fields = ("memory_clock_rate", "memory_bus_width", "architecture", "last_level_cache_size",
                  "is_integrated_gpu", "total_memory", "gpu_subslice_count", "device_id")
        print(json.dumps({f: getattr(p, f) for f in fields}))
        """,
        devices=1,
        profile=profile,
    )
    r = json.loads(out)
    assert all(isinstance(r[f], int) and r[f] > 0 for f in r if f != "is_integrated_gpu")
    assert r["is_integrated_gpu"] is (profile == "lnl")


def test_integrated_gpu_profile(run_emulated):
    out = run_emulated(
        """
        import json, torch
        p = torch.xpu.get_device_properties(0)
        r = [torch.xpu.get_device_name(0), hex(p.device_id), p.is_integrated_gpu, p.total_memory]
        try:
            torch.xpu.mem_get_info(0)
            r.append("answered")
        except RuntimeError as e:
            r.append(str(e))
        r.append(torch.xpu.memory_reserved(0))
        print(json.dumps(r))
        """,
        devices=1,
        profile="lnl",
    )
    name, device_id, integrated, total, info, reserved = json.loads(out)
    assert name == "Intel(R) Graphics [0x64a0] (emulated)"
    assert device_id == "0x64a0" and integrated is True and total == 16 * GiB
    assert info.startswith("The device (Intel(R) Graphics [0x64a0] (emulated)) doesn't support querying the available")
    assert reserved == 0
