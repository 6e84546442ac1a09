"""Collectives and DDP across emulated devices, one process per device (spawned, as Lightning does)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

_COLLECTIVES = """
import json, os, socket, sys, torch, torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, backend, port, queue):
    if backend == "ccl":
        import oneccl_bindings_for_pytorch  # registers "ccl", as on an XPU machine
    torch.xpu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=2, device_id=torch.device("xpu", rank))
    r = {"backend": dist.get_backend()}
    t = torch.full((4,), float(rank + 1), device="xpu")
    dist.all_reduce(t)
    r["all_reduce"] = [t.device.index, t.tolist()]
    a = torch.full((2,), float(rank + 1), device="xpu")
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    r["avg"] = a.tolist()
    b = torch.full((3,), float(rank), device="xpu")
    dist.broadcast(b, src=1)
    r["broadcast"] = b.tolist()
    parts = [torch.empty(2, device="xpu") for _ in range(2)]
    dist.all_gather(parts, torch.full((2,), float(rank), device="xpu"))
    r["all_gather"] = [p.tolist() for p in parts]
    flat = torch.empty(4, device="xpu")
    dist.all_gather_into_tensor(flat, torch.full((2,), float(rank), device="xpu"))
    r["all_gather_into_tensor"] = flat.tolist()
    rs = torch.empty(2, device="xpu")
    dist.reduce_scatter_tensor(rs, torch.arange(4.0, device="xpu"))
    r["reduce_scatter_tensor"] = rs.tolist()
    objs = [{"k": [1, 2]}, "x"] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    r["broadcast_object_list"] = objs
    gathered = [None, None]
    dist.all_gather_object(gathered, rank * 10)
    r["all_gather_object"] = gathered
    dist.barrier()
    try:
        dist.all_reduce(torch.ones(1))
        r["cpu_tensor"] = "accepted"
    except RuntimeError as e:
        r["cpu_tensor"] = str(e)
    dist.destroy_process_group()
    queue.put((rank, r))

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(sys.argv[1], port, queue), nprocs=2)
    print(json.dumps([torch.distributed.is_xccl_available()] + [r for _, r in sorted([queue.get(), queue.get()])]))
"""


@pytest.mark.parametrize("backend", ["xccl", "ccl"])
def test_collectives_across_two_processes(run_emulated, backend, tmp_path):
    script = tmp_path / "collectives.py"
    script.write_text(_COLLECTIVES)
    out = run_emulated(
        f"import runpy, sys; sys.argv = ['x', {backend!r}]; runpy.run_path({str(script)!r}, run_name='__main__')",
        env={"LIGHTNING_XPU_EMULATOR_ONECCL": "1"},
    )
    available, r0, r1 = json.loads(out.strip().splitlines()[-1])
    assert available is True
    for rank, r in enumerate((r0, r1)):
        assert r["backend"] == backend
        assert r["all_reduce"] == [rank, [3.0] * 4]
        assert r["avg"] == [1.5, 1.5]
        assert r["broadcast"] == [1.0, 1.0, 1.0]
        assert r["all_gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert r["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0]
        assert r["broadcast_object_list"] == [{"k": [1, 2]}, "x"]
        assert r["all_gather_object"] == [0, 10]
        assert "No backend type associated with device type cpu" in r["cpu_tensor"]
    assert r0["reduce_scatter_tensor"] == [0.0, 2.0]
    assert r1["reduce_scatter_tensor"] == [4.0, 6.0]


_DDP = """
import json, os, socket, torch, torch.distributed as dist
import torch.multiprocessing as mp

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(10, 16, 6, generator=g), torch.randn(10, 16, 1, generator=g)

