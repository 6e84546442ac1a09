"""Operators outside the modelled release's XPU kernels behave as torch-xpu-ops' fallback makes them behave on an
Intel GPU (xpu_ops.cpp and the table ci/gen_xpu_ops.py generates); the others, and composites, run silently."""

from __future__ import annotations

import json
import re
from pathlib import Path

_NOT_IMPLEMENTED = (
    "The operator '{op}' is not currently implemented for the XPU device. Please open a feature on "
    "https://github.com/intel/torch-xpu-ops/issues. You can set the environment variable "
    "`PYTORCH_ENABLE_XPU_FALLBACK=1` to use the CPU implementation as a fallback for XPU unimplemented operators. "
    "WARNING: this will bring unexpected performance compared with running natively on XPU."
)
_FALLBACK_WARNING = (
    "Aten Op fallback from XPU to CPU happends. This may have performance implications. If need debug the fallback "
    "ops please set environment variable `PYTORCH_DEBUG_XPU_FALLBACK=1` "
)

# Runs fn, printing [name, outcome, warnings]: "ok" (its result equals the CPU's), or the NotImplementedError.
_CHECK = """
import json, warnings, torch
def check(name, fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn("xpu")
            ref = fn("cpu")
            outs, refs = (out, ref) if isinstance(out, (tuple, list)) else ((out,), (ref,))
            assert all(o.device.type == "xpu" and torch.allclose(o.cpu(), r) for o, r in zip(outs, refs)), name
            outcome = "ok"
        except NotImplementedError as e:
            outcome = str(e)
    print(json.dumps([name, outcome, [str(w.message).split(" (Triggered internally")[0] for w in caught]]))
"""

_HISTOGRAMDD = """
check("histogramdd", lambda d: torch.histogramdd(torch.arange(12.0, device=d).reshape(6, 2), bins=3).hist)
"""


def _outcomes(out: str) -> dict[str, list]:
    return {row[0]: row[1:] for row in map(json.loads, out.splitlines()) if isinstance(row, list)}


def test_implemented_and_composite_operators_run_silently(run_emulated):
    out = run_emulated(_CHECK + """
import torch.nn.functional as F
x = lambda d: torch.arange(24.0, device=d).reshape(4, 6) / 10
check("mm", lambda d: x(d) @ x(d).T)  # PyTorch core's oneDNN kernel
check("abs_sin", lambda d: x(d).sin().abs())  # torch-xpu-ops kernels
check("mse_loss", lambda d: F.mse_loss(x(d), x(d).flip(0)))  # a structured operator's functional variant
check("einsum", lambda d: torch.einsum("ij,kj->ik", x(d), x(d)))  # CompositeImplicitAutograd
def linear_grad(d):
    w = x(d).requires_grad_()
    F.linear(x(d), w).relu().sum().backward()
    return w.grad
check("linear_backward", linear_grad)
check("conv2d", lambda d: F.conv2d(x(d).reshape(1, 1, 4, 6), torch.ones(1, 1, 3, 3, device=d)))
""")
    assert _outcomes(out) == {name: ["ok", []] for name in
                              ("mm", "abs_sin", "mse_loss", "einsum", "linear_backward", "conv2d")}


def test_an_operator_torch_xpu_ops_lacks_raises_not_implemented(run_emulated):
    out = run_emulated(_CHECK + _HISTOGRAMDD + """
# a structured operator lacking its out= kernel: the composite functional variant runs, and its out= variant meets the
# fallback, which names that variant
check("lanczos", lambda d: torch.ops.aten._upsample_lanczos2d_aa(torch.ones(1, 1, 4, 4, device=d), [2, 2], False))
""")
    outcomes = _outcomes(out)
    # torch.histogramdd: torch-xpu-ops release/2.13 registers its dispatch stub but comments its yaml entries out; the
    # same error is intel/torch-xpu-ops#2249
    assert outcomes["histogramdd"] == [_NOT_IMPLEMENTED.format(op="aten::_histogramdd_bin_edges"), []]
    assert outcomes["lanczos"] == [_NOT_IMPLEMENTED.format(op="aten::_upsample_lanczos2d_aa.out"), []]


def test_enable_xpu_fallback_runs_it_on_the_cpu_with_a_warning(run_emulated):
    out = run_emulated(_CHECK + _HISTOGRAMDD * 2, env={"PYTORCH_ENABLE_XPU_FALLBACK": "1"})
    first, second = out.splitlines()
    assert json.loads(first) == ["histogramdd", "ok", [_FALLBACK_WARNING]]
    assert json.loads(second) == ["histogramdd", "ok", []]  # TORCH_WARN_ONCE
    out = run_emulated(_CHECK + _HISTOGRAMDD, env={"PYTORCH_ENABLE_XPU_FALLBACK": "0"})
    assert _outcomes(out)["histogramdd"][0] == _NOT_IMPLEMENTED.format(op="aten::_histogramdd_bin_edges")


