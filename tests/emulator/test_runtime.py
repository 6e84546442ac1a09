"""The switch, the torch.xpu surface and the failure modes of the emulated runtime."""

from __future__ import annotations

import json

import pytest


def test_switch_off_when_unset(run_emulated):
    out = run_emulated(
        """
        import json, sys, torch
        print(json.dumps([torch.xpu.is_available(), torch.xpu.device_count(), torch._C._has_xpu,
                          "lightning_xpu" in sys.modules, "lightning_xpu_emulator_C" in sys.modules]))
        """,
        devices=None,
    )
    assert json.loads(out) == [False, 0, False, False, False]


def test_done_when_command(run_emulated):
    out = run_emulated("import torch; print(torch.xpu.device_count(), torch.ones(2, device='xpu:1').device)")
    assert out.strip() == "2 xpu:1"


@pytest.mark.parametrize(
    ("profile", "name", "gib", "fp64"),
    [
        (None, "Intel(R) Data Center GPU Max 1550 (emulated)", 64, True),
        ("max1100", "Intel(R) Data Center GPU Max 1100 (emulated)", 48, True),
        ("arc-a770", "Intel(R) Arc(TM) A770 Graphics (emulated)", 16, False),
        ("b580", "Intel(R) Arc(TM) B580 Graphics (emulated)", 12, True),
    ],
)
def test_device_surface(run_emulated, profile, name, gib, fp64):
    out = run_emulated(
        """
        import json, torch
        assert not torch.xpu.is_initialized()          # counting does not initialise
        r = {}
        r["count"] = torch.xpu.device_count()
        r["accel"] = str(torch.accelerator.current_accelerator())
        p = torch.xpu.get_device_properties(1)
        r["name"], r["total"], r["fp64"] = torch.xpu.get_device_name(1), p.total_memory, p.has_fp64
        r["cap_is_dict"] = isinstance(torch.xpu.get_device_capability(0), dict)
        r["init"] = torch.xpu.is_initialized()
        torch.xpu.set_device(1)
        r["current"] = torch.xpu.current_device()
        with torch.xpu.device(0):
            r["inside"] = torch.xpu.current_device()
        r["after"] = torch.xpu.current_device()
        r["bf16"] = torch.xpu.is_bf16_supported()
        torch.xpu.synchronize()
        s = torch.xpu.Stream()
        with torch.xpu.stream(s):
            r["stream_set"] = torch.xpu.current_stream() == s
        r["stream_restored"] = torch.xpu.current_stream() != s
        a, b = torch.xpu.Event(enable_timing=True), torch.xpu.Event(enable_timing=True)
        a.record(); b.record(); b.synchronize()
        r["elapsed"] = a.elapsed_time(b) >= 0
        r["gen_device"] = str(torch.xpu.default_generators[1].device)
        torch.accelerator.set_device_index(0)
        with torch.accelerator.device_index(1):
            r["accel_index"] = [torch.accelerator.current_device_index(), torch.xpu.current_device()]
        torch.accelerator.synchronize()
        r["accel_stream"] = str(torch.accelerator.current_stream().device)
        print(json.dumps(r))
        """,
        profile=profile,
    )
    r = json.loads(out)
    assert r == {
        "count": 2,
        "accel": "xpu",
        "name": name,
        "total": gib * 2**30,
        "fp64": fp64,
        "cap_is_dict": True,
        "init": True,
        "current": 1,
        "inside": 0,
        "after": 1,
        "bf16": True,
        "stream_set": True,
        "stream_restored": True,
        "elapsed": True,
        "gen_device": "xpu:1",
        "accel_index": [1, 1],
        "accel_stream": "xpu:0",
    }


