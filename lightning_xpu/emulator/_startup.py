"""Interpreter start-up hook: enable the emulator right after ``import torch`` when LIGHTNING_XPU_EMULATOR is set.

``lightning_xpu_emulator.pth`` (installed into site-packages) imports this module only when the variable is set,
so that every Python process started under it (spawned and subprocess DDP workers, pytest-xdist workers) sees the
emulated devices before anything touches ``torch.xpu``. Nothing here imports torch: a one-shot import hook waits
for ``import torch`` to finish and then calls :func:`lightning_xpu.emulator.enable`.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


def _enable_after_torch_import() -> None:
    from lightning_xpu import emulator

    emulator.enable()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds module ``name`` through the other finders and calls ``then()`` right after its module body ran."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then(module: Any) -> None:
            exec_module(module)
            self.then()

        spec.loader.exec_module = exec_then  # type: ignore[method-assign]
        return spec


def run_after_import(name: str, then: Callable[[], None]) -> None:
    """Call ``then()`` once module ``name`` is imported: now if it already is, else right after its body runs."""
    if name in sys.modules:
        then()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


def install() -> None:
    """Arrange for the emulator to be enabled once torch is imported (now, if it already is).

    The settings are validated by :func:`lightning_xpu.emulator.enable`, so a bad value fails ``import torch``
    loudly instead of being reported and skipped by the ``.pth`` processing at start-up.
    """
    import os

    if os.environ.get("LIGHTNING_XPU_EMULATOR", "").strip() in ("", "0"):
        return
    run_after_import("torch", _enable_after_torch_import)
