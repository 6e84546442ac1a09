"""Switch a CPU-only torch into "N emulated XPU devices".

The native part (``csrc/*.cpp``) registers the XPU device guard, hooks, allocator and kernels. This module
fills the Python side the way an XPU build of torch has it: the ``torch._C._xpu_*`` functions and
``torch._C._has_xpu``, so that the unmodified ``torch.xpu`` module (lazy init, queued seeds, fork poisoning,
memory statistics, streams) runs on top of them, trimmed to the torch release of the version profile (_versions.py).
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import threading
from types import ModuleType
from typing import Any

from lightning_xpu.emulator import _build
from lightning_xpu.emulator._profiles import EmulatedDeviceProperties, Profile, get_profile
from lightning_xpu.emulator._versions import MEMORY_STAT_GROUPS_BEFORE_2_11, TorchProfile, torch_profile

ENV_SYNC = "LIGHTNING_XPU_EMULATOR_SYNC"
ENV_SANITIZER = "LIGHTNING_XPU_EMULATOR_SANITIZER"
ENV_MEMORY_RESERVE = "LIGHTNING_XPU_EMULATOR_MEMORY_RESERVE"
ENV_FP64_CONV_EMU = "LIGHTNING_XPU_EMULATOR_FP64_CONV_EMU"

_lock = threading.Lock()
_state: dict[str, Any] = {}


def is_enabled() -> bool:
    """Whether this process runs with emulated XPU devices."""
    return "native" in _state


def native() -> ModuleType:
    """The loaded native module; raises if the emulator is not enabled in this process."""
    if not is_enabled():
        raise RuntimeError(
            "The XPU emulator is not enabled in this process. Set LIGHTNING_XPU_EMULATOR=N before starting Python, "
            "or call lightning_xpu.emulator.enable(N) right after `import torch`."
        )
    return _state["native"]


def profile() -> Profile:
    native()
    return _state["profile"]


def version_profile() -> TorchProfile:
    native()
    return _state["torch_profile"]


def enable(num_devices: int, profile_key: str) -> None:
    """Load the native part and install the Python surface (idempotent for the same arguments)."""
    prof = get_profile(profile_key)
    if not isinstance(num_devices, int) or isinstance(num_devices, bool) or num_devices < 1:
        raise ValueError(f"The XPU emulator needs a device count >= 1, got {num_devices!r}.")
    with _lock:
        if is_enabled():
            if (_state["num_devices"], _state["profile"].key) != (num_devices, prof.key):
                raise RuntimeError(
                    f"The XPU emulator is already enabled with {_state['num_devices']} x {_state['profile'].key}; "
                    f"it cannot switch to {num_devices} x {prof.key} in the same process."
                )
            return
        import torch

        if getattr(torch._C, "_has_xpu", False):
            raise RuntimeError(
                f"torch {torch.__version__} is a real XPU build; the XPU emulator only runs on CPU builds of torch. "
                "Unset LIGHTNING_XPU_EMULATOR to use the real devices."
            )
        _check_cpu_only_build(torch)
        versions = torch_profile(torch.__version__)
        sanitize = _sanitizer_setting()
        memory_reserve = _memory_reserve_setting(prof)
        fp64_conversion_emulation = _fp64_conversion_setting()
        ext = _build.load()
        if torch._C._get_accelerator().type not in ("xpu", "cpu"):
            raise RuntimeError(
                f"torch already uses the accelerator {torch._C._get_accelerator().type!r}; "
                "the XPU emulator only runs on CPU builds of torch."
            )
        asynchronous = os.environ.get(ENV_SYNC, "").strip() in ("", "0")
        ext.configure(
            num_devices,
            prof.stacks_per_card,
            prof.total_memory,
            prof.has_fp64,
            fp64_conversion_emulation,
            memory_reserve,
            prof.architecture,
            not prof.integrated,  # the free-memory query (mem_get_info)
            asynchronous,
            prof.name,
        )
        ext.set_sanitizer(sanitize)
        ext.set_torch_release(*versions.version)
        ext.register_functional_fallbacks()
        if not ext.hooks_installed():
            raise RuntimeError(
                "torch looked up its XPU hooks before the emulator was loaded, so it cannot take effect in this "
                "process. Set LIGHTNING_XPU_EMULATOR=N in the environment before starting Python (the startup hook "
                "enables it right after `import torch`)."
            )
        _install_torch_c(torch, ext, prof, versions)
        _install_torch_xpu(torch, ext, num_devices, prof, versions)
        _install_build_info(torch, versions)
        atexit.register(_stop_autograd_device_threads, ext, os.getpid())
        _state.update(native=ext, num_devices=num_devices, profile=prof, torch_profile=versions)
        from lightning_xpu.emulator import _distributed, _inductor

        _distributed.install()
        _inductor.install_when_imported()  # torch.compile's default backend, once inductor is imported


def _sanitizer_setting() -> bool:
    """The stream sanitizer is on unless ``LIGHTNING_XPU_EMULATOR_SANITIZER=0`` (see README.md)."""
    value = os.environ.get(ENV_SANITIZER, "").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{ENV_SANITIZER} must be 1 (the stream sanitizer on, the default) or 0 (off), got {value!r}.")
    return value == "1"


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _memory_reserve_setting(prof: Profile) -> int:
    """Bytes of each device that the driver and other processes keep: ``LIGHTNING_XPU_EMULATOR_MEMORY_RESERVE``, a
    whole number of bytes or of K, M or G (binary units: ``512M``, ``2G``); default 0 (see README.md)."""
    value = os.environ.get(ENV_MEMORY_RESERVE, "").strip() or "0"
    match = re.fullmatch(r"(\d+)([KMG]?)", value.upper())
    reserve = int(match[1]) * _SIZE_UNITS[match[2]] if match else -1
    if not 0 <= reserve < prof.total_memory:
        raise ValueError(
            f"{ENV_MEMORY_RESERVE} must be a whole number of bytes, optionally with K, M or G (binary units: 512M, "
            f"2G), below the memory of one {prof.key} device ({prof.total_memory >> 30} GiB), got {value!r}."
        )
    return reserve


def _fp64_conversion_setting() -> bool:
    """Whether the modelled build has ``-fsycl-fp64-conv-emu`` (``LIGHTNING_XPU_EMULATOR_FP64_CONV_EMU``, README.md)."""
    value = os.environ.get(ENV_FP64_CONV_EMU, "").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(
            f"{ENV_FP64_CONV_EMU} must be 1 (fp64 conversions emulated on devices without fp64, as in PyTorch's "
            f"wheels; the default) or 0 (a build without -fsycl-fp64-conv-emu), got {value!r}."
        )
    return value == "1"


def _check_cpu_only_build(torch: Any) -> None:
    """Refuse a CUDA or ROCm build before loading anything: such a torch takes only its own accelerator."""
    other = next((f"{name} {v}" for name, v in (("CUDA", torch.version.cuda), ("ROCm", torch.version.hip)) if v), None)
    if other is not None:
        raise RuntimeError(
            f"torch {torch.__version__} is a {other} build, and the XPU emulator runs only on a CPU-only build of "
            "torch (tested: 2.13.0), such as `pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`."
        )


def _stop_autograd_device_threads(ext: ModuleType, pid: int) -> None:
    if os.getpid() == pid:
        ext.stop_autograd_device_threads()
    else:
        # A forked child has the engine's state but not its threads: torch's own shutdown would wait 10 s for them.
        os.environ["TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT"] = "0"


def _install_torch_c(torch: Any, ext: ModuleType, prof: Profile, versions: TorchProfile) -> None:
    """The ``torch._C`` functions of an XPU build (torch/csrc/xpu/Module.cpp), backed by the native module."""
    props: list[EmulatedDeviceProperties] = []

    def index(device: int) -> int:
        return ext.get_device() if device < 0 else device

    def xpu_init() -> None:
        ext.init()
        xpu = torch.xpu
        xpu.default_generators = ext.default_generators()

        if not props:  # the devices the runtime enumerated (ZE_FLAT_DEVICE_HIERARCHY, ZE_AFFINITY_MASK)
            for card, stack, total in ext.devices():
                props.append(EmulatedDeviceProperties(prof, card, None if stack < 0 else stack, total))
        n = len(props)

        def _get_device_properties(device: int) -> EmulatedDeviceProperties:
            device = index(device)
            if not 0 <= device < n:
                # c10::xpu::check_device_index (csrc/topology.cpp's check_index)
                raise RuntimeError(f"The device index is out of range. It must be in [0, {n}), but got {device}.")
            return props[device]

        xpu._get_device_properties = _get_device_properties

    def set_stream(stream_id: int = 0, device_index: int = 0, device_type: int = 0) -> None:
        ext.set_stream(stream_id, device_index, device_type)

    def memory_snapshot(mempool_id: Any = None) -> dict[str, Any]:
        raise NotImplementedError("memory snapshots are not emulated (the allocator model keeps no traces)")

    def can_access_peer(device: int, peer: int) -> bool:
        return all(0 <= index(d) < ext.device_count() for d in (device, peer))

    def stream_from_external(data_ptr: int, device: int) -> Any:
        raise NotImplementedError("external SYCL queues do not exist on the emulated XPU")

    def memory_stats(device: int) -> dict[str, Any]:
        stats = ext.memory_stats(index(device))
        if versions.all_memory_stat_groups:
            return stats
        return {group: stats[group] for group in MEMORY_STAT_GROUPS_BEFORE_2_11}

    c = torch._C
    c._has_xpu = True
    c._XpuDeviceProperties = EmulatedDeviceProperties
    functions = {
        "_xpu_init": xpu_init,
        "_xpu_isInBadFork": ext.is_in_bad_fork,
        # counting through the runtime arms the fork poisoning, in every release (Module.cpp)
        "_xpu_getDeviceCount": ext.get_device_count,
        "_xpu_setDevice": ext.set_device,
        "_xpu_getDevice": ext.get_device,
        "_xpu_exchangeDevice": ext.exchange_device,
        "_xpu_maybeExchangeDevice": ext.exchange_device,
        "_xpu_getCurrentStream": lambda device: ext.current_stream(device),
        "_xpu_getCurrentRawStream": lambda device: ext.current_stream(device)[0],
        "_xpu_setStream": set_stream,
        "_xpu_synchronize": lambda device: ext.synchronize(device),
        "_xpu_getArchFlags": lambda: None,
        "_xpu_emptyCache": ext.empty_cache,
        "_xpu_memoryStats": memory_stats,
        "_xpu_resetPeakMemoryStats": lambda device: ext.reset_peak_memory_stats(device),
        "_xpu_resetAccumulatedMemoryStats": lambda device: ext.reset_accumulated_memory_stats(device),
        "_xpu_getMemoryInfo": lambda device: ext.mem_get_info(device),
        "_xpu_getMemoryFraction": lambda device: ext.get_memory_fraction(device),
        "_xpu_setMemoryFraction": lambda fraction, device: ext.set_memory_fraction(fraction, device),
        "_xpu_canDeviceAccessPeer": can_access_peer,
        "_xpu_getStreamFromExternal": stream_from_external,
        "_xpu_memorySnapshot": memory_snapshot,
    }
    for name, fn in functions.items():
        if versions.has_c_name(name):
            setattr(c, name, fn)


def _install_torch_xpu(torch: Any, ext: ModuleType, stacks: int, prof: Profile, versions: TorchProfile) -> None:
    """Rebind what ``torch.xpu`` captured at import time from the CPU build; trim it to the profile's release."""
    import torch.xpu.random
    import torch.xpu.streams
    from torch import xpu

    from lightning_xpu.emulator._streams import make_stream_classes

    c = torch._C
    xpu._XpuDeviceProperties = c._XpuDeviceProperties
    xpu._exchange_device = c._xpu_exchangeDevice
    xpu._maybe_exchange_device = c._xpu_maybeExchangeDevice
    xpu._is_in_bad_fork = c._xpu_isInBadFork
    _install_device_count(torch, stacks, prof, versions)
    _install_mem_pool(torch, ext, versions)
    Stream, Event = make_stream_classes(torch, ext)
    for module in (xpu, torch.xpu.streams):
        module.Stream = Stream
        module.Event = Event


