"""torch.compile's default backend (inductor) on the emulated XPU (lightning_xpu/emulator/_inductor.py).

Each new graph costs a g++ run (10-55 s on two cores): the models are small and each test compiles few graphs.
Inductor's cache (TORCHINDUCTOR_CACHE_DIR, shared by tox's environments) makes a second run cheap.
"""

from __future__ import annotations

import json

import pytest

# seconds a test's process may take with inductor's cache cold: a g++ run per graph, two processes at a time on two
# cores beside other work
COLD = 900

_MODEL = """
import json, sys
import torch
import torch.nn.functional as F
from torch import nn

class Block(nn.Module):
    # a transformer block as LitGPT's: LayerNorm, causal SDPA, MLP, dropout
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(self.norm(x)).split(c, 2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in qkv)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        return self.mlp(x + self.drop(self.proj(y)))
"""


def _last_json(out: str):
    return json.loads(out.strip().splitlines()[-1])


def test_forward_backward_and_autocast_match_eager(run_emulated):
    out = run_emulated(
        _MODEL
        + """
torch.manual_seed(0)
model = Block().to("xpu").eval()  # no dropout: eager and compiled draw different numbers
compiled = torch.compile(model)
x = torch.randn(2, 8, 16, device="xpu")

def grads(fn):
    model.zero_grad()
    out = fn(x)
    out.float().square().sum().backward()
    return out, [p.grad.clone() for p in model.parameters()]

r = {}
(y, g), (ye, ge) = grads(compiled), grads(model)
r["fp32"] = [str(y.device), (y - ye).abs().max().item(), max((a - b).abs().max().item() for a, b in zip(g, ge))]
with torch.autocast("xpu", dtype=torch.bfloat16):
    (y, g), (ye, ge) = grads(compiled), grads(model)
r["bf16"] = [str(y.dtype), (y.float() - ye.float()).abs().max().item(),
             max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(g, ge))]
from torch._dynamo.utils import counters
r["graph_breaks"] = sum(counters["graph_break"].values())
print(json.dumps(r))
""",
        devices=1,
        timeout=COLD,
    )
    r = _last_json(out)
    device, out_err, grad_err = r["fp32"]
    assert device == "xpu:0"
    assert out_err < 1e-5 and grad_err < 1e-4
    dtype, out_err, grad_rel = r["bf16"]
    assert dtype == "torch.bfloat16"
    assert out_err < 0.1 and grad_rel < 0.05  # bf16's 8 bits of mantissa; summation orders differ
    assert r["graph_breaks"] == 0


def test_random_operators_draw_from_the_xpu_generator(run_emulated):
    out = run_emulated(
        """
import json, torch
dropout = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.5))
rand = torch.compile(lambda: torch.rand(64, device="xpu"))
x = torch.ones(256, device="xpu")

def draw(xpu_seed, cpu_seed):
    torch.default_generator.manual_seed(cpu_seed)  # the CPU generator alone (torch.manual_seed seeds xpu too)
    torch.xpu.manual_seed(xpu_seed)
    return dropout(x), rand()

(a, ra), (b, rb), (c, rc) = draw(1, 5), draw(1, 6), draw(2, 5)
gen = torch.xpu.default_generators[0]
before = gen.get_offset()
dropout(x)
print(json.dumps({
    "same_xpu_seed": bool(torch.equal(a, b) and torch.equal(ra, rb)),
    "other_xpu_seed": bool(torch.equal(a, c) or torch.equal(ra, rc)),
    "kept": (a != 0).float().mean().item(),
    "offset_advanced": gen.get_offset() > before,
    "device": str(a.device),
}))
""",
        devices=1,
        timeout=COLD,
    )
    r = _last_json(out)
    assert r["same_xpu_seed"] is True  # the CPU generator's seed plays no part
    assert r["other_xpu_seed"] is False
    assert 0.3 < r["kept"] < 0.7
    assert r["offset_advanced"] is True
    assert r["device"] == "xpu:0"


def test_tensors_on_another_device_than_the_current_one(run_emulated):
    out = run_emulated(
        """
import json, torch
fn = torch.compile(lambda x, w: torch.relu(x @ w) + x.sum())
x, w = torch.randn(4, 4, device="xpu:1"), torch.randn(4, 4, device="xpu:1")
y = fn(x, w)
print(json.dumps([str(y.device), torch.xpu.current_device(), (y - (torch.relu(x @ w) + x.sum())).abs().max().item()]))
""",
        devices=2,
        timeout=COLD,
    )
    device, current, err = _last_json(out)
    assert device == "xpu:1"
    assert current == 0  # the wrapper's device guard restores the current device
    assert err < 1e-5


