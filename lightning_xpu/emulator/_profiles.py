"""Device profiles of the emulated XPU: what ``torch.xpu.get_device_properties`` reports.

Names keep the real product name as a prefix (FLOPs tables match on it) and end in " (emulated)".
Memory sizes are per torch device: a Max 1550 in the default FLAT hierarchy is two devices of 64 GiB.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Profile:
    """Static description of one emulated device model."""

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

    @property
    def name(self) -> str:
        return f"{self.product} (emulated)"


PROFILES: dict[str, Profile] = {
    p.key: p
    for p in (
        Profile("max1550", "Intel(R) Data Center GPU Max 1550", 64 * GiB, True, 0x0BD5, 512, 64, (16, 32), True, True),
        Profile("max1100", "Intel(R) Data Center GPU Max 1100", 48 * GiB, True, 0x0BDA, 448, 56, (16, 32), True, True),
        Profile(
            "arc-a770", "Intel(R) Arc(TM) A770 Graphics", 16 * GiB, False, 0x56A0, 512, 32, (8, 16, 32), False, False
        ),
        Profile("b580", "Intel(R) Arc(TM) B580 Graphics", 12 * GiB, True, 0xE20B, 160, 20, (16, 32), False, True),
    )
}
DEFAULT_PROFILE = "max1550"


class EmulatedDeviceProperties:
    """Stands in for ``torch._C._XpuDeviceProperties`` (same attribute names)."""

    def __init__(self, profile: Profile, index: int) -> None:
        self.name = profile.name
        self.platform_name = "Intel(R) oneAPI Unified Runtime over Level-Zero (emulated)"
        self.vendor = "Intel(R) Corporation"
        self.device_id = profile.device_id
        self.driver_version = "emulated"
        self.version = "emulated"
        self.max_compute_units = profile.gpu_eu_count
        self.gpu_eu_count = profile.gpu_eu_count
        self.gpu_subslice_count = profile.gpu_subslice_count
        self.max_work_group_size = 1024
        self.max_num_sub_groups = 64
        self.sub_group_sizes = list(profile.sub_group_sizes)
        self.has_fp16 = True
        self.has_fp64 = profile.has_fp64
        self.has_atomic64 = True
        self.has_bfloat16_conversions = True
        self.has_subgroup_matrix_multiply_accumulate = True
        self.has_subgroup_matrix_multiply_accumulate_tensor_float32 = profile.has_tf32_xmx
        self.has_subgroup_2d_block_io = profile.has_2d_block_io
        self.is_integrated_gpu = False
        self.total_memory = profile.total_memory
        self.local_mem_size = 128 * 1024
        self.type = "gpu"
        self.uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"lightning-xpu-emulator/{profile.key}/{index}")

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
        raise ValueError(
            f"Unknown emulated XPU profile {key!r} (LIGHTNING_XPU_EMULATOR_DEVICE); "
            f"choose one of {', '.join(PROFILES)}."
        ) from None