def worker(rank, port, queue):
    torch.xpu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("xccl", rank=rank, world_size=2, device_id=torch.device("xpu", rank))
    model = torch.nn.parallel.DistributedDataParallel(make_model().to("xpu"), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xs, ys = data()
    for x, y in zip(xs, ys):
        x, y = x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8]   # each rank: half of the batch
        loss = torch.nn.functional.mse_loss(model(x.to("xpu")), y.to("xpu"))
        opt.zero_grad(); loss.backward(); opt.step()
    params = [p.detach().cpu().tolist() for p in model.module.parameters()]  # plain data: workers exit first
    # DDP's time statistics, measured by the timer registered for xpu (as torch-xpu-ops registers one)
    stats = model._get_ddp_logging_data()
    timed = sorted(k for k in ("avg_forward_compute_time", "avg_backward_compute_time") if stats.get(k, 0) > 0)
    queue.put((rank, params, str(model.module[0].weight.device), timed))
    dist.destroy_process_group()

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(port, queue), nprocs=2)
    results = sorted([queue.get(), queue.get()], key=lambda r: r[0])
    timed = [t for _, _, _, t in results]
    results = [(r, [torch.tensor(p) for p in ps], d) for r, ps, d, _ in results]
    single = make_model().to("xpu:0")                  # one device, the whole (doubled) batch
    opt = torch.optim.SGD(single.parameters(), lr=0.05)
    xs, ys = data()
    for x, y in zip(xs, ys):
        loss = torch.nn.functional.mse_loss(single(x.to("xpu:0")), y.to("xpu:0"))
        opt.zero_grad(); loss.backward(); opt.step()
    ref = [torch.tensor(p.detach().cpu().tolist()) for p in single.parameters()]
    start = [p.detach() for p in make_model().parameters()]
    print(json.dumps({
        "ranks_equal": all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1])),
        "matches_single": all(torch.allclose(a, b, atol=1e-5) for a, b in zip(results[0][1], ref)),
        "trained": not all(torch.equal(a, b) for a, b in zip(ref, start)),
        "devices": [results[0][2], results[1][2]],
        "timed": timed,
    }))
"""


def test_ddp_two_devices_matches_one_device_with_doubled_batch(run_emulated, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(_DDP)
    out = run_emulated(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert json.loads(out.strip().splitlines()[-1]) == {
        "ranks_equal": True,
        "matches_single": True,
        "trained": True,
        "devices": ["xpu:0", "xpu:1"],
        # without a timer for xpu, DDP warns "Time stats are currently only collected for CPU and CUDA devices" in
        # every rank and measures nothing; an XPU build of torch registers one (torch-xpu-ops src/xccl/reducer_xpu.cpp)
        "timed": [["avg_backward_compute_time", "avg_forward_compute_time"]] * 2,
    }


_FSDP = """
import json, os, socket, tempfile, torch, torch.distributed as dist
import torch.multiprocessing as mp

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

def batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, 6, generator=g) for _ in range(4)]

def worker(rank, port, queue, ckpt_dir):
    torch.xpu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("xccl", rank=rank, world_size=2, device_id=torch.device("xpu", rank))
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard
    mesh = init_device_mesh("xpu", (2,))
    out = {"mesh": mesh.device_type}
    for kind in ("fsdp2", "fsdp1"):
        model = make_model().to("xpu") if kind == "fsdp2" else make_model()
        if kind == "fsdp2":
            for layer in (model[0], model[2]):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            model = FSDP(model, device_id=torch.device("xpu", rank))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in batches():
            x = x[rank * 4:(rank + 1) * 4].to("xpu")
            opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()
        if kind == "fsdp2":
            weights = [model[0].weight.full_tensor().cpu().tolist(), model[2].bias.full_tensor().cpu().tolist()]
            dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt_dir)     # sharded checkpoint round trip
            with torch.no_grad():
                for p in model.parameters():
                    p.zero_()
            state = {"model": model.state_dict()}
            dcp.load(state, checkpoint_id=ckpt_dir)
            model.load_state_dict(state["model"])
            out["dcp"] = model[0].weight.full_tensor().cpu().tolist() == weights[0]
        else:
            with FSDP.summon_full_params(model):
                weights = [model.module[0].weight.cpu().tolist(), model.module[2].bias.cpu().tolist()]
        out[kind] = weights
    dist.destroy_process_group()
    queue.put((rank, out))

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(port, queue, tempfile.mkdtemp()), nprocs=2)
    results = [r for _, r in sorted([queue.get(), queue.get()], key=lambda r: r[0])]
    single = make_model().to("xpu:0")
    opt = torch.optim.SGD(single.parameters(), lr=0.1)
    for x in batches():
        opt.zero_grad(); single(x.to("xpu:0")).pow(2).mean().backward(); opt.step()
    ref = [single[0].weight.detach().cpu(), single[2].bias.detach().cpu()]
    close = lambda ws: all(torch.allclose(torch.tensor(w), r, atol=1e-5) for w, r in zip(ws, ref))
    print(json.dumps({"mesh": results[0]["mesh"], "fsdp2": [close(r["fsdp2"]) for r in results],
                      "fsdp1": [close(r["fsdp1"]) for r in results], "dcp": [r["dcp"] for r in results]}))
