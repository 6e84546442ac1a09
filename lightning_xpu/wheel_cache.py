"""Built wheels kept by what they were built from, so that building an unchanged series again copies them.

A build is keyed by the series (order and bytes of every patch), the base sdists' sha256, this shim's own code (it
applies, mirrors and stamps), the setuptools and wheel versions and the Python version. The wheels live in
``$LIGHTNING_XPU_CACHE/wheels/KEY/`` beside the downloaded sdists; a key's directory is moved into place whole, so
processes building the same series at once never see it half-written.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from lightning_xpu.base import Base
from lightning_xpu.series import Series

_SHIM = Path(__file__).parent


def build_key(series: Series, base: Base) -> str:
    """The cache key of building ``series`` onto ``base`` with this shim, setuptools and Python."""
    digest = hashlib.sha256(series.digest.encode())
    for sdist in base.sdists:
        digest.update(sdist.sha256.encode())
    for source in sorted(_SHIM.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    for dist in ("setuptools", "wheel"):
        digest.update(importlib.metadata.version(dist).encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()[:24]


def cached_wheels(cache: Path, key: str, prefixes: Sequence[str]) -> list[Path] | None:
    """The wheels stored under ``key``, one per file name prefix (in that order), or None if any is missing."""
    folder = cache / "wheels" / key
    found = []
    for prefix in prefixes:
        matches = sorted(folder.glob(f"{prefix}*.whl"))
        if len(matches) != 1:
            return None
        found.append(matches[0])
    return found


def store_wheels(cache: Path, key: str, wheels: Sequence[Path]) -> None:
    """Copy ``wheels`` under ``key``; where another process stored them first, keep those."""
    folder = cache / "wheels" / key
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
    try:
        for wheel in wheels:
            shutil.copy2(wheel, partial / wheel.name)
        os.replace(partial, folder)
    except OSError:
        if not folder.is_dir():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