def _install_mem_pool(torch: Any, ext: ModuleType, versions: TorchProfile) -> None:
    """``torch.xpu.MemPool`` and ``use_mem_pool`` (2.11+) over the allocator model's private pools (allocator.cpp).

    A CPU build defines ``MemPool`` over a dummy ``torch._C._XPUMemPool``; this base stands in for the C++ one
    (c10::xpu::MemPool), under torch's own ``MemPool`` class.
    """
    if not versions.has_xpu_name("MemPool"):
        return
    pool_ids = itertools.count(1)  # c10::xpu::MemPool's uid: user-created pools are (0, uid)

    class _XPUMemPool:
        def __init__(self, allocator: Any = None, is_user_created: bool = True, use_on_oom: bool = False) -> None:
            if allocator is not None or use_on_oom or not is_user_created:
                raise NotImplementedError(
                    "The XPU emulator models MemPool() with the caching allocator only: a custom allocator "
                    "(XPUPluggableAllocator), use_on_oom=True and graph pools are not emulated."
                )
            self._device = torch.xpu.current_device()
            self._id = (0, next(pool_ids))
            ext.pool_create_or_incref(self._device, self._id)

        @property
        def id(self) -> tuple[int, int]:
            return self._id

        @property
        def allocator(self) -> None:
            return None

        def use_count(self) -> int:
            return ext.pool_use_count(self._device, self._id)

        def __del__(self) -> None:
            # ~MemPool: releasePool, then emptyCache(id) returns the pool's free segments
            if hasattr(self, "_id"):
                ext.pool_release(self._device, self._id)
                ext.empty_cache(self._id)

    torch._C._XPUMemPool = _XPUMemPool
    torch.xpu.memory.MemPool.__bases__ = (_XPUMemPool,)
    torch._C._xpu_beginAllocateCurrentThreadToPool = ext.pool_begin_allocate
    torch._C._xpu_endAllocateToPool = ext.pool_end_allocate
    torch._C._xpu_releasePool = ext.pool_release


