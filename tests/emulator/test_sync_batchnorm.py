"""SyncBatchNorm's kernels (csrc/batch_norm.cpp): operators an Intel GPU has and the CPU lacks, so the emulator runs
them as torch-xpu-ops' kernels compute them, and nn.SyncBatchNorm works across emulated ranks."""

from __future__ import annotations

import json

import pytest

# Each operator on xpu against plain tensor math on the CPU (float64 references), with the output dtypes and shapes
# of the XPU kernels: statistics in float for half and bfloat16 inputs, outputs in the input's dtype.
OPS_AGAINST_FORMULAS = """
import json, torch

dtype = getattr(torch, "{dtype}")
tol = {{"float32": 1e-5, "float64": 1e-10, "float16": 2e-2, "bfloat16": 1e-1}}["{dtype}"]
stat = torch.float64 if dtype == torch.float64 else torch.float32
torch.manual_seed(0)
x = torch.randn(6, 3, 4, 5).to(dtype)
dy = torch.randn(6, 3, 4, 5).to(dtype)
w, b = torch.randn(3).to(stat), torch.randn(3).to(stat)
eps = 1e-5
r = {{}}

def close(name, got, want):
    assert got.device.type == "xpu", name
    r[name] = [str(got.dtype).split(".")[1], list(got.shape)]
    torch.testing.assert_close(got.cpu().double(), want.double(), atol=tol, rtol=tol, msg=name)

xd = x.double()
dims = (0, 2, 3)
mean = xd.mean(dims)
invstd = 1 / (xd.var(dims, unbiased=False) + eps).sqrt()
m_x, i_x = torch.batch_norm_stats(x.xpu(), eps)
close("stats.mean", m_x, mean)
close("stats.invstd", i_x, invstd)

shape = (1, 3, 1, 1)
y = (xd - mean.view(shape)) * invstd.view(shape) * w.double().view(shape) + b.double().view(shape)
close("elemt", torch.batch_norm_elemt(x.xpu(), w.xpu(), b.xpu(), m_x, i_x, eps), y)
out = torch.empty(0, dtype=dtype, device="xpu")
torch.batch_norm_elemt(x.xpu(), None, None, m_x, i_x, eps, out=out)
close("elemt.out", out, (xd - mean.view(shape)) * invstd.view(shape))

# Two "ranks" of 6 and 2 samples: the combined statistics are those of the 8 samples together.
x2 = torch.randn(2, 3, 4, 5).to(dtype)
m2, i2 = torch.batch_norm_stats(x2.xpu(), eps)
both = torch.cat([xd, x2.double()])
running_mean, running_var = torch.zeros(3, dtype=stat, device="xpu"), torch.ones(3, dtype=stat, device="xpu")
counts = torch.tensor([6 * 20, 2 * 20], dtype=stat, device="xpu")
g_mean, g_invstd = torch.batch_norm_gather_stats_with_counts(
    x.xpu(), torch.stack([m_x, m2]), torch.stack([i_x, i2]), running_mean, running_var, 0.1, eps, counts)
close("gather.mean", g_mean, both.mean(dims))
close("gather.invstd", g_invstd, 1 / (both.var(dims, unbiased=False) + eps).sqrt())
close("gather.running_mean", running_mean, 0.1 * both.mean(dims))
close("gather.running_var", running_var, 0.9 + 0.1 * both.var(dims, unbiased=True))
same_count = torch.batch_norm_gather_stats(x.xpu(), torch.stack([m_x, m_x]), torch.stack([i_x, i_x]), None, None,
                                           0.1, eps, 120)
close("gather_same_count.mean", same_count[0], mean)
close("gather_same_count.invstd", same_count[1], invstd)

dyd = dy.double()
sum_dy, sum_dy_xmu, grad_w, grad_b = torch.batch_norm_backward_reduce(
    dy.xpu(), x.xpu(), m_x, i_x, w.xpu(), True, True, True)
want_sum_dy = dyd.sum(dims)
want_sum_dy_xmu = (dyd * (xd - mean.view(shape))).sum(dims)
close("reduce.sum_dy", sum_dy, want_sum_dy)
close("reduce.sum_dy_xmu", sum_dy_xmu, want_sum_dy_xmu)
close("reduce.grad_weight", grad_w, want_sum_dy_xmu * invstd)
close("reduce.grad_bias", grad_b, want_sum_dy)
r["reduce_flags_off"] = [t is None for t in torch.batch_norm_backward_reduce(
    dy.xpu(), x.xpu(), m_x, i_x, w.xpu(), False, False, False)]

# The gradient of BatchNorm's training-mode output with respect to its input, from autograd on the CPU.
xr = xd.clone().requires_grad_()
out_ref = torch.nn.functional.batch_norm(xr, None, None, w.double(), b.double(), training=True, eps=eps)
(want_grad,) = torch.autograd.grad(out_ref, xr, dyd)
count = torch.tensor([120], dtype=torch.int32, device="xpu")
close("backward_elemt", torch.batch_norm_backward_elemt(
    dy.xpu(), x.xpu(), m_x, i_x, w.xpu(), sum_dy, sum_dy_xmu, count), want_grad)
print(json.dumps(r))
"""


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_each_operator_matches_its_formula_with_the_xpu_kernels_dtypes(run_emulated, dtype):
    r = json.loads(run_emulated(OPS_AGAINST_FORMULAS.format(dtype=dtype), devices=1))
    stat = "float64" if dtype == "float64" else "float32"
    assert r.pop("reduce_flags_off") == [True] * 4
    assert r == {
        "stats.mean": [stat, [3]],
        "stats.invstd": [stat, [3]],
        "elemt": [dtype, [6, 3, 4, 5]],
        "elemt.out": [dtype, [6, 3, 4, 5]],
        "gather.mean": [stat, [3]],
        "gather.invstd": [stat, [3]],
        "gather.running_mean": [stat, [3]],
        "gather.running_var": [stat, [3]],
        "gather_same_count.mean": [stat, [3]],
        "gather_same_count.invstd": [stat, [3]],
        "reduce.sum_dy": [stat, [3]],
        "reduce.sum_dy_xmu": [stat, [3]],
        "reduce.grad_weight": [stat, [3]],
        "reduce.grad_bias": [stat, [3]],
        "backward_elemt": [dtype, [6, 3, 4, 5]],
    }