"""


def test_fsdp1_fsdp2_device_mesh_and_sharded_checkpoints(run_emulated, tmp_path):
    script = tmp_path / "fsdp.py"
    script.write_text(_FSDP)
    out = run_emulated(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert json.loads(out.strip().splitlines()[-1]) == {
        "mesh": "xpu",
        "fsdp2": [True, True],
        "fsdp1": [True, True],
        "dcp": [True, True],
    }


# Runs `worker(rank, port, queue)` on two spawned ranks and prints what each put in the queue, by rank.
_TWO_RANKS_MAIN = """
if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(port, queue), nprocs=2)
    print(json.dumps([r for _, r in sorted([queue.get(), queue.get()])]))
"""

_STRICT_XCCL = """
import json, os, socket, sys, warnings, torch, torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, port, queue):
    torch.xpu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("xccl", rank=rank, world_size=2)
    r = {}
    t = torch.full((2,), float(rank + 1), device="xpu")
    work = dist.all_reduce(t, async_op=True)
    r["before_wait"] = [t.tolist(), work.is_completed()]
    work.wait()
    r["after_wait"] = [t.tolist(), work.is_completed()]
    u = torch.full((2,), float(rank + 1), device="xpu")
    work = dist.all_reduce(u, async_op=True)
    torch.xpu.synchronize()
    r["after_synchronize"] = [u.tolist(), work.is_completed()]
    g = torch.empty(4, device="xpu")
    work = dist.all_gather_into_tensor(g, torch.full((2,), float(rank), device="xpu"), async_op=True)
    r["gather_early_is_old_memory"] = not torch.equal(g.cpu(), torch.tensor([0.0, 0.0, 1.0, 1.0]))
    work.wait()
    r["gather"] = g.tolist()
    errors = []
    for call in (
        lambda: dist.all_reduce(torch.ones(1, device="xpu"), op=dist.ReduceOp.BAND),
        lambda: dist.all_reduce(torch.ones(1, dtype=torch.int16, device="xpu")),
        lambda: dist.all_reduce(torch.ones(1, dtype=torch.bool, device="xpu"), op=dist.ReduceOp.AVG),
    ):
        try:
            call()
            errors.append("accepted")
        except Exception as e:
            errors.append([type(e).__name__, str(e).splitlines()[0]])
    r["errors"] = errors
    tensors = []
    x = torch.arange(8.0, device="xpu").view(2, 4)
    for call in (
        lambda: dist.all_reduce(x[:, 0]),                                        # a strided view
        lambda: dist.broadcast(x.t(), src=0),                                    # a transposed tensor
        lambda: dist.all_gather_into_tensor(torch.empty(16), x.reshape(-1)),     # a CPU output
        lambda: dist.all_reduce(torch.ones(1, device=f"xpu:{1 - rank}")),        # another rank's device
    ):
        try:
            call()
            tensors.append("accepted")
        except Exception as e:
            tensors.append([type(e).__name__, str(e).splitlines()[0].split(" (")[0]])
    r["tensors"] = tensors
    r["unchanged"] = x.tolist() == torch.arange(8.0).view(2, 4).tolist()
    dist.barrier()                                      # the rank's own device: fine
    try:
        dist.barrier(device_ids=[1 - rank])             # another rank's device
        r["foreign_barrier"] = "accepted"
    except Exception as e:
        r["foreign_barrier"] = type(e).__name__
    dist.destroy_process_group()
    queue.put((rank, r))

