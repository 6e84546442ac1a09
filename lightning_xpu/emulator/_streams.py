"""``torch.xpu.Stream`` / ``torch.xpu.Event`` for the emulated devices.

A CPU build defines them over dummy base classes; these derive from the generic ``torch.Stream`` /
``torch.Event``, which work through the emulator's device guard: queries, synchronisation and waits follow the
asynchronous device model of csrc/queues.cpp, and events carry host timestamps (``elapsed_time`` measures host
time between completed events).
"""

from __future__ import annotations

from typing import Any


def make_stream_classes(torch: Any) -> tuple[type, type]:
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
            return 0x5EC0_0000 + self.device_index * 0x10000 + self.stream_id

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
            import ctypes

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
            # torch.Event.elapsed_time accepts only exact torch.Event objects: keep one for timing.
            self._timing = torch.Event(device="xpu", enable_timing=True) if enable_timing else None
            return self

        def record(self, stream: Any = None) -> None:
            stream = torch.xpu.current_stream() if stream is None else stream
            super().record(stream)
            if self._timing is not None:
                self._timing.record(stream)

        def elapsed_time(self, end_event: Any) -> float:
            if self._timing is None or getattr(end_event, "_timing", None) is None:
                raise RuntimeError("Both events must be created with enable_timing=True to measure elapsed time.")
            return self._timing.elapsed_time(end_event._timing)

        def wait(self, stream: Any = None) -> None:
            super().wait(torch.xpu.current_stream() if stream is None else stream)

        @property
        def sycl_event(self) -> int:
            return self.event_id

        def __repr__(self) -> str:
            return f"torch.xpu.Event(sycl_event={self.event_id:#x}) (emulated)"

    Stream.__name__ = Stream.__qualname__ = "Stream"
    Stream.__module__ = "torch.xpu.streams"
    Event.__name__ = Event.__qualname__ = "Event"
    Event.__module__ = "torch.xpu.streams"
    return Stream, Event
