"""An emulated Intel XPU: real ``xpu`` tensors on a CPU-only PyTorch build, for tests and CI.

Switched on by ``LIGHTNING_XPU_EMULATOR=N`` in the environment (every Python process started under it sees ``N``
emulated devices right after ``import torch``), or by :func:`enable` right after ``import torch``.
``LIGHTNING_XPU_EMULATOR_DEVICE`` picks the device profile (``max1550`` by default, ``max1100``, ``arc-a770``,
``b580``, ``lnl``); ``LIGHTNING_XPU_EMULATOR_SYNC=1`` switches the asynchronous device model off.
``LIGHTNING_XPU_EMULATOR_TORCH`` (a release from 2.8 to the running torch's) and ``LIGHTNING_XPU_EMULATOR_PYZES``
(``0``, the default, or ``1``) pick the torch version profile. README.md lists what the emulator reproduces.
Importing this package imports nothing from torch and changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning_xpu.emulator._build import EmulatorBuildError
from lightning_xpu.emulator._profiles import DEFAULT_PROFILE, PROFILES

__all__ = [
    "DEFAULT_PROFILE",
    "ENV_DEVICE",
    "ENV_NUM_DEVICES",
    "PROFILES",
    "EmulatorBuildError",
    "build",
    "counters",
    "enable",
    "is_enabled",
    "reset_counters",
]

ENV_NUM_DEVICES = "LIGHTNING_XPU_EMULATOR"
ENV_DEVICE = "LIGHTNING_XPU_EMULATOR_DEVICE"


def requested_num_devices() -> int | None:
    """The device count asked for by ``LIGHTNING_XPU_EMULATOR`` (None when unset, empty or ``0``)."""
    value = os.environ.get(ENV_NUM_DEVICES, "").strip()
    if value in ("", "0"):
        return None
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 1:
        raise ValueError(f"{ENV_NUM_DEVICES} must be a device count >= 1 (or unset), got {value!r}.")
    return count


def enable(num_devices: int | None = None, profile: str | None = None) -> None:
    """Give this process ``num_devices`` emulated XPU devices of the given profile.

    Defaults come from ``LIGHTNING_XPU_EMULATOR`` and ``LIGHTNING_XPU_EMULATOR_DEVICE``. Idempotent for the same
    arguments; refuses on a real XPU build of torch, and when torch already looked up its XPU hooks.
    Builds the native part on first use (needs a C++ compiler), see :func:`build`.
    """
    from lightning_xpu.emulator import _runtime

    if num_devices is None:
        num_devices = requested_num_devices()
        if num_devices is None:
            raise ValueError(f"enable() needs num_devices, or {ENV_NUM_DEVICES}=N in the environment.")
    if profile is None:
        profile = os.environ.get(ENV_DEVICE, "").strip() or DEFAULT_PROFILE
    _runtime.enable(num_devices, profile)


def is_enabled() -> bool:
    """Whether this process runs with emulated XPU devices."""
    from lightning_xpu.emulator import _runtime

    return _runtime.is_enabled()


def counters() -> dict[str, int]:
    """Process-wide counts since start or :func:`reset_counters`.

    Keys: ``device_init``, ``synchronize``, ``h2d_copies``/``h2d_bytes``, ``d2h_copies``/``d2h_bytes``,
    ``d2d_copies``/``d2d_bytes``, ``item`` (scalar reads such as ``.item()``), ``fallback_ops`` (operators run by
    the CPU fallback).
    """
    from lightning_xpu.emulator import _runtime

    return dict(_runtime.native().counters())


def reset_counters() -> None:
    """Set every counter of :func:`counters` back to zero."""
    from lightning_xpu.emulator import _runtime

    _runtime.native().reset_counters()


def build(verbose: bool = False) -> Path:
    """Compile the native part into the cache (once per torch build and source) and return the library's path."""
    from lightning_xpu.emulator import _build

    return _build.build(verbose=verbose)
