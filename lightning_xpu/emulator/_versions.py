"""Torch version profiles: which release's ``torch.xpu`` the emulator shows, and whether ``pyzes`` is installed.

``LIGHTNING_XPU_EMULATOR_TORCH=2.8`` (default: the running torch's release) removes what ``torch.xpu`` gained after
that release and counts devices as it did; ``LIGHTNING_XPU_EMULATOR_PYZES=1`` models a machine with the ``pyzes``
package, through which torch 2.13+ counts devices with Level Zero Sysman without initialising the runtime (default
``0``: without, as on most machines, so counting devices arms the fork poisoning). A profile can only take away:
one newer than the running torch is refused.

The release boundaries come from each release's ``torch/xpu/__init__.py`` and ``torch/xpu/memory.py`` (the
``__all__`` lists of the 2.8.0, 2.9.1, 2.10.0, 2.11.0, 2.12.0, 2.13.0, 2.14.1 and 2.15.0 wheels). The memory
statistics are C++ (``torch/csrc/xpu/Module.cpp``): the five count groups came with pytorch/pytorch#169812, merged
after the 2.10 release branch was cut and part of the stack that brought ``memory_snapshot`` in 2.11.
"""

from __future__ import annotations

import dataclasses
import os
import re

ENV_TORCH = "LIGHTNING_XPU_EMULATOR_TORCH"
ENV_PYZES = "LIGHTNING_XPU_EMULATOR_PYZES"

FLOOR = (2, 8)  # XPU distributed training (xccl) ships from torch 2.8; Lightning's XPU support starts there

# The first release whose torch.xpu has the name (public names: __all__; private ones: Level Zero Sysman counting).
_XPU_NAMES_SINCE: dict[str, tuple[int, int]] = {
    **dict.fromkeys(
        (
            "XPUPluggableAllocator", "can_device_access_peer", "change_current_allocator",
            "get_per_process_memory_fraction", "set_per_process_memory_fraction", "is_tf32_supported",
        ),
        (2, 10),
    ),
    **dict.fromkeys(
        (
            "MemPool", "XPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing",
            "make_graphed_callables", "memory_snapshot", "use_mem_pool",
        ),
        (2, 11),
    ),
    **dict.fromkeys(
        (
            "clock_rate", "device_memory_used", "memory_usage", "power_draw", "temperature", "utilization",
            "_device_count_zes", "_raw_device_count_zes", "_enum_zes_device_infos", "_parse_visible_devices",
        ),
        (2, 13),
    ),
    "list_gpu_processes": (2, 14),
}
# The torch._C functions the emulator provides that came later than the floor (Module.cpp).
C_NAMES_SINCE: dict[str, tuple[int, int]] = {
    "_xpu_getMemoryFraction": (2, 10),
    "_xpu_setMemoryFraction": (2, 10),
    "_xpu_canDeviceAccessPeer": (2, 10),
    "_xpu_memorySnapshot": (2, 11),
}
# torch.version.xpu of each release's XPU wheels: the SYCL compiler version as cmake/Modules/FindSYCLToolkit.cmake
# encodes it (major * 10000 + minor * 100 + patch). The compiler is the oneAPI one whose runtime the wheels pin
# (intel-sycl-rt==X in the XPU wheel requirements, mirrored in torch-xpu-ops' release/2.N .github/scripts/build.sh):
# 2025.1.1 for 2.8, 2025.2.1 for 2.9, 2025.3.1 for 2.10, 2025.3.2 for 2.11 and 2.12, 2026.0.0 for 2.13.
SYCL_COMPILER_VERSIONS: dict[tuple[int, int], str] = {
    (2, 8): "20250101",
    (2, 9): "20250201",
    (2, 10): "20250301",
    (2, 11): "20250302",
    (2, 12): "20250302",
    (2, 13): "20260000",
}
# memory_stats groups up to 2.10; 2.11 added allocation, segment, active, inactive_split and inactive_split_bytes
MEMORY_STAT_GROUPS_BEFORE_2_11 = ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes")


@dataclasses.dataclass(frozen=True)
class TorchProfile:
    """The modelled torch release (major, minor) and whether the machine has ``pyzes``."""

    version: tuple[int, int]
    pyzes: bool

    @property
    def label(self) -> str:
        return f"torch {self.version[0]}.{self.version[1]} {'with' if self.pyzes else 'without'} pyzes"

    @property
    def counts_without_init(self) -> bool:
        """torch 2.13+ counts through Level Zero Sysman when ``pyzes`` imports; older releases have no such count."""
        return self.version >= (2, 13) and self.pyzes

    @property
    def sycl_compiler_version(self) -> str:
        """``torch.version.xpu`` of this release's XPU wheels (a profile newer than the table takes its newest)."""
        return SYCL_COMPILER_VERSIONS[min(self.version, max(SYCL_COMPILER_VERSIONS))]

    @property
    def all_memory_stat_groups(self) -> bool:
        return self.version >= (2, 11)

    def has_xpu_name(self, name: str) -> bool:
        return self.version >= _XPU_NAMES_SINCE.get(name, FLOOR)

    def has_c_name(self, name: str) -> bool:
        return self.version >= C_NAMES_SINCE.get(name, FLOOR)

    def missing_xpu_names(self) -> list[str]:
        return [name for name in _XPU_NAMES_SINCE if not self.has_xpu_name(name)]


def _release(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.\d+)?(?:[.+a-z].*)?$", version.strip())
    return (int(match[1]), int(match[2])) if match else None


def torch_profile(running: str) -> TorchProfile:
    """The profile asked for by the environment, on the running torch ``running`` (``torch.__version__``)."""
    running_release = _release(running)
    assert running_release is not None, running
    value = os.environ.get(ENV_TORCH, "").strip()
    release = running_release if value == "" else _release(value)
    if release is None or not FLOOR <= release <= running_release:
        raise ValueError(
            f"{ENV_TORCH}={value!r} is not a torch release the emulator can model on torch {running}: choose one "
            f"from {FLOOR[0]}.{FLOOR[1]} to {running_release[0]}.{running_release[1]} (a profile only removes what "
            "later releases added, so a newer one needs a newer CPU build of torch)."
        )
    pyzes = os.environ.get(ENV_PYZES, "").strip() or "0"
    if pyzes not in ("0", "1"):
        raise ValueError(f"{ENV_PYZES} must be 0 (no pyzes, the default) or 1 (pyzes installed), got {pyzes!r}.")
    return TorchProfile(release, pyzes == "1")
