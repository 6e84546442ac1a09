"""``torch.xpu.Stream`` / ``torch.xpu.Event`` for the emulated devices.

A CPU build defines them over dummy base classes; these derive from the generic ``torch.Stream`` /
``torch.Event``, which work through the emulator's device guard: queries, synchronisation and waits follow the
asynchronous device model of csrc/queues.cpp, and events carry host timestamps (``elapsed_time`` measures host
time between completed events).
"""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any


def make_stream_classes(torch: Any, ext: ModuleType) -> tuple[type, type]:
    from torch.xpu._utils import _get_device_index

    class Stream(torch.Stream):
        """An emulated XPU stream (a SYCL queue on real hardware)."""

        def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Any:
            if "stream_id" in kwargs and "device_index" in kwargs:
                return super().__new__(cls, **kwargs)
            index = _get_device_index(device, optional=True)
            return super().__new__(cls, device=torch.device("xpu", index), priority=priority)

        @property
        def sycl_queue(self) -> int:
            return ext.sycl_queue(self.device_index, self.stream_id)

        @property
        def priority(self) -> int:
            return ext.stream_priority(self.device_index, self.stream_id)

        @staticmethod
        def priority_range() -> tuple[int, int]:
            """(lowest, highest) priority, as c10::xpu::XPUStream::priority_range(): low 1, normal 0, high -1."""
            return 1, -1

        def wait_event(self, event: Any) -> None:
            event.wait(self)

        def wait_stream(self, stream: Any) -> None:
            self.wait_event(stream.record_event())

        def record_event(self, event: Any = None) -> Any:
            if event is None:
                event = Event()
            event.record(self)
            return event

        @property
        def _as_parameter_(self) -> Any:
            return ctypes.c_void_p(self.sycl_queue)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, torch.Stream) and super().__eq__(other)

        def __hash__(self) -> int:
            return hash((self.sycl_queue, self.device))

        def __repr__(self) -> str:
            return f"torch.xpu.Stream(device={self.device} sycl_queue={self.sycl_queue:#x}) (emulated)"

    class Event(torch.Event):
        """An emulated XPU event."""

        def __new__(cls, enable_timing: bool = False) -> Any:
            self = super().__new__(cls, device="xpu", enable_timing=enable_timing)
            self._enable_timing = enable_timing  # torch.Event keeps the flag in C++ only
            return self

        def record(self, stream: Any = None) -> None:
            super().record(torch.xpu.current_stream() if stream is None else stream)

        def elapsed_time(self, end_event: Any) -> float:
            if not (self._enable_timing and getattr(end_event, "_enable_timing", False)):
                raise RuntimeError("Both events must be created with enable_timing=True to measure elapsed time.")
            return ext.event_elapsed_time(self.event_id, end_event.event_id)

        def wait(self, stream: Any = None) -> None:
            super().wait(torch.xpu.current_stream() if stream is None else stream)

        @property
        def sycl_event(self) -> int:
            return self.event_id

        @property
        def _as_parameter_(self) -> Any:
            return ctypes.c_void_p(self.sycl_event)

        def __repr__(self) -> str:
            # torch.xpu.Event's own repr, marked as emulated
            if self.sycl_event:
                return f"torch.xpu.Event(sycl_event={self.sycl_event:#x}) (emulated)"
            return "torch.xpu.Event(uninitialized) (emulated)"

    Stream.__name__ = Stream.__qualname__ = "Stream"
    Stream.__module__ = "torch.xpu.streams"
    Event.__name__ = Event.__qualname__ = "Event"
    Event.__module__ = "torch.xpu.streams"
    return Stream, Event