def test_dynamic_shapes_and_modes(run_emulated):
    out = run_emulated(
        """
import json, torch
from torch._dynamo.utils import counters
r = {}
fn = torch.compile(lambda x: (x.sin() * 2).sum(0) + x.shape[0], dynamic=True)
errs = []
for n in (3, 5, 9):
    x = torch.randn(n, 4, device="xpu")
    errs.append((fn(x) - ((x.sin() * 2).sum(0) + n)).abs().max().item())
r["dynamic"] = [max(errs), counters["stats"]["unique_graphs"]]
for mode in ("reduce-overhead", "max-autotune-no-cudagraphs"):
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w: torch.nn.functional.gelu(x @ w), mode=mode)
    x, w = torch.randn(8, 8, device="xpu"), torch.randn(8, 8, device="xpu")
    y = fn(x, w)
    r[mode] = [str(y.device), (y - torch.nn.functional.gelu(x @ w)).abs().max().item()]
print(json.dumps(r))
""",
        devices=1,
        timeout=COLD,
    )
    r = _last_json(out)
    assert r["dynamic"][0] < 1e-5
    assert r["dynamic"][1] == 1  # one graph for every size
    for mode in ("reduce-overhead", "max-autotune-no-cudagraphs"):
        assert r[mode][0] == "xpu:0"
        assert r[mode][1] < 1e-5


_DDP = """
import copy, json, os, socket, torch, torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

class Net(torch.nn.Module):
    # a module of the user's (Dynamo compiles no frame of torch.nn's own modules that DDP's forward calls)
    def __init__(self):
        super().__init__()
        # 1 MiB of weights in the middle: DDPOptimizer splits the graph where DDP's first bucket (1 MiB) ends
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(16, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.Linear(512, 16)
        )

    def forward(self, x):
        return self.layers(x)

def train(model, steps, rank):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        torch.manual_seed(step * 2 + rank)
        x = torch.randn(4, 16).to("xpu")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

def worker(rank, port, queue):
    torch.xpu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("xccl", rank=rank, world_size=2, device_id=torch.device("xpu", rank))
    torch.manual_seed(0)
    net = Net().to("xpu")
    reference = copy.deepcopy(net)
    compiled = torch.compile(DDP(net))
    train(compiled, 2, rank)
    train(DDP(reference), 2, rank)
    from torch._dynamo.utils import counters
    err = max((a - b).abs().max().item() for a, b in zip(net.parameters(), reference.parameters()))
    subgraphs = counters["aot_autograd"]["total"]
    queue.put((rank, [str(net.layers[0].weight.device), err, dist.get_backend(), subgraphs]))
    dist.destroy_process_group()

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(port, queue), nprocs=2)
    print(json.dumps([r for _, r in sorted([queue.get(), queue.get()])]))
"""


