"""``lightning-xpu doctor``: one readable report of what matters for Lightning on an Intel GPU machine.

Querying device names and memory initialises the XPU runtime, so it is done only when devices exist;
availability and the device count use torch's fork-safe discovery. Works on CPU-only torch builds.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

ENV_VARS = ("ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR", "ZE_FLAT_DEVICE_HIERARCHY", "LIGHTNING_XPU_EMULATOR")
LIGHTNING_ROOTS = {"lightning": "lightning", "pytorch_lightning": "pytorch-lightning",
                   "lightning_fabric": "lightning-fabric"}


def _emulator_state() -> bool | None:
    """True/False when the emulator package exists, None when this install has no emulator."""
    try:
        from lightning_xpu import emulator
    except ImportError:
        return None
    return bool(emulator.is_enabled())


def torch_report() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"installed": False}
    except Exception as err:  # noqa: BLE001 - e.g. the emulator refusing this torch build: report it, don't die
        return {"installed": True, "import_error": f"{type(err).__name__}: {err}"}
    report: dict[str, Any] = {
        "installed": True,
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "xpu_build": getattr(torch.version, "xpu", None),
        "git": getattr(torch.version, "git_version", None),
    }
    xpu = getattr(torch, "xpu", None)
    compiled = bool(xpu is not None and getattr(xpu, "_is_compiled", lambda: False)())
    count = xpu.device_count() if xpu is not None else 0
    report["xpu"] = {"module": xpu is not None, "compiled": compiled, "available": count > 0, "device_count": count}
    devices = []
    for index in range(count):  # initialises the runtime: only reached when there are devices
        try:
            props = xpu.get_device_properties(index)
            devices.append({"index": index, "name": props.name, "total_memory": int(props.total_memory)})
        except Exception as err:  # noqa: BLE001 - a report must not die on one bad device
            devices.append({"index": index, "error": str(err)})
    report["devices"] = devices
    try:
        import torch.distributed as dist

        report["distributed"] = dist.is_available()
        report["xccl"] = bool(dist.is_available() and getattr(dist, "is_xccl_available", lambda: False)())
        report["xpu_default_backend"] = (
            dist.Backend.default_device_backend_map.get("xpu") if dist.is_available() else None)
    except ImportError:
        report["distributed"] = False
        report["xccl"] = False
    return report


def gpu_node_report() -> dict[str, Any] | None:
    """The GPU render nodes Level Zero opens and whether this user may open them; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import grp  # Unix only

    nodes = []
    for path in sorted(glob.glob("/dev/dri/renderD*")):
        try:
            group = grp.getgrgid(os.stat(path).st_gid).gr_name
        except (KeyError, OSError):
            group = None
        nodes.append({"path": path, "group": group, "accessible": os.access(path, os.R_OK | os.W_OK)})
    return {"render_nodes": nodes, "wsl": os.path.exists("/dev/dxg")}


def _site_manifest(root: Path) -> dict[str, Any] | None:
    manifest = root.parent / ".lightning-xpu-backup" / "manifest.json"
    if manifest.is_file():
        return json.loads(manifest.read_text(encoding="utf-8"))
    return None


def lightning_report() -> list[dict[str, Any]]:
    rows = []
    for root_name, dist_name in LIGHTNING_ROOTS.items():
        spec = importlib.util.find_spec(root_name)
        if spec is None or not spec.submodule_search_locations:
            rows.append({"root": root_name, "installed": False})
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        version_file = root / "version.info"
        version = version_file.read_text(encoding="utf-8").strip() if version_file.is_file() else None
        try:
            dist_version = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            dist_version = None
        in_place = _site_manifest(root)
        series_version = None
        if version and "+xpu." in version:
            series_version = int(version.rsplit("+xpu.", 1)[1])
        rows.append({"root": root_name, "installed": True, "path": str(root), "version": version,
                     "distribution": dist_name, "distribution_version": dist_version,
                     "series_version": series_version, "patched_in_place": in_place is not None})
    return rows


def shim_series_version() -> int | None:
    try:
        from lightning_xpu.series import find_series_dir, load_series

        return load_series(find_series_dir()).version
    except Exception:  # noqa: BLE001 - reported as unknown
        return None


def collect() -> dict[str, Any]:
    return {
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "torch": torch_report(),
        "gpu_nodes": gpu_node_report(),
        "emulator": _emulator_state(),
        "ccl_bindings": importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None,
        "lightning": lightning_report(),
        "shim_series_version": shim_series_version(),
        "env": {name: os.environ.get(name) for name in ENV_VARS},
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def format_report(data: dict[str, Any]) -> str:
    """Render ``collect()`` as aligned text."""
    lines: list[tuple[str, str]] = [("python", data["python"]), ("platform", data["platform"])]
    torch = data["torch"]
    if not torch["installed"]:
        lines.append(("torch", "NOT INSTALLED"))
    elif "import_error" in torch:
        lines.append(("torch", f"IMPORT FAILED: {torch['import_error']}"))
    else:
        build = ", ".join(f"{k} {torch[k]}" for k in ("cuda", "xpu_build") if torch[k]) or "CPU only"
        lines.append(("torch", f"{torch['version']} ({build})"))
        xpu = torch["xpu"]
        emulated = " (EMULATED by lightning_xpu.emulator)" if data["emulator"] else ""
        lines.append(("torch.xpu", f"compiled: {_yn(xpu['compiled'])}, available: {_yn(xpu['available'])}, "
                                   f"devices: {xpu['device_count']}{emulated}"))
        for dev in torch["devices"]:
            detail = dev.get("error") or f"{dev['name']}, {_gib(dev['total_memory'])}"
            lines.append((f"  xpu:{dev['index']}", detail + (" [emulated]" if data["emulator"] else "")))
        lines.append(("xccl", f"{_yn(torch.get('xccl'))} (default xpu backend: {torch.get('xpu_default_backend')})"))
    nodes = data.get("gpu_nodes")
    if nodes is not None:
        listed = ", ".join(f"{n['path']} (group {n['group']}, {'accessible' if n['accessible'] else 'NOT accessible'})"
                           for n in nodes["render_nodes"]) or "none"
        lines.append(("GPU render nodes", listed + (" (WSL: /dev/dxg)" if nodes["wsl"] else "")))
    lines.append(("ccl (oneCCL bindings)", "installed" if data["ccl_bindings"] else "not installed"))
    emulator = {None: "not part of this install", True: "ON (XPU devices are emulated)", False: "off"}
    lines.append(("emulator", emulator[data["emulator"]]))
    shim = data["shim_series_version"]
    for row in data["lightning"]:
        if not row["installed"]:
            lines.append((row["root"], "not installed"))
            continue
        if row["patched_in_place"]:
            state = f"patched in place, series version {row['series_version']}"
        elif row["series_version"] is not None:
            state = f"patched wheel, series version {row['series_version']}"
        else:
            state = "NOT patched"
        if row["series_version"] is not None and shim is not None and row["series_version"] != shim:
            state += f"; this shim's series is version {shim}"
        lines.append((row["root"], f"{row['version']} [{state}] {row['path']}"))
    lines.append(("series (this shim)", "unknown" if shim is None else f"version {shim}"))
    for name, value in data["env"].items():
        lines.append((name, "(unset)" if value is None else repr(value)))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)


def _yn(flag: object) -> str:
    return "yes" if flag else "no"
