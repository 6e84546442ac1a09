"""The "xccl" and legacy "ccl" process-group backends on emulated XPUs (gloo on host views, see csrc/xccl.cpp).

``dist.is_xccl_available()`` becomes true and ``init_process_group("xccl")`` builds this backend where an XPU build
of torch builds ``ProcessGroupXCCL``. ``"ccl"`` exists, as on an XPU machine, only once
``import oneccl_bindings_for_pytorch`` registered it: with ``LIGHTNING_XPU_EMULATOR_ONECCL=1`` the emulator provides
that module (registering ``"ccl"`` on import, nothing else); without it the import fails as where the bindings are not
installed. Each process owns one emulated device (``torch.xpu.set_device(local_rank)``), exactly as on real hardware.
"""

from __future__ import annotations

import datetime
import importlib.abc
import importlib.machinery
import os
import sys
import weakref
from types import ModuleType
from typing import Any

from lightning_xpu.emulator import _runtime


def install() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    import torch.distributed.distributed_c10d as c10d

    base = _runtime.native().XcclBackend

    class ProcessGroupXCCL(base):  # type: ignore[misc, valid-type]
        """Stands in for ``torch._C._distributed_c10d.ProcessGroupXCCL`` (emulated: gloo on host memory)."""

        class Options:
            def __init__(self, is_high_priority_stream: bool = False) -> None:
                self.global_ranks_in_group: list[int] = []
                self.group_name = ""
                self._timeout: datetime.timedelta | None = None
                self.is_high_priority_stream = is_high_priority_stream

        def __init__(self, store: Any, rank: int, size: int, options: Any = None) -> None:
            options = ProcessGroupXCCL.Options() if options is None else options
            if getattr(options, "_timeout", None) is None:
                options._timeout = datetime.timedelta(minutes=30)
            super().__init__(dist.ProcessGroupGloo(store, rank, size, options._timeout), rank, size)
            self.options = options  # ProcessGroupXCCL.options: the Options it was built with, as in C++

    ProcessGroupXCCL.__module__ = "torch.distributed.distributed_c10d"
    ProcessGroupXCCL.__qualname__ = "ProcessGroupXCCL"
    _keep_backends_alive(dist, ProcessGroupXCCL)
    c10d.ProcessGroupXCCL = ProcessGroupXCCL
    c10d._XCCL_AVAILABLE = True
    if "ProcessGroupXCCL" not in c10d.__all__:
        c10d.__all__.append("ProcessGroupXCCL")
    dist.ProcessGroupXCCL = ProcessGroupXCCL

    def create_ccl(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
        options = ProcessGroupXCCL.Options()
        options._timeout = timeout
        return ProcessGroupXCCL(store, rank, size, options)

    def register_ccl() -> None:
        if "CCL" not in dist.Backend._plugins:  # as oneccl_bindings_for_pytorch registers it
            dist.Backend.register_backend("ccl", create_ccl, devices=["xpu"])

    if os.environ.get(ENV_ONECCL, "").strip() not in ("", "0"):
        sys.meta_path.insert(0, _OneCclBindingsFinder(register_ccl))


def _keep_backends_alive(dist: Any, backend_class: type) -> None:
    """Keep each ProcessGroupXCCL's Python object alive as long as the process group it was registered with.

    The real class is C++; the emulated one is a Python subclass of a native backend, and a process group holds only
    its C++ part: once c10d dropped the Python object, ``pg._get_backend(xpu)`` would hand out a bare wrapper of
    the base class (not a ``ProcessGroupXCCL``, no ``options``). Held through a weak reference to the process group,
    the backend still goes with its group (``destroy_process_group``).
    """
    groups: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
    register = dist.ProcessGroup._register_backend

    def _register_backend(self: Any, *args: Any, **kwargs: Any) -> None:
        register(self, *args, **kwargs)
        backends = [a for a in (*args, *kwargs.values()) if isinstance(a, backend_class)]
        if backends:
            groups.setdefault(self, []).extend(backends)

    dist.ProcessGroup._register_backend = _register_backend


ENV_ONECCL = "LIGHTNING_XPU_EMULATOR_ONECCL"
ONECCL_MODULE = "oneccl_bindings_for_pytorch"


class _OneCclBindingsFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Provides an emulated ``oneccl_bindings_for_pytorch`` whose import registers the ``"ccl"`` backend."""

    def __init__(self, register: Any) -> None:
        self._register = register

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != ONECCL_MODULE:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin="lightning_xpu.emulator (emulated)")

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__version__ = "emulated"
        self._register()