def test_memory_stats_follow_allocations(run_emulated):
    out = run_emulated(
        """
        import json, torch
        torch.xpu.init()
        base = torch.xpu.memory_allocated(0)
        x = torch.empty(1024, 1024, device="xpu:0")           # 4 MiB, large pool
        s = torch.xpu.memory_stats(0)
        grown = torch.xpu.memory_allocated(0) - base
        del x
        after_free = torch.xpu.memory_allocated(0) - base
        peak = torch.xpu.max_memory_allocated(0)
        torch.xpu.reset_peak_memory_stats(0)
        peak_reset = torch.xpu.max_memory_allocated(0)
        y = torch.ones(3, device="xpu:1")                      # other device: not on xpu:0's books
        print(json.dumps([grown, after_free, peak >= 4 * 2**20, peak_reset < 4 * 2**20,
                          s["allocated_bytes.large_pool.current"] >= 4 * 2**20,
                          s["reserved_bytes.all.current"] >= grown,
                          torch.xpu.memory_allocated(1), sorted(k for k in s if k.endswith("all.current"))[:3],
                          torch.xpu.mem_get_info(0)[1], torch.accelerator.memory_allocated(1)]))
        """
    )
    grown, after_free, peak_ok, reset_ok, large_ok, reserved_ok, other, keys, total, accel = json.loads(out)
    assert grown == 4 * 2**20 and after_free == 0
    assert peak_ok and reset_ok and large_ok and reserved_ok
    assert other == 512  # 12 bytes, rounded to the allocator's 512-byte blocks
    assert keys == ["active.all.current", "active_bytes.all.current", "allocated_bytes.all.current"]
    assert total == 64 * 2**30 and accel == 512


def test_out_of_memory_and_out_of_range(run_emulated):
    out = run_emulated(
        """
        import json, torch
        r = []
        try:
            torch.empty(65 * 2**30, dtype=torch.uint8, device="xpu")
        except torch.OutOfMemoryError as e:
            r.append(str(e).split(".")[0])
        torch.xpu.set_per_process_memory_fraction(0.5, 1)
        try:
            torch.empty(33 * 2**30, dtype=torch.uint8, device="xpu:1")
        except torch.OutOfMemoryError:
            r.append("fraction")
        torch.empty(33 * 2**30, dtype=torch.uint8, device="meta")
        for f in (lambda: torch.ones(1, device="xpu:2"), lambda: torch.xpu.set_device(2),
                  lambda: torch.xpu.get_device_properties(5), lambda: torch.accelerator.current_stream(2),
                  lambda: torch.xpu.current_stream(2), lambda: torch.xpu.set_per_process_memory_fraction(-0.1)):
            try:
                f()
                r.append("no error")
            except (RuntimeError, ValueError) as e:
                r.append(f"{type(e).__name__}: {e}")
        print(json.dumps(r))
        """
    )
    r = json.loads(out)
    assert r[0] == "XPU out of memory"
    assert r[1] == "fraction"
    # c10::xpu::check_device_index's message, from every entry point that takes a device (PyTorch's test_xpu.py)
    assert r[2] == "RuntimeError: The device index is out of range. It must be in [0, 2), but got 2."
    assert r[3] == r[2] and r[5] == r[2] and r[6] == r[2]
    assert r[4] == "RuntimeError: The device index is out of range. It must be in [0, 2), but got 5."
    # XPUCachingAllocator::setMemoryFraction's TORCH_CHECK_VALUE
    assert r[7] == "ValueError: invalid fraction:-0.1. Please set within (0, 1]."


def test_fork_after_init_is_poisoned(run_emulated):
    # with pyzes, torch 2.13+ counts devices without initialising the runtime (test_versions.py: without it)
    out = run_emulated(
        """
        import multiprocessing as mp, torch
        def child(q):
            q.put(torch.xpu._is_in_bad_fork())
            try:
                torch.ones(1, device="xpu")
                q.put("no error")
            except RuntimeError as e:
                q.put(str(e))
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,)); p.start(); before = (q.get(), q.get()); p.join()
        torch.ones(1, device="xpu")                               # initialises the device
        p = ctx.Process(target=child, args=(q,)); p.start(); after = (q.get(), q.get()); p.join()
        print(repr((before, after)))
        """,
        env={"LIGHTNING_XPU_EMULATOR_PYZES": "1"},
    )
    before, after = eval(out)
    assert before == (False, "no error")  # counting/availability before init is fork-safe
    assert after[0] is True
    assert after[1].startswith("Cannot re-initialize XPU in forked subprocess")


