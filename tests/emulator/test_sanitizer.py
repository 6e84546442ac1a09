"""The stream sanitizer (on unless LIGHTNING_XPU_EMULATOR_SANITIZER=0): accesses that are not ordered across streams
fail, as they race on an Intel GPU."""

from __future__ import annotations

import pytest

# Each step keeps its tensors in `keep` until the device synchronized, so that freeing them is no hazard of its own.
RUN_STEPS = """
import torch

keep = []

def run(name, step):
    try:
        step()
        print(name, "ok")
    except RuntimeError as e:
        print(name, str(e).splitlines()[0])
    torch.xpu.synchronize()
    keep.clear()
"""


SANITIZER = {"LIGHTNING_XPU_EMULATOR_SANITIZER": "1"}


def _results(out: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in out.splitlines())


def test_cross_stream_accesses_need_a_wait(run_emulated):
    out = run_emulated(
        RUN_STEPS
        + """
side = torch.xpu.Stream()

def read_without_wait():
    x = torch.ones(4, device="xpu")
    side.wait_stream(torch.xpu.current_stream())
    with torch.xpu.stream(side):
        y = x * 2
    keep.extend([x, y])
    y + 1  # the default stream reads what the side stream wrote

def read_after_wait_stream():
    x = torch.ones(4, device="xpu")
    side.wait_stream(torch.xpu.current_stream())
    with torch.xpu.stream(side):
        y = x * 2
    keep.extend([x, y])
    torch.xpu.current_stream().wait_stream(side)
    assert (y + 1).tolist() == [3.0] * 4

def read_after_event_wait():
    x = torch.ones(4, device="xpu")
    side.wait_stream(torch.xpu.current_stream())
    with torch.xpu.stream(side):
        y = x * 2
        done = torch.xpu.Event()
        done.record()
    keep.extend([x, y])
    done.wait()
    assert (y + 1).tolist() == [3.0] * 4

def read_after_host_sync():
    x = torch.ones(4, device="xpu")
    torch.xpu.synchronize()
    with torch.xpu.stream(side):
        y = x * 2
    side.synchronize()
    keep.extend([x, y])
    assert (y + 1).tolist() == [3.0] * 4

def side_stream_reads_unwaited_input():
    x = torch.ones(4, device="xpu") * 3  # written on the default stream
    keep.append(x)
    with torch.xpu.stream(side):
        x + 1

def write_while_another_stream_reads():
    x = torch.ones(4, device="xpu")
    side.wait_stream(torch.xpu.current_stream())
    with torch.xpu.stream(side):
        y = x * 2
    keep.extend([x, y])
    x.add_(1)  # the default stream overwrites what the side stream may still read

run("read_without_wait", read_without_wait)
run("read_after_wait_stream", read_after_wait_stream)
run("read_after_event_wait", read_after_event_wait)
run("read_after_host_sync", read_after_host_sync)
run("side_stream_reads_unwaited_input", side_stream_reads_unwaited_input)
run("write_while_another_stream_reads", write_while_another_stream_reads)
""",
        env=SANITIZER,
    )
    results = _results(out)
    assert results["read_without_wait"].startswith("XPU stream sanitizer: aten::add")
    assert "reads memory that stream" in results["read_without_wait"]
    assert "wait_stream" in results["read_without_wait"]
    assert results["read_after_wait_stream"] == "ok"
    assert results["read_after_event_wait"] == "ok"
    assert results["read_after_host_sync"] == "ok"
    assert "reads memory that the default stream writes" in results["side_stream_reads_unwaited_input"]
    assert results["write_while_another_stream_reads"].startswith("XPU stream sanitizer: aten::add_")
    assert "writes memory that stream" in results["write_while_another_stream_reads"]