def test_the_xpu_kernels_refusals_and_the_stream_sanitizer(run_emulated):
    out = run_emulated(
        """
import torch

x = torch.randn(4, 3, 5, device="xpu")
mean, invstd = torch.batch_norm_stats(x, 1e-5)
sums = torch.batch_norm_backward_reduce(x, x, mean, invstd, None, True, False, False)[:2]
side = torch.xpu.Stream()
side.wait_stream(torch.xpu.current_stream())
with torch.xpu.stream(side):
    written_on_side = torch.randn(4, 3, 5, device="xpu")
for name, call in {
    "long input": lambda: torch.batch_norm_stats(x.long(), 1e-5),
    "int64 count": lambda: torch.batch_norm_backward_elemt(x, x, mean, invstd, None, *sums,
                                                           torch.tensor([20], device="xpu")),
    "stats dtypes differ": lambda: torch.batch_norm_backward_elemt(x, x, mean, invstd.double(), None, *sums,
                                                                   torch.tensor([20], dtype=torch.int32, device="xpu")),
    "cpu mean": lambda: torch.batch_norm_elemt(x, None, None, mean.cpu(), invstd, 1e-5),
    "no wait for the side stream": lambda: torch.batch_norm_stats(written_on_side, 1e-5),
}.items():
    try:
        call()
        print(name, "| accepted")
    except (RuntimeError, NotImplementedError) as e:
        print(name, "|", type(e).__name__, str(e).splitlines()[0][:60])
""",
        devices=1,
        env={"LIGHTNING_XPU_EMULATOR_SANITIZER": "1"},
    )
    results = dict(line.split(" | ", 1) for line in out.splitlines())
    assert results["long input"] == "NotImplementedError \"batch_norm_stats_xpu\" not implemented for 'Long'"
    assert results["int64 count"] == "RuntimeError expected scalar type Int but found Long"
    assert results["stats dtypes differ"] == "RuntimeError mean and invstd need to have the same data types"
    assert results["cpu mean"].startswith("RuntimeError Expected all tensors to be on the same device")
    assert results["no wait for the side stream"].startswith("RuntimeError XPU stream sanitizer:")


