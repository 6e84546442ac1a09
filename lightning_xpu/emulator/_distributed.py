"""The "xccl" and legacy "ccl" process-group backends on emulated XPUs (gloo on host views, see csrc/xccl.cpp).

``dist.is_xccl_available()`` becomes true and ``init_process_group("xccl")`` builds this backend where an XPU build
of torch builds ``ProcessGroupXCCL``; ``"ccl"`` is registered the way ``oneccl_bindings_for_pytorch`` does it.
Each process owns one emulated device (``torch.xpu.set_device(local_rank)``), exactly as on real hardware.
"""

from __future__ import annotations

import datetime
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
            timeout = getattr(options, "_timeout", None) or datetime.timedelta(minutes=30)
            super().__init__(dist.ProcessGroupGloo(store, rank, size, timeout), rank, size)

    ProcessGroupXCCL.__module__ = "torch.distributed.distributed_c10d"
    c10d.ProcessGroupXCCL = ProcessGroupXCCL
    c10d._XCCL_AVAILABLE = True
    if "ProcessGroupXCCL" not in c10d.__all__:
        c10d.__all__.append("ProcessGroupXCCL")
    dist.ProcessGroupXCCL = ProcessGroupXCCL

    def create_ccl(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
        options = ProcessGroupXCCL.Options()
        options._timeout = timeout
        return ProcessGroupXCCL(store, rank, size, options)

    if "CCL" not in dist.Backend._plugins:
        # as oneccl_bindings_for_pytorch registers it
        dist.Backend.register_backend("ccl", create_ccl, devices=["xpu"])
