"""Build the three drop-in wheels ``lightning``, ``pytorch-lightning`` and ``lightning-fabric`` at ``2.6.6+xpu.N``."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lightning_xpu.apply import apply_to_tree
from lightning_xpu.base import LIGHTNING, Base, base_trees, cache_dir
from lightning_xpu.errors import ToolError
from lightning_xpu.mirror import mirror_into_standalone
from lightning_xpu.series import Series
from lightning_xpu.wheel_cache import build_key, cached_wheels, store_wheels

# The wheel file name prefix of each distribution.
WHEEL_PREFIX = {
    "lightning": "lightning", "pytorch-lightning": "pytorch_lightning", "lightning-fabric": "lightning_fabric"
}


def patched_version(base: Base, series: Series) -> str:
    """PEP 440 version of the patched distributions, e.g. ``2.6.6+xpu.3``."""
    return f"{base.version}+{series.local_version}"


@dataclass(frozen=True)
class PatchedTrees:
    """Patched, version-stamped source trees of the three distributions, keyed by distribution name."""

    trees: dict[str, Path]
    version: str


def prepare_trees(series: Series, base: Base, work: Path, cache: Path | None = None) -> PatchedTrees:
    """Copy the pristine sdists into ``work``, apply the series to lightning and mirror it into the other two."""
    pristine = base_trees(base, cache)
    trees = {}
    for name, tree in pristine.items():
        trees[name] = work / tree.name
        shutil.copytree(tree, trees[name], symlinks=True)
    apply_to_tree(series, trees[LIGHTNING])
    mirror_into_standalone(pristine[LIGHTNING], trees[LIGHTNING], trees)
    version = patched_version(base, series)
    for tree in trees.values():
        stamp_version(tree, version)
    return PatchedTrees(trees, version)


def stamp_version(tree: Path, version: str) -> None:
    """Write ``version`` into ``src/version.info`` and each package's ``version.info``, as setup.py would."""
    (tree / "src" / "version.info").write_text(version + "\n", encoding="utf-8")
    for version_py in (tree / "src").glob("*/__version__.py"):
        (version_py.parent / "version.info").write_text(version + "\n", encoding="utf-8")


def build_wheel(tree: Path, dist: Path) -> Path:
    """Build one wheel from a source tree with the current environment's setuptools (no build isolation)."""
    env = dict(os.environ)
    env.pop("PACKAGE_NAME", None)  # upstream's setup.py switches packages on it
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-wheel-") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
             "--disable-pip-version-check", "--quiet", "-w", out, str(tree)],
            capture_output=True, text=True, env=env,
        )
        wheels = list(Path(out).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            lines = (proc.stderr + proc.stdout).strip().splitlines()
            raise ToolError(f"building a wheel from {tree.name} failed: {lines[-1] if lines else 'no output'}")
        dist.mkdir(parents=True, exist_ok=True)
        target = dist / wheels[0].name
        os.replace(wheels[0], target) if _same_fs(Path(out), dist) else shutil.move(wheels[0], target)
        return target


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


def _check_build_requirements() -> None:
    for module in ("setuptools", "wheel", "packaging"):
        try:
            importlib.metadata.version(module)
        except importlib.metadata.PackageNotFoundError:
            raise ToolError(
                f"building needs {module} in this environment; run `pip install setuptools wheel packaging`"
            ) from None


def build(series: Series, base: Base, dist: Path, cache: Path | None = None, reuse: bool = True) -> list[Path]:
    """Build the three patched wheels into ``dist`` and return their paths (lightning first).

    With ``reuse``, wheels built earlier from the same series, base and shim (``wheel_cache``) are copied instead.
    """
    _check_build_requirements()
    dist = Path(dist).resolve()
    cache = cache or cache_dir()
    names = [sd.name for sd in base.sdists]
    prefixes = [f"{WHEEL_PREFIX[name]}-{patched_version(base, series)}-" for name in names]
    key = build_key(series, base)
    stored = cached_wheels(cache, key, prefixes) if reuse else None
    if stored is not None:
        print(f"Reusing the wheels built from this series and base ({stored[0].parent}; --rebuild builds them "
              "again).", file=sys.stderr)
        dist.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copy2(wheel, dist / wheel.name)) for wheel in stored]
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-build-") as tmp:
        prepared = prepare_trees(series, base, Path(tmp), cache)
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            wheels = list(pool.map(lambda n: build_wheel(prepared.trees[n], dist), names))
    for wheel, name, expected in zip(wheels, names, prefixes, strict=True):
        if not wheel.name.startswith(expected):
            raise ToolError(f"the {name} build produced {wheel.name}, expected a wheel named {expected}*")
    store_wheels(cache, key, wheels)
    return wheels


def install(wheels: list[Path]) -> None:
    """Install the wheels into this environment, keeping the installed torch exactly as it is."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise ToolError("torch is not installed here; install the torch build for your device first (Intel GPUs: "
                        "pip install torch --index-url https://download.pytorch.org/whl/xpu), so that pip does not "
                        "pick one for you") from None
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-install-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(f"torch=={torch_version}\n", encoding="utf-8")
        pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
        # First the dependencies (torch pinned to the installed build), then our wheels even if pip
        # believes the same version is already installed: an edited series keeps its N.
        for args in (["-c", str(constraints)], ["--force-reinstall", "--no-deps"]):
            proc = subprocess.run([*pip, *args, *map(str, wheels)], capture_output=True, text=True)
            if proc.returncode != 0:
                lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.startswith("ERROR")]
                raise ToolError(f"pip could not install the patched wheels: {lines[0] if lines else proc.returncode}")