# Two ranks of SyncBatchNorm over xccl, each with its own half of a batch (uneven: 3 and 5 samples), against one
# BatchNorm2d on the CPU over the whole batch in float64: outputs, input and parameter gradients, running statistics.
# In bfloat16 (as a bf16 model feeds it; its parameters stay float32), the statistics are still float32.
SYNC_BATCHNORM_TWO_RANKS = """
import json, os, socket, torch, torch.distributed as dist
import torch.multiprocessing as mp

DTYPE = torch.__DTYPE__

def batch():
    torch.manual_seed(0)
    return (torch.randn(8, 3, 4, 4) * 3 + 1).to(DTYPE), torch.randn(8, 3, 4, 4).to(DTYPE)

def worker(rank, port, queue):
    torch.xpu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("xccl", rank=rank, world_size=2, device_id=torch.device("xpu", rank))
    x, dy = batch()
    part = slice(0, 3) if rank == 0 else slice(3, 8)
    bn = torch.nn.SyncBatchNorm(3).to("xpu")
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.0, -1.0, 1.0]))
    xi = x[part].to("xpu").requires_grad_()
    out = bn(xi)
    out.backward(dy[part].to("xpu"))
    grads = [bn.weight.grad.clone(), bn.bias.grad.clone()]
    for g in grads:
        dist.all_reduce(g)  # DDP's sum of the parameter gradients
    queue.put((rank, {
        "device": out.device.type,
        "dtypes": [str(t.dtype).split(".")[1] for t in (out, xi.grad, bn.weight.grad, bn.running_mean)],
        "out": out.detach().cpu().tolist(),
        "grad_input": xi.grad.cpu().tolist(),
        "grad_weight": grads[0].cpu().tolist(),
        "grad_bias": grads[1].cpu().tolist(),
        "running_mean": bn.running_mean.cpu().tolist(),
        "running_var": bn.running_var.cpu().tolist(),
    }))
    dist.destroy_process_group()

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(port, queue), nprocs=2)
    ranks = [r for _, r in sorted([queue.get(), queue.get()])]

    x, dy = batch()
    bn = torch.nn.BatchNorm2d(3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.0, -1.0, 1.0]))
    x, dy = x.double().requires_grad_(), dy.double()
    out = bn(x)
    out.backward(dy)
    tol = 1e-4 if DTYPE == torch.float32 else 3e-2
    close = lambda got, want: torch.allclose(torch.tensor(got, dtype=torch.float64), want, atol=tol, rtol=tol)
    print(json.dumps({
        "devices": [r["device"] for r in ranks],
        "dtypes": ranks[0]["dtypes"],
        "out": close(ranks[0]["out"] + ranks[1]["out"], out.detach()),
        "grad_input": close(ranks[0]["grad_input"] + ranks[1]["grad_input"], x.grad),
        "grad_weight": [close(r["grad_weight"], bn.weight.grad) for r in ranks],
        "grad_bias": [close(r["grad_bias"], bn.bias.grad) for r in ranks],
        "running_mean": [close(r["running_mean"], bn.running_mean) for r in ranks],
        "running_var": [close(r["running_var"], bn.running_var) for r in ranks],
    }))
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sync_batchnorm_on_two_ranks_equals_batchnorm_over_the_whole_batch(run_emulated, dtype):
    code = SYNC_BATCHNORM_TWO_RANKS.replace("__DTYPE__", dtype)
    assert json.loads(run_emulated(code, devices=2, timeout=300)) == {
        "devices": ["xpu", "xpu"],
        "dtypes": [dtype, dtype, "float32", "float32"],
        "out": True,
        "grad_input": True,
        "grad_weight": [True, True],
        "grad_bias": [True, True],
        "running_mean": [True, True],
        "running_var": [True, True],
    }