def test_arc_a770_has_no_fp64(run_emulated):
    out = run_emulated(
        """
        import torch
        x = torch.ones(2, device="xpu")
        d = x.double()                     # conversions work (-fsycl-fp64-conv-emu: see the next test)
        w = torch.nn.Parameter(torch.ones(1, device="xpu"))
        scaler = torch.amp.GradScaler("xpu")
        scaler.scale((w * 2).sum()).backward()
        for step in (lambda: d * 2, lambda: scaler.unscale_(torch.optim.SGD([w], lr=1.0))):
            try:
                step()
                print("computed")
            except RuntimeError as e:
                print(str(e))
        """,
        profile="arc-a770",
    )
    lines = out.splitlines()
    assert lines[0].startswith("Required aspect fp64 is not supported on the device")
    # GradScaler.unscale_ computes 1/scale in fp64, which fails on Arc A-series (pytorch issue #147731)
    assert lines[1].startswith("Required aspect fp64 is not supported on the device")


def test_arc_a770_refuses_fp64_arithmetic_but_converts(run_emulated):
    """Every torch-xpu-ops release 2.8-2.13 builds its DG2 kernels with -fsycl-fp64-conv-emu: conversions to and from
    fp64 run on an A770, arithmetic in fp64 (a dtype argument, an fp64 result) needs the fp64 aspect."""
    out = run_emulated(
        """
        import torch
        x = torch.ones(2, 3, device="xpu")
        steps = {
            "double": lambda: x.double().float().sum().item(),
            "complex128": lambda: x.to(torch.complex128).real.float().sum().item(),
            "sum_dtype": lambda: x.sum(dtype=torch.float64),
            "mean_dtype": lambda: x.mean(dtype=torch.float64),
            "arange": lambda: torch.arange(4, dtype=torch.float64, device="xpu"),
            "cumsum_dtype": lambda: x.cumsum(0, dtype=torch.float64),
        }
        for name, step in steps.items():
            try:
                print(name, step())
            except RuntimeError as e:
                print(name, str(e).splitlines()[0])
        """,
        profile="arc-a770",
    )
    results = dict(line.split(" ", 1) for line in out.splitlines())
    assert results["double"] == "6.0"
    assert results["complex128"] == "6.0"
    for name in ("sum_dtype", "mean_dtype", "arange", "cumsum_dtype"):
        assert results[name].startswith("Required aspect fp64 is not supported on the device"), (name, results[name])


_FP64_STEPS = """
import torch
x = torch.ones(2, 3, device="xpu")
steps = {
    "double": lambda: x.double().float().sum().item(),
    "complex128": lambda: x.to(torch.complex128).real.float().sum().item(),
    "sum_dtype": lambda: x.sum(dtype=torch.float64).float().item(),
    "to_host": lambda: x.to("cpu", torch.float64).sum().item(),          # converted on the host
    "transfers": lambda: torch.ones(3, dtype=torch.float64).to("xpu").cpu().sum().item(),  # memcpys
}
for name, step in steps.items():
    try:
        print(name, step())
    except RuntimeError as e:
        print(name, str(e).splitlines()[0])
"""


@pytest.mark.parametrize("conversion_emulation", ["0", "1"])
def test_fp64_conversions_follow_the_build_flag(run_emulated, conversion_emulation):
    """LIGHTNING_XPU_EMULATOR_FP64_CONV_EMU=0 models a torch-xpu-ops build without -fsycl-fp64-conv-emu: on a device
    without fp64, converting to or from fp64 on the device raises too; transfers convert on the host and still run."""
    out = run_emulated(
        _FP64_STEPS, profile="arc-a770", env={"LIGHTNING_XPU_EMULATOR_FP64_CONV_EMU": conversion_emulation}
    )
    results = dict(line.split(" ", 1) for line in out.splitlines())
    refused = ["sum_dtype"] if conversion_emulation == "1" else ["double", "complex128", "sum_dtype"]
    for name, result in results.items():
        if name in refused:
            assert result.startswith("Required aspect fp64 is not supported on the device"), (name, result)
        else:
            assert result == ("3.0" if name == "transfers" else "6.0"), (name, result)


def test_fp64_conversion_setting_leaves_fp64_devices_alone(run_emulated):
    out = run_emulated(_FP64_STEPS, profile="b580", env={"LIGHTNING_XPU_EMULATOR_FP64_CONV_EMU": "0"})
    assert dict(line.split(" ", 1) for line in out.splitlines()) == {
        "double": "6.0", "complex128": "6.0", "sum_dtype": "6.0", "to_host": "6.0", "transfers": "3.0",
    }


