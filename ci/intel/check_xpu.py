"""Refuse to run the real-hardware tier unless torch sees a real Intel GPU.

    python ci/intel/check_xpu.py [--min-devices N]
    python ci/intel/check_xpu.py --preflight    # before torch is installed: emulator off, a render node this user
                                                # may open, the Level Zero GPU driver
    python ci/intel/check_xpu.py --rehearse     # the tier's rehearsal: every visible XPU must be emulated

Prints the devices and exits 0, or prints ``ERROR: no XPU visible: <why and what to do>`` and exits 1. The emulated
XPU (``LIGHTNING_XPU_EMULATOR``) does not count: the real-hardware tier exists to run on real devices. A rehearsal
(``--rehearse``) is the reverse: it runs the tier's steps on emulated XPUs only, so that nothing it reports can be
taken for a result from an Intel GPU.
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import os
import sys

EMULATOR_VAR = "LIGHTNING_XPU_EMULATOR"
_VISIBILITY_VARS = ("ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR", "ZE_FLAT_DEVICE_HIERARCHY")


def _emulator_problem() -> str | None:
    emulator = os.environ.get(EMULATOR_VAR, "")
    if emulator not in ("", "0"):
        return (f"the XPU emulator is switched on ({EMULATOR_VAR}={emulator}); the real-hardware tier runs on real "
                f"Intel GPUs only: unset {EMULATOR_VAR}")
    return None


def preflight_problem() -> str | None:
    """What rules out an XPU before torch is even installed: the emulator switched on, no GPU render node that this
    user may open, or no Level Zero GPU driver (which only the host's Intel GPU driver provides, never a wheel)."""
    if (reason := _emulator_problem()) is not None or not sys.platform.startswith("linux"):
        return reason
    nodes = sorted(glob.glob("/dev/dri/renderD*"))
    if not nodes and not os.path.exists("/dev/dxg"):  # /dev/dxg: WSL's GPU
        return ("this machine has no GPU render node (/dev/dri/renderD*): install the Intel GPU driver, or run the "
                "container with --device /dev/dri")
    if nodes and not any(os.access(node, os.R_OK | os.W_OK) for node in nodes):
        return (f"this user may not open the GPU render nodes ({', '.join(nodes)}): add it to their group (`ls -l "
                "/dev/dri`; usually `render`: sudo usermod -aG render USER), then restart the runner so it applies")
    if ctypes.util.find_library("ze_intel_gpu") is None:
        return ("the Level Zero GPU driver (libze_intel_gpu.so.1) is not installed: install the Intel GPU driver with "
                "its compute runtime and Level Zero, as PyTorch's 'Getting Started on Intel GPU' page says")
    return None


def problem(min_devices: int = 1) -> str | None:
    """Why the real-hardware tier cannot run here, or None when at least ``min_devices`` real XPUs are visible."""
    if (reason := _emulator_problem()) is not None:
        return reason
    try:
        import torch
    except ImportError:
        return "torch is not installed; install an XPU build first: ci/intel/install_torch.sh nightly|release|floor"
    if getattr(torch.version, "xpu", None) is None or not hasattr(torch, "xpu"):
        return (f"torch {torch.__version__} is not an XPU build (torch.version.xpu is None); install one with "
                "ci/intel/install_torch.sh nightly|release|floor")
    if not torch.xpu.is_available() or torch.xpu.device_count() == 0:
        settings = ", ".join(f"{v}={os.environ[v]}" for v in _VISIBILITY_VARS if v in os.environ) or "none set"
        return ("torch.xpu.is_available() is False: check the Intel GPU driver and Level Zero runtime (`clinfo`, "
                "`xpu-smi discovery`), that this user may open /dev/dri/renderD*, and the device selection "
                f"({settings})")
    names = [torch.xpu.get_device_name(i) for i in range(torch.xpu.device_count())]
    if any("emulated" in name.lower() for name in names):
        return f"the visible XPUs are emulated ({', '.join(names)}); the real-hardware tier needs real Intel GPUs"
    if len(names) < min_devices:
        return f"{len(names)} XPU(s) visible but this run asks for at least {min_devices}"
    return None


def rehearsal_problem(min_devices: int = 1) -> str | None:
    """Why a rehearsal cannot run here, or None when at least ``min_devices`` XPUs are visible and all are emulated."""
    emulator = os.environ.get(EMULATOR_VAR, "")
    if emulator in ("", "0"):
        return f"a rehearsal runs on emulated XPUs: set {EMULATOR_VAR}=N (run_xpu_tier.py --rehearse sets it)"
    import torch

    if not torch.xpu.is_available():
        return (f"{EMULATOR_VAR}={emulator} but torch.xpu.is_available() is False: the emulator needs a CPU build of "
                "torch and lightning-xpu installed (`python -m lightning_xpu.emulator` says what is missing)")
    names = [torch.xpu.get_device_name(i) for i in range(torch.xpu.device_count())]
    real = [name for name in names if "emulated" not in name.lower()]
    if real:
        return f"a rehearsal runs on emulated XPUs only, and these are real: {', '.join(real)}"
    if len(names) < min_devices:
        return f"{len(names)} emulated XPU(s) visible but this rehearsal asks for at least {min_devices}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-devices", type=int, default=1, help="fail with fewer visible XPUs (default: 1)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--preflight", action="store_true", help="only the checks that need no torch")
    mode.add_argument("--rehearse", action="store_true", help="require emulated XPUs: the tier's rehearsal")
    ns = parser.parse_args(argv)
    if ns.rehearse:
        reason = rehearsal_problem(ns.min_devices)
    else:
        reason = preflight_problem() if ns.preflight else problem(ns.min_devices)
    if reason is not None:
        print(f"ERROR: {'cannot rehearse' if ns.rehearse else 'no XPU visible'}: {reason}", file=sys.stderr)
        return 1
    if ns.preflight:
        print("preflight: the emulator is off, this user may open a GPU render node, the Level Zero driver is there")
        return 0
    import torch

    if ns.rehearse:
        print(f"REHEARSAL: torch {torch.__version__} with {torch.xpu.device_count()} EMULATED XPU(s), not Intel GPUs:")
    else:
        print(f"torch {torch.__version__}, XPU runtime {torch.version.xpu}, {torch.xpu.device_count()} XPU(s):")
    for i in range(torch.xpu.device_count()):
        props = torch.xpu.get_device_properties(i)
        driver = getattr(props, "driver_version", "unknown")  # the Level Zero driver that serves this device
        print(f"  xpu:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB, driver {driver}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