def test_compiled_ddp_on_two_ranks_over_xccl(run_emulated, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(_DDP)
    out = run_emulated(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", timeout=COLD)
    for rank, (device, err, backend, subgraphs) in enumerate(_last_json(out)):
        assert device == f"xpu:{rank}"
        assert backend == "xccl"
        assert subgraphs >= 2  # DDPOptimizer split the graph
        assert err < 1e-5  # the compiled DDP model's weights after two steps are eager DDP's


def test_fused_kernels_report_to_the_stream_sanitizer(run_emulated):
    out = run_emulated(
        """
import json, torch
side = torch.xpu.Stream()
fn = torch.compile(lambda t: t.sin() + 1)
x = torch.ones(4, device="xpu")
fn(x)  # compiled on the default stream
r = {}
y = x * 3  # the default stream writes y
with torch.xpu.stream(side):
    try:
        fn(y)  # the fused kernel reads y on the side stream, which did not wait
        r["unordered"] = "ok"
    except RuntimeError as e:
        r["unordered"] = str(e).splitlines()[0]
torch.xpu.synchronize()
y = x * 3
side.wait_stream(torch.xpu.current_stream())
with torch.xpu.stream(side):
    z = fn(y)
torch.xpu.current_stream().wait_stream(side)
r["ordered"] = z.tolist()
print(json.dumps(r))
""",
        devices=1,
        env={"LIGHTNING_XPU_EMULATOR_SANITIZER": "1"},
        timeout=COLD,
    )
    r = _last_json(out)
    assert r["unordered"].startswith("XPU stream sanitizer: cpp_fused_add_sin_0 (argument 'arg0_1') on stream ")
    assert "reads memory that the default stream writes and this stream did not wait for" in r["unordered"]
    assert r["ordered"] == pytest.approx([1.1411200] * 4)


def test_fp64_in_a_compiled_kernel_is_refused_without_fp64(run_emulated):
    out = run_emulated(
        """
import json, torch
x = torch.ones(4, device="xpu")

def attempt(fn, *args):
    try:
        fn(*args)
        return "ok"
    except RuntimeError as e:
        return str(e).splitlines()[0]

torch._dynamo.config.specialize_float = False  # a Python float reaches the kernel as a 0-dim CPU fp64 tensor
m = torch.nn.Linear(4, 4).to("xpu")
opt = torch.optim.AdamW(m.parameters(), lr=0.01)
m(x).sum().backward()
print(json.dumps({
    "eager": attempt(lambda t: t.double().sum(), x),
    "computes": attempt(torch.compile(lambda t: t.double().sum().float()), x),
    "operand": attempt(torch.compile(lambda t: t * 2), x.double()),
    "converts": attempt(torch.compile(lambda t: t.double()), x),
    "float32": attempt(torch.compile(lambda t, s: (t * s).sum()), x, 0.5),
    "adamw": attempt(torch.compile(opt.step)),
}))
""",
        devices=1,
        profile="arc-a770",
        timeout=COLD,
    )
    r = _last_json(out)
    assert r["eager"].startswith("Required aspect fp64 is not supported on the device")
    for case in ("computes", "operand", "converts"):
        assert r[case].startswith("Required aspect fp64 is not supported on the device (Intel(R) Arc(TM) A770 Graphics")
        assert "compiled kernel cpp_fused_" in r[case]
    assert r["float32"] == r["adamw"] == "ok"


def test_host_tensors_and_extern_kernels_as_on_the_device(run_emulated):
    out = run_emulated(
        """
import json, torch
from lightning_xpu import emulator
from lightning_xpu.emulator._inductor import launch

def attempt(fn, *args):
    try:
        y = fn(*args)
        return str(y.device)
    except Exception as e:
        return type(e).__name__ + ": " + str(e).splitlines()[0]

x = torch.ones(4, device="xpu")
r = {
    # a 0-dim CPU tensor is a scalar: the result stays on xpu, as in eager, wherever the scalar stands
    "scalar_first": attempt(torch.compile(lambda s, t: s * t), torch.tensor(2.0), x),
    "host_operand": attempt(torch.compile(lambda a, b: a + b), x, torch.ones(4)),
}
# host memory passed to a fused kernel as a pointer, as Intel's Triton launcher refuses it
r["pointer"] = attempt(lambda: launch(lambda *a: None, "k", ("a", "b"), (0,), False, x, torch.ones(4)))
r["pinned"] = attempt(lambda: launch(lambda *a: None, "k", ("a", "b"), (0,), False, x, torch.ones(4).pin_memory()) or x)
emulator.reset_counters()
a = torch.randn(4, 4, device="xpu")
torch.compile(lambda a, b: (a @ b).relu())(a, a)
r["extern_mm"] = emulator.counters()["fallback_ops"]
histogram = torch.compile(lambda t: torch.histogramdd(t, bins=[2, 2]).hist)
r["missing_op"] = attempt(histogram, torch.rand(8, 2, device="xpu"))
print(json.dumps(r))
""",
        devices=1,
        timeout=COLD,
    )
    r = _last_json(out)
    assert r["scalar_first"] == "xpu:0"
    assert "TorchRuntimeError" in r["host_operand"] and "device" in r["host_operand"]
    assert r["pointer"] == "ValueError: Pointer argument (at 1) doesn't reference accessible memory."
    assert r["pinned"] == "xpu:0"
    assert r["extern_mm"] >= 1  # the mm ran through the emulator's operator table
    assert r["missing_op"].startswith(
        "NotImplementedError: The operator 'aten::_histogramdd_bin_edges' is not currently implemented for the XPU"
    )


def test_compile_is_installed_only_when_inductor_compiles(run_emulated):
    out = run_emulated(
        """
import json, sys, torch
import torch._dynamo, torch._inductor.config  # what `import lightning` imports
model = torch.nn.Linear(4, 4).to("xpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(2, 4, device="xpu")).sum().backward()
    opt.step()
eager = sorted(m for m in ("torch._inductor.compile_fx", "torch._inductor.codegen.cpp") if m in sys.modules)
torch.compile(lambda t: t + 1)(torch.ones(2, device="xpu"))
from torch._inductor.codegen.common import get_scheduling_for_device
try:
    torch.compile(lambda t: t * 2, options={"cpp_wrapper": True})(torch.ones(2, device="xpu"))
    refused = "compiled"
except Exception as e:
    refused = str(e)
print(json.dumps([eager, get_scheduling_for_device("xpu").__name__, refused]))
""",
        devices=1,
        timeout=COLD,
    )
    eager, scheduling, refused = _last_json(out)
    assert eager == []
    assert scheduling == "CppScheduling"
    # what cannot run here says so, instead of a TritonMissing that sends the user looking for Triton
    assert "The emulated XPU runs torch.compile with inductor's Python wrapper only" in refused