def test_bad_fp64_conversion_setting_stops_start_up(run_emulated):
    out = run_emulated(
        """
        import subprocess, sys, os
        env = dict(os.environ, LIGHTNING_XPU_EMULATOR_FP64_CONV_EMU="yes")
        p = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
        print(p.returncode, p.stderr.strip().splitlines()[-1])
        """
    )
    assert out.startswith("1 ")
    assert (
        "LIGHTNING_XPU_EMULATOR_FP64_CONV_EMU must be 1 (fp64 conversions emulated on devices without fp64, as in "
        "PyTorch's wheels; the default) or 0 (a build without -fsycl-fp64-conv-emu), got 'yes'."
    ) in out


def test_fp64_arithmetic_runs_where_the_device_has_fp64(run_emulated):
    out = run_emulated(
        """
        import torch
        x = torch.ones(2, 3, device="xpu")
        print(x.sum(dtype=torch.float64).item(), torch.arange(4, dtype=torch.float64, device="xpu").sum().item())
        """,
        profile="max1550",
    )
    assert out.split() == ["6.0", "6.0"]


def test_indexing_takes_cpu_indices_but_not_cpu_values(run_emulated):
    out = run_emulated(
        """
        import torch
        x = torch.zeros(4, device="xpu")
        idx, mask = torch.tensor([0, 2]), torch.tensor([True, False, True, False])
        steps = {
            "read": lambda: x[idx].sum().item(),
            "cpu_indices": lambda: x.index_put_((idx,), torch.ones(2, device="xpu")).sum().item(),
            "cpu_scalar_value": lambda: x.index_put_((idx,), torch.tensor(1.0)).sum().item(),
            "setitem": lambda: x.__setitem__(idx, torch.ones(2)),
            "accumulate": lambda: x.index_put_((idx,), torch.ones(2), accumulate=True),
            "mask": lambda: x.__setitem__(mask, torch.ones(2)),
        }
        for name, step in steps.items():
            try:
                print(name, step())
            except RuntimeError as e:
                print(name, str(e).splitlines()[0])
        print("after", x.tolist())
        """,
    )
    results = dict(line.split(" ", 1) for line in out.splitlines())
    assert results["read"] == "0.0"
    assert results["cpu_indices"] == "2.0"
    assert results["cpu_scalar_value"] == "2.0"
    for name in ("setitem", "accumulate", "mask"):
        assert results[name].startswith("Expected all tensors to be on the same device"), (name, results[name])
    assert results["after"] == "[1.0, 0.0, 1.0, 0.0]"  # the refused writes changed nothing


def test_a_cpu_scalar_reaches_only_the_operators_that_take_one(run_emulated):
    """torchgen checks devices in every XPU kernel not marked `device_check: NoCheck`, 0-dim CPU tensors included."""
    out = run_emulated(
        """
        import torch
        x = torch.arange(6.0, device="xpu").reshape(3, 2)
        i, one = torch.tensor(1), torch.tensor(1.0)
        steps = {
            "add": lambda: (x + one).sum().item(),
            "where": lambda: torch.where(x > 2, x, one).sum().item(),
            "index_select": lambda: x.index_select(0, i),
            "index_add": lambda: x.index_add(0, i, torch.ones(2, device="xpu")),
            "index_fill": lambda: x.index_fill(0, i, 9.0),
            "index_select_on_device": lambda: x.index_select(0, i.xpu()).sum().item(),
        }
        for name, step in steps.items():
            try:
                print(name, step())
            except RuntimeError as e:
                print(name, str(e).splitlines()[0])
        """,
    )
    results = dict(line.split(" ", 1) for line in out.splitlines())
    assert results["add"] == "21.0"
    assert results["where"] == "15.0"
    assert results["index_select_on_device"] == "5.0"
    for name in ("index_select", "index_add", "index_fill"):
        assert results[name].startswith("Expected all tensors to be on the same device, but found at least two "
                                        "devices, xpu:0 and cpu!"), (name, results[name])