def _install_build_info(torch: Any, versions: TorchProfile) -> None:
    """What an XPU wheel reports about its build: ``torch.version.xpu`` (the SYCL compiler it was built with) and
    ``USE_XPU=ON`` / ``USE_XCCL=ON`` in ``torch.__config__.show()`` (the Linux XPU wheels build XCCL from 2.8 on)."""
    torch.version.xpu = versions.sycl_compiler_version
    show_config = torch._C._show_config

    def xpu_show_config() -> str:
        text = show_config().replace("USE_XPU=OFF", "USE_XPU=ON")
        return text.replace("USE_XCCL=OFF", "USE_XCCL=ON") if torch.distributed.is_available() else text

    torch._C._show_config = xpu_show_config


def _install_device_count(torch: Any, stacks: int, prof: Profile, versions: TorchProfile) -> None:
    """Count devices as the profile's release does on a machine with or without ``pyzes``."""
    import sys

    from torch import xpu

    for name in versions.missing_xpu_names():
        for module in (xpu, xpu.memory):
            if hasattr(module, name):
                delattr(module, name)
    xpu.__all__ = [name for name in xpu.__all__ if versions.has_xpu_name(name)]
    if versions.version < (2, 13):

        def device_count() -> int:
            """Return the number of XPU device available."""
            # torch 2.8-2.12: always through the runtime (torch._C._xpu_getDeviceCount), which poisons forks
            if not xpu._is_compiled():
                return 0
            return torch._C._xpu_getDeviceCount()

        xpu.device_count = device_count  # is_available() and torch.accelerator look it up at every call
        return
    if not versions.pyzes:
        # torch's own _device_count_zes runs and finds no pyzes (it returns -1), as do the telemetry functions
        sys.modules["pyzes"] = None  # type: ignore[assignment]
        return

    # The Level Zero Sysman count with pyzes: counting devices does not initialise them, so is_available() and
    # device_count() stay fork-safe; initialisation (set_device, tensors) poisons fork.
    # torch's own parser reads ZE_AFFINITY_MASK at every call; a COMPOSITE mask ("0.1") makes it fall back to the
    # runtime's count, which enumerates the devices once and for all, as an XPU build does.
    def device_count_zes() -> int:
        visible = set(xpu._parse_visible_devices())
        if not visible:
            return -1
        tiled = prof.stacks_per_card > 1 and os.environ.get("ZE_FLAT_DEVICE_HIERARCHY") != "COMPOSITE"
        slots = stacks if tiled or prof.stacks_per_card == 1 else -(-stacks // prof.stacks_per_card)
        return len(visible.intersection(range(slots)))

    xpu._device_count_zes = device_count_zes