def test_a_free_while_another_stream_uses_the_memory_needs_record_stream(run_emulated):
    out = run_emulated(
        RUN_STEPS
        + """
side = torch.xpu.Stream()

def side_stream_reads(x):
    side.wait_stream(torch.xpu.current_stream())
    with torch.xpu.stream(side):
        y = x * 2
    keep.append(y)

def free_without_record_stream():
    x = torch.ones(1024, device="xpu")
    side_stream_reads(x)
    del x  # back to the default stream's pool while the side stream may still read it
    torch.empty(1024, device="xpu")  # the default stream's next allocation may be that block

def free_after_record_stream():
    x = torch.ones(1024, device="xpu")
    side_stream_reads(x)
    x.record_stream(side)
    del x
    torch.empty(1024, device="xpu")

def free_after_wait_stream():
    x = torch.ones(1024, device="xpu")
    side_stream_reads(x)
    torch.xpu.current_stream().wait_stream(side)
    del x
    torch.empty(1024, device="xpu")

def wait_after_free_before_reuse():
    x = torch.ones(1024, device="xpu")
    side_stream_reads(x)
    del x
    torch.xpu.current_stream().wait_stream(side)  # ordered before the next allocation: no race on hardware
    torch.empty(1024, device="xpu")

def free_after_host_sync():
    x = torch.ones(1024, device="xpu")
    side_stream_reads(x)
    side.synchronize()
    del x
    torch.empty(1024, device="xpu")

run("free_without_record_stream", free_without_record_stream)
run("free_after_record_stream", free_after_record_stream)
run("free_after_wait_stream", free_after_wait_stream)
run("wait_after_free_before_reuse", wait_after_free_before_reuse)
run("free_after_host_sync", free_after_host_sync)
""",
        env=SANITIZER,
    )
    results = _results(out)
    without = results["free_without_record_stream"]
    expected = "XPU stream sanitizer: a tensor allocated on the default stream of xpu:0 was freed while stream"
    assert without.startswith(expected), without
    assert "record_stream(other_stream)" in without
    for name in ("free_after_record_stream", "free_after_wait_stream", "wait_after_free_before_reuse",
                 "free_after_host_sync"):
        assert results[name] == "ok", (name, results[name])


def test_async_collective_buffers_need_work_wait(run_emulated, tmp_path):
    out = run_emulated(
        RUN_STEPS
        + f"""
import torch.distributed as dist
dist.init_process_group("xccl", init_method="file://{tmp_path / "store"}", rank=0, world_size=1)

def write_before_wait():
    x = torch.ones(4, device="xpu")
    work = dist.all_reduce(x, async_op=True)
    keep.extend([x, work])
    x.mul_(2)  # on hardware the collective may still be writing x

def read_before_wait():
    x = torch.ones(4, device="xpu")
    work = dist.all_reduce(x, async_op=True)
    keep.extend([x, work])
    x + 1

def after_wait():
    x = torch.ones(4, device="xpu")
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    x.mul_(2)
    assert x.tolist() == [2.0] * 4

run("write_before_wait", write_before_wait)
run("read_before_wait", read_before_wait)
run("after_wait", after_wait)
dist.destroy_process_group()
""",
        env=SANITIZER,
    )
    results = _results(out)
    for name in ("write_before_wait", "read_before_wait"):
        assert results[name].startswith("XPU stream sanitizer: aten::"), results[name]
        assert "XCCL's stream (an async collective)" in results[name]
        assert "work.wait()" in results[name]
    assert results["after_wait"] == "ok"


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, "race"), (SANITIZER, "race"), ({"LIGHTNING_XPU_EMULATOR_SANITIZER": "0"}, "ok"),
     ({"LIGHTNING_XPU_EMULATOR_SYNC": "1"}, "ok")],
)
def test_sanitizer_switch(run_emulated, env, expected):
    out = run_emulated(
        RUN_STEPS
        + """
side = torch.xpu.Stream()
x = torch.ones(4, device="xpu")
side.wait_stream(torch.xpu.current_stream())
with torch.xpu.stream(side):
    y = x * 2
run("race", lambda: y + 1)
torch.xpu.synchronize()
""",
        env=env,
    )
    result = _results(out)["race"]
    assert result == "ok" if expected == "ok" else result.startswith("XPU stream sanitizer")