def test_new_device_memory_is_not_zeroed(run_emulated):
    """The caching allocator hands a freed block back with its old bytes; fresh host pages would read as zeros."""
    out = run_emulated(
        """
        import torch
        a = torch.full((1024,), 7.0, device="xpu")
        del a
        b = torch.empty(1024, device="xpu")
        print((b == 0).all().item())
        torch.use_deterministic_algorithms(True)
        c = torch.empty(1024, device="xpu")
        d = torch.empty(8, dtype=torch.int32, device="xpu")
        print(c.isnan().all().item(), (d == torch.iinfo(torch.int32).max).all().item())
        """,
    )
    lines = out.splitlines()
    assert lines[0] == "False"
    assert lines[1] == "True True"  # deterministic fill: NaN for floats, the largest value for integers


def test_event_records_only_streams_of_its_device(run_emulated):
    out = run_emulated(
        """
        import torch
        e = torch.xpu.Event()
        e.record(torch.xpu.Stream(device=1))  # the first record binds the event to xpu:1
        e.record(torch.xpu.Stream(device=1))
        try:
            e.record(torch.xpu.Stream(device=0))
            print("recorded")
        except RuntimeError as err:
            print(err)
        """,
    )
    assert out.strip() == "Event device 1 does not match recording stream's device 0."


def test_mixed_devices_fail_like_the_real_runtime(run_emulated):
    out = run_emulated(
        """
        import torch
        a = torch.ones(2, device="xpu:0")
        for other in (torch.ones(2, device="xpu:1"), torch.ones(2)):
            try:
                a + other
                print("no error")
            except RuntimeError as e:
                print(str(e).split("!")[0])
        print((a + torch.tensor(2.0)).device, torch.arange(4.0, device="xpu")[torch.tensor([1, 3])].tolist())
        for name, layer, x in (
            ("linear", torch.nn.Linear(2, 2), a),
            ("conv", torch.nn.Conv1d(1, 1, 1), a.view(1, 1, 2)),
        ):
            try:
                layer(x)                          # parameters left on the CPU
                print(name, "no error")
            except RuntimeError as e:
                print(name + ":", "same device" in str(e))
        """
    )
    lines = out.splitlines()
    assert lines[0].endswith("found at least two devices, xpu:0 and xpu:1")
    assert lines[1].endswith("found at least two devices, xpu:0 and cpu")
    assert lines[2] == "xpu:0 [1.0, 3.0]"
    assert lines[3:] == ["linear: True", "conv: True"]


def test_counters(run_emulated):
    out = run_emulated(
        """
        import json, torch
        from lightning_xpu import emulator
        emulator.reset_counters()
        x = torch.ones(256).to("xpu")           # h2d, 1 KiB
        y = (x * 2).sum()
        v = y.item()                            # one scalar read
        z = x.cpu()                             # d2h
        torch.xpu.synchronize()
        c = emulator.counters()
        emulator.reset_counters()
        print(json.dumps([c["h2d_copies"], c["h2d_bytes"], c["d2h_copies"], c["d2h_bytes"], c["item"],
                          c["synchronize"], c["device_init"], emulator.counters()["h2d_copies"]]))
        """
    )
    assert json.loads(out) == [1, 1024, 1, 1024, 1, 1, 1, 0]


def test_rng_is_per_device_and_seeded(run_emulated):
    out = run_emulated(
        """
        import json, torch
        torch.manual_seed(7)
        a = torch.randn(4, device="xpu:0"); b = torch.randn(4, device="xpu:1")
        torch.manual_seed(7)
        a2 = torch.randn(4, device="xpu:0"); b2 = torch.randn(4, device="xpu:1")
        states = torch.xpu.get_rng_state_all()
        c = torch.randn(4, device="xpu:0")
        torch.xpu.set_rng_state_all(states)
        c2 = torch.randn(4, device="xpu:0")
        g = torch.Generator(device="xpu:1").manual_seed(3)
        d = torch.randn(4, device="xpu:1", generator=g)
        print(json.dumps([torch.equal(a, a2), torch.equal(b, b2), torch.equal(a.cpu(), b.cpu()), torch.equal(c, c2),
                          str(g.device), str(d.device), len(states)]))
        """
    )
    assert json.loads(out) == [True, True, True, True, "xpu:1", "xpu:1", 2]


def test_startup_hook_enables_every_process(run_emulated):
    out = run_emulated(
        """
        import subprocess, sys, torch
        child = subprocess.run([sys.executable, "-c", "import torch; print(torch.xpu.device_count())"],
                               capture_output=True, text=True)
        print(torch.xpu.device_count(), child.stdout.strip())
        """,
        devices=3,
    )
    assert out.split() == ["3", "3"]