"""


def test_async_collectives_land_at_wait_and_xccl_refuses_what_xccl_refuses(run_emulated, tmp_path):
    script = tmp_path / "strict.py"
    script.write_text(_STRICT_XCCL + _TWO_RANKS_MAIN)
    # it reads outputs before wait() on purpose, which the stream sanitizer refuses (test_sanitizer.py)
    out = run_emulated(
        f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
        env={"LIGHTNING_XPU_EMULATOR_SANITIZER": "0"},
    )
    for rank, r in enumerate(json.loads(out.strip().splitlines()[-1])):
        assert r["before_wait"] == [[float(rank + 1)] * 2, False]
        assert r["after_wait"] == [[3.0, 3.0], True]
        assert r["after_synchronize"] == [[3.0, 3.0], True]
        assert r["gather_early_is_old_memory"] is True
        assert r["gather"] == [0.0, 0.0, 1.0, 1.0]
        assert r["errors"] == [
            ["ValueError", "Cannot use ReduceOp.BAND with XCCL"],
            ["TypeError", "Input tensor data type is not supported for XCCL process group: Short"],
            ["TypeError", "Cannot use ReduceOp.AVG with boolean inputs"],
        ]
        assert r["foreign_barrier"] == "DistBackendError"
        # ProcessGroupXCCL's checkSingleTensor, and its communicators keyed by device (a hang there, an error here)
        assert r["tensors"] == [
            ["ValueError", "Tensors must be contiguous"],
            ["ValueError", "Tensors must be contiguous"],
            ["ValueError", "Tensors must be XPU and dense"],
            ["DistBackendError", f"XCCL collective on xpu:{1 - rank}, but rank {rank} runs on xpu:{rank}"],
        ]
        assert r["unchanged"] is True


_AVG = """
import json, os, socket, torch, torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, port, queue):
    torch.xpu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("xccl", rank=rank, world_size=2, device_id=torch.device("xpu", rank))
    r = {}
    for dtype in (torch.int64, torch.int32, torch.uint8, torch.float32, torch.bfloat16):
        t = torch.tensor([rank + 1, 4 * rank + 2, 7], dtype=dtype, device="xpu")  # sums 3, 8, 14
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        r[str(dtype)] = [str(t.dtype), t.tolist()]
    t = torch.tensor(rank + 2, device="xpu")  # what self.log(int, sync_dist=True) all-reduces: sum 5
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    r["scalar"] = [str(t.dtype), t.item()]
    out = torch.empty(2, dtype=torch.int64, device="xpu")
    dist.reduce_scatter_tensor(out, torch.arange(4, device="xpu") + rank, op=dist.ReduceOp.AVG)
    r["reduce_scatter"] = out.tolist()
    red = torch.tensor([rank + 1], device="xpu")
    dist.reduce(red, dst=0, op=dist.ReduceOp.AVG)
    r["reduce"] = red.tolist()
    dist.destroy_process_group()
    queue.put((rank, r))

"""


def test_avg_divides_in_the_tensors_dtype_as_oneccls_avg(run_emulated, tmp_path):
    # ProcessGroupXCCL maps AVG to ccl::reduction::avg (oneCCL >= 2021.15): integer tensors stay integer and
    # truncate, as NCCL's ncclAvg; SUM followed by a true division would fail to cast the result back to Long
    script = tmp_path / "avg.py"
    script.write_text(_AVG + _TWO_RANKS_MAIN)
    out = run_emulated(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    r0, r1 = json.loads(out.strip().splitlines()[-1])
    for r in (r0, r1):
        assert r["torch.int64"] == ["torch.int64", [1, 4, 7]]
        assert r["torch.int32"] == ["torch.int32", [1, 4, 7]]
        assert r["torch.uint8"] == ["torch.uint8", [1, 4, 7]]
        assert r["torch.float32"] == ["torch.float32", [1.5, 4.0, 7.0]]
        assert r["torch.bfloat16"] == ["torch.bfloat16", [1.5, 4.0, 7.0]]
        assert r["scalar"] == ["torch.int64", 2]
    assert r0["reduce_scatter"] == [0, 1]  # sums [1, 3] of rank 0's chunk
    assert r1["reduce_scatter"] == [2, 3]  # sums [5, 7]
    assert r0["reduce"] == [1]  # the root: sum 3, averaged


@pytest.mark.parametrize("bindings", [False, True])
def test_ccl_exists_only_after_importing_the_oneccl_bindings(run_emulated, bindings):
    out = run_emulated(
        """
        import json, torch, torch.distributed as dist
        before = "CCL" in dist.Backend._plugins
        try:
            import oneccl_bindings_for_pytorch
            imported = True
        except ImportError:
            imported = False
        print(json.dumps([before, imported, "CCL" in dist.Backend._plugins]))
        """,
        env={"LIGHTNING_XPU_EMULATOR_ONECCL": "1"} if bindings else None,
    )
    assert json.loads(out) == [False, bindings, bindings]


_PREMUL_SUM = """
import json, os, socket, torch, torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, port, queue):
    torch.xpu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("xccl", rank=rank, world_size=2)
    r = {}
    for name, dtype in (("float", torch.float32), ("int", torch.int32)):
        t = torch.full((2,), rank + 1, dtype=dtype, device="xpu")
        try:
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
            r[name] = t.tolist()
        except (ValueError, TypeError, RuntimeError) as e:
            r[name] = [type(e).__name__, str(e).splitlines()[0]]
    inp = torch.full((4,), float(rank + 1), device="xpu")
    out = torch.empty(2, device="xpu")
    try:
        dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(2.0))
        r["reduce_scatter"] = [out.tolist(), inp.tolist()]
    except ValueError as e:
        r["reduce_scatter"] = [type(e).__name__, str(e)]
    dist.destroy_process_group()
    queue.put((rank, r))
