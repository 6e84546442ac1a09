"""The asynchronous device: what the host may read, and when, as on an Intel GPU."""

from __future__ import annotations

import json

import pytest

_READ_TOO_EARLY = """
import json, torch
x = torch.arange(4.0, device="xpu")
i = torch.arange(3, device="xpu")
y = x.to("cpu", non_blocking=True)
j = i.to("cpu", non_blocking=True)
stream, event = torch.xpu.current_stream(), torch.xpu.Event()
event.record()
early = [y.isnan().tolist(), j.tolist(), stream.query(), event.query()]
x.add_(100)                         # enqueued after the copy: the copy still delivers 0, 1, 2, 3
{sync}
print(json.dumps({{"early": early, "late": [y.tolist(), j.tolist(), stream.query(), event.query()]}}))
"""


@pytest.mark.parametrize(
    ("sync", "stream_done"),
    [
        ("torch.xpu.synchronize()", True),
        ("stream.synchronize()", True),
        ("event.synchronize()", False),  # completes the stream up to the event only, not the add_ after it
        ("torch.accelerator.synchronize()", True),
        ("x.cpu()", True),  # a blocking copy on the same stream
        ("x.sum().item()", True),
    ],
)
def test_non_blocking_copy_is_poison_until_the_stream_completes(run_emulated, sync, stream_done):
    r = json.loads(run_emulated(_READ_TOO_EARLY.format(sync=sync)))
    assert r["early"] == [[True] * 4, [-1, -1, -1], False, False]
    assert r["late"] == [[0.0, 1.0, 2.0, 3.0], [0, 1, 2], stream_done, True]


def test_streams_complete_on_their_own(run_emulated):
    out = run_emulated(
        """
        import json, torch
        side = torch.xpu.Stream()
        x = torch.ones(2, device="xpu")
        side.wait_stream(torch.xpu.current_stream())      # x is written on the default stream
        with torch.xpu.stream(side):
            y = x.to("cpu", non_blocking=True)
        torch.xpu.current_stream().synchronize()          # another stream: the copy is still in flight
        r = [y.isnan().all().item()]
        torch.xpu.current_stream().wait_stream(side)
        torch.xpu.current_stream().synchronize()          # now it waited for the side stream
        r.append(y.tolist())
        other = torch.ones(1, device="xpu:1").to("cpu", non_blocking=True)
        torch.xpu.synchronize(0)                          # device 0 only
        r.append(other.isnan().item())
        torch.xpu.synchronize(1)
        r.append(other.tolist())
        idle = torch.xpu.Event()
        idle.record()                                     # nothing enqueued since the last synchronize
        r.append(idle.query())
        print(json.dumps(r))
        """
    )
    assert json.loads(out) == [True, [1.0, 1.0], True, [1.0], True]


def test_sync_switch_makes_every_copy_complete_on_return(run_emulated):
    out = run_emulated(
        """
        import json, torch
        y = torch.arange(3.0, device="xpu").to("cpu", non_blocking=True)
        e = torch.xpu.Event(); e.record()
        print(json.dumps([y.tolist(), e.query(), torch.xpu.current_stream().query()]))
        """,
        env={"LIGHTNING_XPU_EMULATOR_SYNC": "1"},
    )
    assert json.loads(out) == [[0.0, 1.0, 2.0], True, True]


def test_elapsed_time_needs_completed_events(run_emulated):
    out = run_emulated(
        """
        import torch
        a, b = torch.xpu.Event(enable_timing=True), torch.xpu.Event(enable_timing=True)
        a.record(); torch.ones(8, device="xpu").mul_(2); b.record()
        try:
            a.elapsed_time(b)
            print("measured")
        except RuntimeError as e:
            print(e)
        b.synchronize()
        print(a.elapsed_time(b) >= 0)
        """
    )
    early, late = out.splitlines()
    assert early.startswith("Both events must be completed before calculating elapsed time.")
    assert late == "True"