def test_invalid_settings_fail_clearly(run_emulated):
    out = run_emulated(
        """
        import subprocess, sys, os
        for setting in ({"LIGHTNING_XPU_EMULATOR_DEVICE": "h100"}, {"LIGHTNING_XPU_EMULATOR": "two"}):
            env = dict(os.environ, **setting)
            p = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
            print(p.returncode, p.stderr.strip().splitlines()[-1])
        """
    )
    (rc1, message1), (rc2, message2) = (line.split(" ", 1) for line in out.splitlines())
    assert rc1 == rc2 == "1"
    assert message1 == (
        "ValueError: Unknown emulated XPU profile 'h100' in LIGHTNING_XPU_EMULATOR_DEVICE; choose one of: max1550 "
        "(Intel(R) Data Center GPU Max 1550, the default), max1100 (Intel(R) Data Center GPU Max 1100), arc-a770 "
        "(Intel(R) Arc(TM) A770 Graphics), b580 (Intel(R) Arc(TM) B580 Graphics), lnl (Intel(R) Graphics [0x64a0])."
    )
    assert "LIGHTNING_XPU_EMULATOR must be a device count >= 1 (or unset), got 'two'" in message2


def test_profiler_accepts_xpu_activity_and_pinned_memory_works(run_emulated):
    out = run_emulated(
        """
        import json, torch
        from torch.profiler import ProfilerActivity, profile
        x = torch.ones(4, device="xpu")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]) as prof:
            (x * 2).sum().item()
        names = {e.key for e in prof.key_averages()}
        pinned = torch.ones(3).pin_memory()
        print(json.dumps(["aten::mul" in names, pinned.is_pinned(), torch.ones(3).is_pinned(),
                          pinned.to("xpu", non_blocking=True).device.type]))
        """
    )
    assert json.loads(out.strip().splitlines()[-1]) == [True, True, False, "xpu"]


def test_forked_child_exits_promptly_after_backward(run_emulated):
    out = run_emulated(
        """
        import os, sys, time, torch
        x = torch.ones(2, device="xpu", requires_grad=True)
        (x * 2).sum().backward()                  # starts autograd's xpu device threads
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)                           # a normal interpreter exit in the child
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), time.monotonic() - start)
        """
    )
    code, seconds = out.split()
    assert code == "0"
    assert float(seconds) < 8  # torch's shutdown would otherwise wait 10 s for threads the child does not have


def test_structured_functional_ops_run_their_functional_kernel(run_emulated):
    # mse_loss used to reach the CPU kernel as mse_loss.out, which resizes a 0-dim output (and warns); CPU and XPU
    # builds run the functional kernel
    out = run_emulated(
        """
        import warnings, torch
        warnings.simplefilter("error")
        x = torch.randn(4, 1, device="xpu", requires_grad=True)
        y = torch.randn(4, 1, device="xpu")
        with torch.autocast("xpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(x, y) + torch.nn.functional.mse_loss(x.bfloat16(), y)
        loss.backward()
        a = torch.ones(3, device="xpu")
        a.add_(torch.ones(3, device="xpu"))
        print(loss.dtype, loss.shape, x.grad.shape, a.tolist())
        """
    )
    assert out.strip() == "torch.float32 torch.Size([]) torch.Size([4, 1]) [2.0, 2.0, 2.0]"


def test_cuda_build_is_refused_before_loading(run_emulated):
    out = run_emulated(
        """
        import torch
        from lightning_xpu import emulator

        torch.version.cuda = "13.0"  # what a CUDA build of torch reports
        try:
            emulator.enable(2)
        except RuntimeError as err:
            print(err)
        print(emulator.is_enabled(), torch._C._get_accelerator().type, torch.__version__)
        """,
        devices=None,
    )
    message, state = out.strip().splitlines()
    enabled, accelerator, version = state.split()
    assert (enabled, accelerator) == ("False", "cpu")
    assert message.startswith(f"torch {version} is a CUDA 13.0 build, and the XPU emulator runs only on a CPU-only")
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in message