def test_an_operator_on_the_fallback_list_warns_and_runs_on_the_cpu(run_emulated):
    body = _CHECK + """
a = lambda d: (lambda m: m @ m.T + 4 * torch.eye(4, device=d))(torch.arange(16.0, device=d).reshape(4, 4) / 10)
check("cholesky", lambda d: torch.linalg.cholesky(a(d)))  # linalg_cholesky_ex.L is on XPUFallback's list
check("cholesky", lambda d: torch.linalg.cholesky(a(d)))
"""
    first, second = run_emulated(body).splitlines()
    assert json.loads(first) == ["cholesky", "ok", [_FALLBACK_WARNING]]
    assert json.loads(second) == ["cholesky", "ok", []]
    debug = run_emulated(body, env={"PYTORCH_DEBUG_XPU_FALLBACK": "1"}).splitlines()
    warning = "The operator 'aten::linalg_cholesky_ex.L on the XPU backend is falling back to run on the CPU."
    assert [json.loads(line) for line in debug] == [["cholesky", "ok", [warning]]] * 2


def test_a_fallback_list_operator_runs_in_fp64_on_a_device_without_it(run_emulated):
    # the CPU computes it: Arc A-series' missing fp64 does not stop it
    out = run_emulated(_CHECK + """
a = lambda d: (torch.eye(3, dtype=torch.float64) * 4).to(d)  # a conversion, which runs
check("cholesky", lambda d: torch.linalg.cholesky(a(d)))
""", profile="arc-a770")
    assert json.loads(out) == ["cholesky", "ok", [_FALLBACK_WARNING]]


def test_a_fallback_list_operator_checks_devices_as_torch_xpu_ops_does(run_emulated):
    out = run_emulated("""
import torch
try:
    torch.linalg.householder_product(torch.ones(3, 2, device="xpu"), torch.ones(2))
except RuntimeError as e:
    print(str(e).splitlines()[0])
""")
    assert out.strip() == ("Expected all tensors to be on the same device, but found at least two devices, xpu:0 and "
                           "cpu! (Operator aten::linalg_householder_product)")


def test_the_emulators_own_kernels_are_operators_the_release_has():
    # the kernels of csrc/kernels.cpp and csrc/batch_norm.cpp bypass the fallback: each must be an XPU kernel there
    # too, or composite (copy_)
    import torch

    csrc = Path(__file__).resolve().parents[2] / "lightning_xpu" / "emulator" / "csrc"
    table = set(re.findall(r'^\{"([^"]+)", XpuKernel::\w+\},$', (csrc / "xpu_ops.inc").read_text(), re.MULTILINE))
    own = []
    for source in ("kernels.cpp", "batch_norm.cpp"):
        block = (csrc / source).read_text().split("TORCH_LIBRARY_IMPL(aten, XPU, m) {")[1].split("}")[0]
        own += re.findall(r'm\.impl\("([\w.]+)"', block)
    assert len(own) > 27
    lacking = [op for op in own if op not in table and not torch._C._dispatch_has_kernel_for_dispatch_key(
        f"aten::{op}", "CompositeExplicitAutograd")]
    assert lacking == []


def test_abs_of_bool_runs_as_torch_xpu_ops_abs_kernel_runs_it(run_emulated):
    # torch-xpu-ops' abs_kernel dispatches Bool (the identity); the CPU kernel the emulator runs has none, so
    # without the emulator's own handling `abs` of a bool xpu tensor raised where an XPU build runs it
    out = run_emulated(
        """
        import json, torch
        x = torch.tensor([True, False, True], device="xpu")
        weird = torch.tensor([5, 0, 255], dtype=torch.uint8, device="xpu").view(torch.bool)
        out = torch.empty(0, dtype=torch.bool, device="xpu")
        torch.abs(x, out=out)
        y = x.clone()
        y.abs_()
        try:
            torch.abs(x, out=torch.empty(3, device="xpu"))
            mismatch = "no error"
        except RuntimeError as e:
            mismatch = str(e)
        print(json.dumps([x.abs().tolist(), weird.abs().tolist(), out.tolist(), y.tolist(), str(x.abs().device),
                          torch.abs(torch.tensor([-2, 3], device="xpu")).tolist(), mismatch]))
        """
    )
    r = json.loads(out)
    identity = [True, False, True]
    assert r[:6] == [identity, identity, identity, identity, "xpu:0", [2, 3]]
    assert "Bool" in r[6]  # a float out= for a bool input: the same dtype error as every backend's unary op
