"""Device profiles of the emulated XPU: what ``torch.xpu.get_device_properties`` reports.

Names keep the real product name as a prefix (FLOPs tables match on it) and end in " (emulated)".
Memory sizes are per stack: a Max 1550 card is two stacks of 64 GiB, two torch devices in the default FLAT
hierarchy and one device of 128 GiB with ``ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE``.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Profile:
    """Static description of one emulated device model (memory, bus and cache figures per stack)."""

    key: str
    product: str
    total_memory: int
    has_fp64: bool
    device_id: int
    gpu_eu_count: int
    gpu_subslice_count: int
    sub_group_sizes: tuple[int, ...]
    has_tf32_xmx: bool
    has_2d_block_io: bool
    architecture: int  # sycl::ext::oneapi::experimental::architecture
    memory_clock_rate: int  # MHz
    memory_bus_width: int  # bits
    last_level_cache_size: int  # bytes
    stacks_per_card: int = 1
    integrated: bool = False  # shares host memory; no free-memory query (sycl::aspect::ext_intel_free_memory)

    @property
    def name(self) -> str:
        return f"{self.product} (emulated)"


MB = 1 << 20
# Nominal figures from the vendors' specifications; architecture ids are SYCL's (major << 22 | minor << 14 | rev).
PROFILES: dict[str, Profile] = {
    p.key: p
    for p in (
        Profile(
            "max1550", "Intel(R) Data Center GPU Max 1550", 64 * GiB, True, 0x0BD5, 512, 64, (16, 32), True, True,
            0x030F0007, 3200, 4096, 204 * MB, stacks_per_card=2,
        ),
        Profile(
            "max1100", "Intel(R) Data Center GPU Max 1100", 48 * GiB, True, 0x0BDA, 448, 56, (16, 32), True, True,
            0x030F0007, 3200, 4096, 108 * MB,
        ),
        Profile(
            "arc-a770", "Intel(R) Arc(TM) A770 Graphics", 16 * GiB, False, 0x56A0, 512, 32, (8, 16, 32), False, False,
            0x030DC008, 2187, 256, 16 * MB,
        ),
        Profile(
            "b580", "Intel(R) Arc(TM) B580 Graphics", 12 * GiB, True, 0xE20B, 160, 20, (16, 32), False, True,
            0x05004000, 2375, 192, 18 * MB,
        ),
        # Lunar Lake's Arc 140V as the Linux driver names it: a generic name with the PCI id; its memory is the
        # share of host memory the driver grants it.
        Profile(
            "lnl", "Intel(R) Graphics [0x64a0]", 16 * GiB, True, 0x64A0, 64, 8, (16, 32), False, True,
            0x05010000, 8533, 128, 8 * MB, integrated=True,
        ),
    )
}
DEFAULT_PROFILE = "max1550"


class EmulatedDeviceProperties:
    """Stands in for ``torch._C._XpuDeviceProperties`` (same attribute names).

    ``card`` and ``stack`` place the device in the emulated machine: ``stack`` is None for a whole card (a
    COMPOSITE root device, or a card of one stack), whose memory, bus and cache are those of all its stacks.
    """

    def __init__(self, profile: Profile, card: int, stack: int | None, total_memory: int) -> None:
        stacks = profile.stacks_per_card if stack is None else 1
        self.name = profile.name
        self.platform_name = "Intel(R) oneAPI Unified Runtime over Level-Zero (emulated)"
        self.vendor = "Intel(R) Corporation"
        self.device_id = profile.device_id
        self.driver_version = "emulated"
        self.version = "emulated"
        self.max_compute_units = profile.gpu_eu_count * stacks
        self.gpu_eu_count = profile.gpu_eu_count * stacks
        self.gpu_subslice_count = profile.gpu_subslice_count * stacks
        self.max_work_group_size = 1024
        self.max_num_sub_groups = 64
        self.sub_group_sizes = list(profile.sub_group_sizes)
        self.memory_clock_rate = profile.memory_clock_rate
        self.memory_bus_width = profile.memory_bus_width * stacks
        self.last_level_cache_size = profile.last_level_cache_size * stacks
        self.architecture = profile.architecture
        self.has_fp16 = True
        self.has_fp64 = profile.has_fp64
        self.has_atomic64 = True
        self.has_bfloat16_conversions = True
        self.has_subgroup_matrix_multiply_accumulate = True
        self.has_subgroup_matrix_multiply_accumulate_tensor_float32 = profile.has_tf32_xmx
        self.has_subgroup_2d_block_io = profile.has_2d_block_io
        self.is_integrated_gpu = profile.integrated
        self.total_memory = total_memory
        self.local_mem_size = 128 * 1024
        self.type = "gpu"
        where = f"{card}" if stack is None else f"{card}.{stack}"
        self.uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"lightning-xpu-emulator/{profile.key}/{where}")

    def __repr__(self) -> str:
        return (
            f"_XpuDeviceProperties(name='{self.name}', platform_name='{self.platform_name}', type='{self.type}', "
            f"device_id=0x{self.device_id:X}, uuid={self.uuid}, driver_version='{self.driver_version}', "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, max_compute_units={self.max_compute_units}, "
            f"gpu_eu_count={self.gpu_eu_count}, gpu_subslice_count={self.gpu_subslice_count}, "
            f"max_work_group_size={self.max_work_group_size}, max_num_sub_groups={self.max_num_sub_groups}, "
            f"sub_group_sizes={self.sub_group_sizes}, has_fp16={int(self.has_fp16)}, "
            f"has_fp64={int(self.has_fp64)}, has_atomic64={int(self.has_atomic64)})"
        )

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle '_XpuDeviceProperties' object")


def get_profile(key: str) -> Profile:
    """The profile named ``key``, or a ValueError listing the choices."""
    try:
        return PROFILES[key]
    except KeyError:
        choices = ", ".join(
            f"{name} ({profile.product}{', the default' if name == DEFAULT_PROFILE else ''})"
            for name, profile in PROFILES.items()
        )
        raise ValueError(
            f"Unknown emulated XPU profile {key!r} in LIGHTNING_XPU_EMULATOR_DEVICE; choose one of: {choices}."
        ) from None