@pytest.mark.parametrize(("release", "sycl"), [("2.8", "20250101"), ("2.13", "20260000")])
def test_build_info_is_an_xpu_wheels(run_emulated, release, sycl):
    # torch.version.xpu: the SYCL compiler of the release's XPU wheels (_versions.py); USE_XPU / USE_XCCL in the
    # build settings, as PyTorch's test_xpu.py checks them
    out = run_emulated(
        """
        import json, re, torch
        print(json.dumps([torch.version.xpu, re.findall(r"USE_(?:XPU|XCCL)=[^,]+", torch.__config__.show())]))
        """,
        env={"LIGHTNING_XPU_EMULATOR_TORCH": release},
    )
    assert json.loads(out) == [sycl, ["USE_XCCL=ON", "USE_XPU=ON"]]


def test_streams_and_events_as_torch_xpu_presents_them(run_emulated):
    out = run_emulated(
        """
        import ctypes, json, torch
        r = {}
        e = torch.xpu.Event()
        r["uninitialized"] = repr(e)
        e.record()
        r["recorded"] = repr(e) == f"torch.xpu.Event(sycl_event={e.sycl_event:#x}) (emulated)" and e.sycl_event != 0
        r["event_param"] = isinstance(e._as_parameter_, ctypes.c_void_p) and e._as_parameter_.value == e.event_id
        low, high = torch.xpu.Stream.priority_range()
        r["range"] = [low, high]
        r["priorities"] = [torch.xpu.Stream(priority=p).priority for p in (low, 0, high, 5, -5)]
        r["default"] = torch.xpu.current_stream().priority
        s = torch.xpu.Stream(priority=high)
        r["same_stream"] = torch.xpu.Stream(stream_id=s.stream_id, device_index=0, device_type=s.device_type).priority
        r["stream_param"] = s._as_parameter_.value == s.sycl_queue
        a, b = torch.xpu.Event(enable_timing=True), torch.xpu.Event(enable_timing=True)
        a.record(); b.record(); b.synchronize()
        r["elapsed"] = a.elapsed_time(b) >= 0
        try:
            torch.xpu.Event().elapsed_time(b)
        except RuntimeError as err:
            r["untimed"] = str(err)
        print(json.dumps(r))
        """
    )
    assert json.loads(out) == {
        "uninitialized": "torch.xpu.Event(uninitialized) (emulated)",
        "recorded": True,
        "event_param": True,
        "range": [1, -1],
        "priorities": [1, 0, -1, 1, -1],  # out of range: the nearest end, as c10::xpu's getStreamFromPool
        "default": 0,
        "same_stream": -1,
        "stream_param": True,
        "elapsed": True,
        "untimed": "Both events must be created with enable_timing=True to measure elapsed time.",
    }


def test_gpu_trace_callbacks_fire_where_the_xpu_runtime_fires_them(run_emulated):
    out = run_emulated(
        """
        import json, torch
        import torch.xpu._gpu_trace as gpu_trace
        calls = []
        torch._C._activate_gpu_trace()
        for kind in ("event_creation", "event_deletion", "event_record", "event_wait", "event_synchronization",
                     "device_synchronization", "stream_synchronization", "memory_allocation",
                     "memory_deallocation"):
            getattr(gpu_trace, f"register_callback_for_{kind}")(lambda *a, kind=kind: calls.append([kind, *a]))
        e = torch.xpu.Event()
        e.record()
        e.wait()
        e.synchronize()
        ev, queue = e.sycl_event, torch.xpu.current_stream().sycl_queue
        del e
        s = torch.xpu.Stream()
        s.synchronize()
        torch.xpu.synchronize()
        torch.accelerator.synchronize()
        x = torch.empty(256, device="xpu")
        ptr = x.data_ptr()
        del x
        torch.xpu.Event().synchronize()  # never recorded: nothing to trace
        print(json.dumps([calls, ev, queue, s.sycl_queue, ptr]))
        """
    )
    calls, ev, queue, stream, ptr = json.loads(out)
    assert calls == [
        ["event_creation", ev],
        ["event_record", ev, queue],
        ["event_wait", ev, queue],
        ["event_synchronization", ev],
        ["event_deletion", ev],
        ["stream_synchronization", stream],
        ["device_synchronization"],
        ["device_synchronization"],
        ["memory_allocation", ptr],
        ["memory_deallocation", ptr],
    ]
