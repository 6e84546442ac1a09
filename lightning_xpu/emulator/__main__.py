"""``python -m lightning_xpu.emulator``: report the emulator's status, prebuild it, or install its start-up hook."""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from pathlib import Path

from lightning_xpu import emulator

_PTH_LINE = (
    'import os; os.environ.get("LIGHTNING_XPU_EMULATOR", "").strip() not in ("", "0") and '
    '__import__("lightning_xpu.emulator._startup", fromlist=["_"]).install()\n'
)


def _status() -> int:
    count = emulator.requested_num_devices()
    if count is None:
        print(f"XPU emulator: off ({emulator.ENV_NUM_DEVICES} is not set); nothing is patched.")
        return 0
    import torch

    emulator.enable()  # no-op when the start-up hook already did it
    from lightning_xpu.emulator import _runtime

    modelled = _runtime.version_profile().label
    print(f"XPU emulator: on, {torch.xpu.device_count()} emulated device(s), torch {torch.__version__} as {modelled}")
    for i in range(torch.xpu.device_count()):
        props = torch.xpu.get_device_properties(i)
        print(
            f"  xpu:{i}  {props.name}  {props.total_memory / 2**30:.0f} GiB  fp64={'yes' if props.has_fp64 else 'no'}"
        )
    print(f"  native library (emulated runtime): {emulator.build()}")
    return 0


def _install_hook() -> int:
    target = Path(sysconfig.get_paths()["purelib"]) / "lightning_xpu_emulator.pth"
    target.write_text(_PTH_LINE)
    print(f"wrote {target} (active only when {emulator.ENV_NUM_DEVICES} is set)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_xpu.emulator", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--build", action="store_true", help="compile the native part into the cache and exit")
    group.add_argument(
        "--install-hook", action="store_true", help="write the start-up .pth into site-packages (editable installs)"
    )
    args = parser.parse_args(argv)
    try:
        if args.build:
            print(emulator.build(verbose="VERBOSE" in os.environ))
            return 0
        if args.install_hook:
            return _install_hook()
        return _status()
    except (emulator.EmulatorBuildError, ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
