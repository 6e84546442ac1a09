"""The doctor's verdict: from ``doctor.collect()``'s report, whether Lightning can run on an XPU here, and if not,
why and which command comes next.

Three verdicts, each with its exit status: ``usable`` (0: Lightning runs on real Intel GPUs), ``not usable`` (1: the
reason names what is missing and the next step fixes it) and ``emulated`` (3: Lightning runs, on the emulated XPU of
``LIGHTNING_XPU_EMULATOR``, which is no Intel GPU). 2 stays argparse's status for a bad command line. The checks run in
the order a set-up is built: torch, its XPU support, the devices, then the patched Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

USABLE, NOT_USABLE, EMULATED = "usable", "not usable", "emulated"
EXIT_STATUS = {USABLE: 0, NOT_USABLE: 1, EMULATED: 3}
TORCH_FLOOR = Version("2.8")  # the first release whose XPU wheels have the xccl backend; the series checks it too
XPU_WHEELS = "https://download.pytorch.org/whl/xpu"
INSTALL_XPU_TORCH = f"pip install torch --index-url {XPU_WHEELS}"
DRIVER_GUIDE = "https://dgpu-docs.intel.com/driver/client/overview.html"
BUILD_INSTALL = "lightning-xpu build --install"
EMULATOR_VAR = "LIGHTNING_XPU_EMULATOR"


@dataclass(frozen=True)
class Verdict:
    """One of ``usable``, ``emulated`` or ``not usable``, the reason, and for ``not usable`` the next step."""

    state: str
    reason: str
    next_step: str | None = None

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.state]

    def line(self) -> str:
        """The report's last line."""
        text = f"verdict: {self.state}: {self.reason}"
        # a reason quoted from an error may end with its own full stop
        return f"{text.removesuffix('.')}. Next: {self.next_step}" if self.next_step else text

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "next": self.next_step, "exit_status": self.exit_status}


def diagnose(data: dict[str, Any]) -> Verdict:
    """Judge a ``doctor.collect()`` report; the first problem found, in set-up order, decides."""
    return _torch_problem(data) or _device_problem(data) or _lightning_verdict(data)


def _not_usable(reason: str, next_step: str | None) -> Verdict:
    return Verdict(NOT_USABLE, reason, next_step)


def _emulator_requested(data: dict[str, Any]) -> str | None:
    value = (data["env"].get(EMULATOR_VAR) or "").strip()
    return None if value in ("", "0") else value


def _torch_problem(data: dict[str, Any]) -> Verdict | None:
    torch = data["torch"]
    if not torch["installed"]:
        return _not_usable("torch is not installed", INSTALL_XPU_TORCH)
    if "import_error" in torch:
        fix = f"unset {EMULATOR_VAR}, or fix what the error names" if _emulator_requested(data) else None
        return _not_usable(f"`import torch` fails: {torch['import_error']}", fix)
    version = torch["version"]
    try:
        too_old = Version(version).release[:2] < TORCH_FLOOR.release
    except InvalidVersion:
        too_old = False
    if too_old:
        reason = (f"torch {version} is older than {TORCH_FLOOR}, the first release Lightning supports on XPU (its XPU "
                  "wheels bring the xccl backend)")
        return _not_usable(reason, f"pip install --upgrade torch --index-url {XPU_WHEELS}")
    requested = _emulator_requested(data)
    if requested and not data["emulator"]:
        if data["emulator"] is None:
            return _not_usable(f"{EMULATOR_VAR}={requested} is set, but this install has no emulator",
                               "`pip install .` in a clone of lightning-xpu")
        return _not_usable(f"{EMULATOR_VAR}={requested} is set, but the emulator did not start in this process (an "
                           "editable install has no start-up hook)", "python -m lightning_xpu.emulator --install-hook")
    if not torch["xpu"]["compiled"] and not data["emulator"]:
        what = (f"a CUDA {torch['cuda']} build, without XPU support" if torch["cuda"] else
                f"a CPU-only build, without XPU support ({EMULATOR_VAR}=2 emulates XPUs on it)")
        return _not_usable(f"torch {version} is {what}", f"pip uninstall -y torch && {INSTALL_XPU_TORCH}")
    return None


def _device_problem(data: dict[str, Any]) -> Verdict | None:
    torch = data["torch"]
    if torch["xpu"]["device_count"] == 0:
        why, fix = _no_device(data)
        return _not_usable(f"torch {torch['version']} is an XPU build but sees no Intel GPU: {why}", fix)
    broken = [d for d in torch["devices"] if "error" in d]
    if broken:
        return _not_usable(f"xpu:{broken[0]['index']} cannot be queried ({broken[0]['error']})",
                           f"check the Intel GPU driver ({DRIVER_GUIDE})")
    return None


def _no_device(data: dict[str, Any]) -> tuple[str, str]:
    """Why an XPU build of torch sees no device, and what to do: the driver, the render group, the selection."""
    install_driver = f"install the Intel GPU driver ({DRIVER_GUIDE}); `clinfo -l` lists the GPU once it works"
    nodes = data.get("gpu_nodes")  # None off Linux
    if nodes is not None and not nodes["render_nodes"] and not nodes["wsl"]:
        return "this machine has no GPU render node (/dev/dri/renderD*), so no Intel GPU driver", install_driver
    if nodes is not None and nodes["render_nodes"] and not any(n["accessible"] for n in nodes["render_nodes"]):
        node = nodes["render_nodes"][0]
        group = node["group"] or "render"
        return (f"this user may not open {node['path']} (group {group})",
                f"sudo usermod -aG {group} $USER, then log in again")
    for name in ("ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR"):
        if data["env"].get(name) is not None:
            return f"{name}={data['env'][name]!r} selects no device", f"unset {name}"
    return "the Level Zero runtime finds no device (the driver or its compute runtime)", install_driver


def _lightning_verdict(data: dict[str, Any]) -> Verdict:
    installed = [row for row in data["lightning"] if row["installed"]]
    if not installed:
        return _not_usable("Lightning is not installed", BUILD_INSTALL)
    unpatched = [row for row in installed if row["series_version"] is None]
    if unpatched:
        names = ", ".join(f"{row['root']} {row['version']}" for row in unpatched)
        return _not_usable(f"{names} {'is' if len(unpatched) == 1 else 'are'} installed without the XPU patches",
                           BUILD_INSTALL)
    versions = sorted({row["version"] for row in installed})
    devices = data["torch"]["devices"]
    names = ", ".join(sorted({d["name"] for d in devices}))
    shim = data["shim_series_version"]
    stale = [row for row in installed if shim is not None and row["series_version"] != shim]
    note = (f"; note: this tool's series is version {shim}, `{BUILD_INSTALL}` installs it" if stale else "")
    if data["emulator"]:
        return Verdict(EMULATED, f"Lightning {', '.join(versions)} runs on {len(devices)} EMULATED XPU(s) "
                                 f"({EMULATOR_VAR}={data['env'].get(EMULATOR_VAR)}), not on an Intel GPU{note}")
    return Verdict(USABLE, f"Lightning {', '.join(versions)} runs on {len(devices)} Intel GPU(s): {names}{note}")