"""


@pytest.mark.parametrize("release", ["2.10", "2.11", "2.13"])
def test_premul_sum_follows_the_release(run_emulated, tmp_path, release):
    """ProcessGroupXCCL refuses PREMUL_SUM up to 2.10, has oneCCL scale floating types in 2.11 and, from 2.12,
    multiplies the input in place and sums (applyPreMulSumIfNeeded)."""
    script = tmp_path / "premul.py"
    script.write_text(_PREMUL_SUM + _TWO_RANKS_MAIN)
    out = run_emulated(
        f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
        env={"LIGHTNING_XPU_EMULATOR_TORCH": release},
    )
    refused = ["ValueError", "Cannot use ReduceOp.PREMUL_SUM with XCCL"]
    for rank, r in enumerate(json.loads(out.strip().splitlines()[-1])):
        if release == "2.10":
            assert r == {"float": refused, "int": refused, "reduce_scatter": refused}
            continue
        assert r["float"] == [6.0, 6.0]  # 2 * 1 + 2 * 2
        if release == "2.11":
            assert r["int"] == ["TypeError", "PreMulSum Data type must be half, float, bfloat16 or double"]
            assert r["reduce_scatter"] == [[6.0, 6.0], [float(rank + 1)] * 4]  # the input is left as it was
        else:
            # the in-place multiplication by the float factor refuses integer tensors, as torch's mul_ does there
            assert r["int"] == ["RuntimeError", "result type Float can't be cast to the desired output type Int"]
            assert r["reduce_scatter"] == [[6.0, 6.0], [2.0 * (rank + 1)] * 4]  # scaled in place, as there


_BACKEND_OBJECT = """
import datetime, gc, json, os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
torch.xpu.set_device(0)
dist.init_process_group("xccl", timeout=datetime.timedelta(seconds=50))
gc.collect()
backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("xpu"))
r = [isinstance(backend, dist.ProcessGroupXCCL), type(backend).__qualname__,
     backend.options._timeout.total_seconds(), backend.options.group_name != ""]
dist.destroy_process_group()
print(json.dumps(r))
"""


def test_the_xpu_backend_is_a_process_group_xccl_with_its_options(run_emulated):
    # pg._get_backend(xpu) is the ProcessGroupXCCL c10d built, with the Options it was built with (PyTorch's
    # test_c10d_xccl.py reads backend.options._timeout), also after c10d dropped its own reference
    out = run_emulated(_BACKEND_OBJECT, devices=1)
    assert json.loads(out) == [True, "ProcessGroupXCCL", 50.0, True]


_AS_ON_XCCL = """
import json, os, socket, torch, torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("xccl", rank=rank, world_size=2)    # no set_device: both ranks' current device is xpu:0
    r = {}
    dist.barrier(device_ids=[rank])                             # the group's first device: ProcessGroupXCCL runs it
    dev = torch.device("xpu", rank)
    r["supports_coalescing"] = dist.group.WORLD._get_backend(dev).supports_coalescing
    out = torch.empty(4, dtype=torch.float8_e4m3fn, device=dev)
    dist.all_gather_into_tensor(out, torch.tensor([1.5, -2.0 * (rank + 1)], device=dev).to(torch.float8_e4m3fn))
    b = torch.full((2,), float(rank), device=dev).to(torch.float8_e5m2)
    dist.broadcast(b, src=1)
    r["float8"] = [out.float().tolist(), b.float().tolist()]
    try:
        dist.all_reduce(b)
        r["float8_all_reduce"] = "accepted"
    except RuntimeError as e:
        r["float8_all_reduce"] = str(e).splitlines()[0]
    ts = [torch.full((3 + i,), float(rank + 1 + i), device=dev) for i in range(3)]
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    r["coalesced"] = [len(cm.works), [t[0].item() for t in ts]]
    recv = torch.zeros(2, device=dev)
    ops = [dist.P2POp(dist.irecv, recv, 1 - rank), dist.P2POp(dist.isend, torch.full((2,), rank + 10.0, device=dev),
                                                            1 - rank)]   # both ranks post the recv first
    works = dist.batch_isend_irecv(ops)
    for w in works:
        w.wait()
    r["batch_isend_irecv"] = [len(works), recv.tolist()]
    try:
        dist.all_gather_coalesced([[torch.empty(2, device=dev) for _ in range(2)]], [torch.ones(2, device=dev)])
        r["all_gather_coalesced"] = "accepted"
    except RuntimeError as e:
        r["all_gather_coalesced"] = str(e).splitlines()[0]
    dist.destroy_process_group()
    queue.put((rank, r))
