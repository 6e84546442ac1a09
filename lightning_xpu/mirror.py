"""Standalone distributions via upstream's own mirroring.

The lightning sdist ships ``.actions/assistant.py`` whose ``create_mirror_package`` turns
``src/lightning/{pytorch,fabric}`` into ``src/pytorch_lightning`` and ``src/lightning_fabric`` by rewriting
imports. Run on the patched lightning tree, its output is overlaid onto the unpacked ``pytorch_lightning``
and ``lightning_fabric`` sdists, which keep their own shell files (``__setup__.py``, ``__about__.py``,
``__version__.py``, ``version.info``, ``MANIFEST.in``, ``README.md``, ``py.typed``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import shutil
import tempfile
from pathlib import Path

from lightning_xpu.errors import ToolError

# Upstream's mapping, as in the sdist's setup.py (_PACKAGE_MAPPING).
PACKAGE_MAPPING = {"lightning": "lightning", "pytorch": "pytorch_lightning", "fabric": "lightning_fabric"}
# Which mirrored packages each standalone sdist carries.
STANDALONE_PACKAGES = {
    "pytorch-lightning": ("pytorch_lightning", "lightning_fabric"),
    "lightning-fabric": ("lightning_fabric",),
}
SUBPACKAGE = {"pytorch_lightning": "pytorch", "lightning_fabric": "fabric"}


def _load_assistant(lightning_tree: Path):  # noqa: ANN202 - upstream module
    path = lightning_tree / ".actions" / "assistant.py"
    if not path.is_file():
        raise ToolError(f"{lightning_tree} has no .actions/assistant.py; it is not a lightning sdist tree")
    spec = importlib.util.spec_from_file_location("_lightning_xpu_upstream_assistant", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as err:
        raise ToolError(f"upstream's assistant.py needs {err.name}; install it (pip install packaging)") from None
    return module


def mirror_packages(lightning_tree: Path, out: Path) -> dict[str, Path]:
    """Mirror ``lightning_tree/src/lightning/{pytorch,fabric}`` into ``out/src/{pytorch_lightning,lightning_fabric}``.

    Only the two sub-packages are copied into ``out`` first, so the lightning tree itself is not modified.
    """
    assistant = _load_assistant(lightning_tree)
    src = out / "src"
    for sub in ("pytorch", "fabric"):
        shutil.copytree(lightning_tree / "src" / "lightning" / sub, src / "lightning" / sub,
                        ignore=shutil.ignore_patterns("__pycache__"))
    with contextlib.redirect_stdout(io.StringIO()):  # upstream prints every file it rewrites
        assistant.create_mirror_package(str(src), dict(PACKAGE_MAPPING))
    return {pkg: src / pkg for pkg in SUBPACKAGE}


def relative_files(root: Path) -> set[str]:
    """Files under root as POSIX paths, without bytecode caches."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def overlay(mirrored: Path, package_dir: Path, removed: set[str] = frozenset()) -> None:
    """Copy every mirrored file over ``package_dir`` and delete the files the patches removed."""
    for rel in sorted(relative_files(mirrored)):
        dst = package_dir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(mirrored / rel, dst)
    for rel in removed:
        (package_dir / rel).unlink(missing_ok=True)


def removed_files(pristine_lightning: Path, patched_lightning: Path, package: str) -> set[str]:
    """Files the series deleted from ``src/lightning/<sub>`` for the standalone ``package``."""
    sub = SUBPACKAGE[package]
    before = relative_files(pristine_lightning / "src" / "lightning" / sub)
    after = relative_files(patched_lightning / "src" / "lightning" / sub)
    return before - after


def mirror_into_standalone(pristine_lightning: Path, patched_lightning: Path, trees: dict[str, Path]) -> None:
    """Overlay the mirror of the patched lightning tree onto the standalone sdist trees (modified in place)."""
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-mirror-") as tmp:
        mirrored = mirror_packages(patched_lightning, Path(tmp))
        for dist, packages in STANDALONE_PACKAGES.items():
            for package in packages:
                overlay(mirrored[package], trees[dist] / "src" / package,
                        removed_files(pristine_lightning, patched_lightning, package))