"""


def test_float8_coalescing_and_unset_devices_as_process_group_xccl(run_emulated, tmp_path):
    """What ProcessGroupXCCL runs (torch-xpu-ops src/xccl/ProcessGroupXCCL.cpp, release/2.8 to 2.13) and gloo alone
    would refuse: float8 moved as uint8 where nothing reduces (reductions refuse it), startCoalescing/endCoalescing
    (one Work for a coalesced group, batch_isend_irecv), a barrier on device_ids=[rank] that never set its device; and
    what it refuses: all_gather_coalesced, which ProcessGroupXCCL leaves to c10d's Backend."""
    script = tmp_path / "as_on_xccl.py"
    script.write_text(_AS_ON_XCCL + _TWO_RANKS_MAIN)
    out = run_emulated(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    for rank, r in enumerate(json.loads(out.strip().splitlines()[-1])):
        assert r["supports_coalescing"] is True
        assert r["float8"] == [[1.5, -2.0, 1.5, -4.0], [1.0, 1.0]]
        assert r["float8_all_reduce"] == "Float8 dtypes are not currently supported for XCCL reductions"
        assert r["coalesced"] == [1, [3.0, 5.0, 7.0]]
        assert r["batch_isend_irecv"] == [1, [11.0 - rank] * 2]
        assert r["all_gather_coalesced"] == "Backend xccl does not support allgather_coalesced"


_NAN_CHECK = """
import os, sys, torch, torch.distributed as dist
os.environ["TORCH_XCCL_NAN_CHECK"] = "1"
dist.init_process_group("xccl", rank=0, world_size=1, store=dist.HashStore())
try:
    dist.all_reduce(torch.ones(2, dtype=torch.int64, device="xpu"))
    print("int64: ran", flush=True)
except NotImplementedError as e:
    print("int64:", e, flush=True)
t = torch.zeros(4099, device="xpu", dtype=torch.bfloat16)
t[4098] = float("nan")                                   # in the tail after 512 packs of 8
dist.all_gather_into_tensor(torch.empty_like(t), t)
print("NaN: ran", flush=True)
"""


@pytest.mark.parametrize("release", ["2.8", "2.12", "2.13"])
def test_nan_check_aborts_as_the_device_side_assert(emulator_site, tmp_path, release):
    """TORCH_XCCL_NAN_CHECK=1 (torch-xpu-ops NanCheck_XPU.cpp, release/2.9 on): a NaN in a collective's input trips
    the check kernel's assert(0), and the SYCL runtime prints it and aborts the process; up to 2.12 the kernel's
    dtype dispatch comes first, so an integer collective raises."""
    script = tmp_path / "nan.py"
    script.write_text(_NAN_CHECK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_XPU_EMULATOR", "ZE_", "TORCH_XCCL"))}
    repo = Path(__file__).resolve().parents[2]
    env.update(PYTHONPATH=f"{emulator_site}{os.pathsep}{repo}", PYTHONWARNINGS="ignore")
    env.update(LIGHTNING_XPU_EMULATOR="1", LIGHTNING_XPU_EMULATOR_TORCH=release)
    if "LIGHTNING_XPU_EMULATOR_CACHE" in os.environ:
        env["LIGHTNING_XPU_EMULATOR_CACHE"] = os.environ["LIGHTNING_XPU_EMULATOR_CACHE"]
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    lines = proc.stdout.splitlines()
    if release == "2.8":  # no NaN check before 2.9
        assert (proc.returncode, lines) == (0, ["int64: ran", "NaN: ran"]), proc.stderr[-3000:]
        return
    assert proc.returncode == -signal.SIGABRT, proc.stderr[-3000:]
    assert lines == ["int64: ran" if release == "2.13" else "int64: \"checkForNaN_XPU\" not implemented for 'Long'"]
    line = 174 if release == "2.13" else 172
    assert (
        f"third_party/torch-xpu-ops/src/xccl/NanCheck_XPU.cpp:{line}: void c10d::checkForNaN<c10::BFloat16>::operator()"
        "(sycl::nd_item<1>) const [T = c10::BFloat16]: global id: [2,0,0], local id: [2,0,0] Assertion `0` failed."
    ) in proc.stderr
