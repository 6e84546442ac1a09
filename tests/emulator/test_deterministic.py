"""Under torch.use_deterministic_algorithms(True), operators alert as Intel's XPU kernels do (deterministic.cpp and
the table ci/gen_deterministic_alerts.py generates)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

TABLE = Path(__file__).resolve().parents[2] / "lightning_xpu" / "emulator" / "csrc" / "deterministic_alerts.inc"

# Each check prints [op, outcome]: "ok", or the first word of the RuntimeError (the XPU kernel's name in the alert).
_CHECK = """
import json, warnings, torch
import torch.nn.functional as F
def check(name, fn):
    try:
        fn()
        print(json.dumps([name, "ok"]))
    except RuntimeError as e:
        assert "does not have a deterministic implementation" in str(e), e
        print(json.dumps([name, str(e).split(" does not")[0]]))
"""


def _script(body: str) -> str:
    return _CHECK + textwrap.dedent(body)


def _outcomes(out: str) -> dict[str, str]:
    return dict(json.loads(line) for line in out.splitlines() if line.startswith("["))


def test_adaptive_avg_pool2d_backward_raises_as_on_xpu(run_emulated):
    out = run_emulated(_script(
        """
        torch.use_deterministic_algorithms(True)
        x = torch.randn(2, 3, 8, 8, device="xpu", requires_grad=True)
        y = F.adaptive_avg_pool2d(x, 3)  # the forward is deterministic
        try:
            y.sum().backward()
        except RuntimeError as e:
            print(json.dumps(str(e)))
        """
    ))
    message = json.loads(out)
    assert message.startswith(
        "adaptive_avg_pool2d_backward_xpu does not have a deterministic implementation, but you set "
        "'torch.use_deterministic_algorithms(True)'."
    )


def test_warn_only_warns_and_computes_the_cpu_result(run_emulated):
    out = run_emulated(
        """
        import json, warnings, torch
        import torch.nn.functional as F
        torch.use_deterministic_algorithms(True, warn_only=True)
        def grad(device):
            x = torch.arange(2 * 3 * 7 * 7, dtype=torch.float32).reshape(2, 3, 7, 7).to(device).requires_grad_()
            (F.adaptive_avg_pool2d(x, 3) * torch.arange(9.0, device=device).reshape(3, 3)).sum().backward()
            return x.grad.cpu()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            xpu = grad("xpu")
        messages = [str(w.message) for w in caught]
        print(json.dumps([torch.equal(xpu, grad("cpu")),
                          [m.split(" does not")[0] for m in messages if "deterministic" in m]]))
        """
    )
    assert json.loads(out) == [True, ["adaptive_avg_pool2d_backward_xpu"]]


def test_nothing_alerts_with_deterministic_algorithms_off(run_emulated):
    out = run_emulated(_script(
        """
        warnings.simplefilter("error")
        x = torch.randn(1, 2, 8, 8, device="xpu", requires_grad=True)
        check("adaptive_avg_pool2d", lambda: F.adaptive_avg_pool2d(x, 3).sum().backward())
        check("kthvalue", lambda: torch.kthvalue(torch.randn(5, device="xpu"), 2))
        check("bincount", lambda: torch.bincount(torch.tensor([0, 0], device="xpu"), torch.ones(2, device="xpu")))
        check("put_", lambda: torch.zeros(3, device="xpu").put_(torch.tensor([0, 0], device="xpu"),
                                                                 torch.ones(2, device="xpu")))
        """
    ))
    assert set(_outcomes(out).values()) == {"ok"}


def test_conditional_alerts_follow_the_xpu_kernels_conditions(run_emulated):
    out = run_emulated(_script(
        """
        torch.use_deterministic_algorithms(True)
        i = torch.tensor([0, 0, 1], device="xpu")
        # _bincount_xpu alerts only with weights
        check("bincount", lambda: torch.bincount(i))
        check("bincount weights", lambda: torch.bincount(i, weights=torch.ones(3, device="xpu")))
        # nll_loss2d_forward_xpu: only when reducing
        logp = torch.randn(2, 3, 4, 4, device="xpu").log_softmax(1)
        target = torch.zeros(2, 4, 4, dtype=torch.long, device="xpu")
        check("nll_loss2d none", lambda: F.nll_loss(logp, target, reduction="none"))
        check("nll_loss2d mean", lambda: F.nll_loss(logp, target))
        # _histc_xpu: only for floating inputs
        check("histc", lambda: torch.histc(torch.randn(8, device="xpu")))
        # the max mode of embedding_bag's backward, reached inside PyTorch core's _embedding_bag_backward
        for mode in ("sum", "max"):
            w = torch.randn(3, 4, device="xpu", requires_grad=True)
            bags = torch.tensor([[0, 1], [1, 2]], device="xpu")
            check(f"embedding_bag {mode}", lambda: F.embedding_bag(bags, w, mode=mode).sum().backward())
        # index_reduce: every reduction alerts
        check("index_reduce", lambda: torch.zeros(3, device="xpu").index_reduce_(0, i, torch.ones(3, device="xpu"),
                                                                                 "amax"))
        # an empty grad_output skips adaptive_max_pool2d's backward kernel
        for n in (0, 2):
            x = torch.randn(n, 2, 6, 6, device="xpu", requires_grad=True)
            check(f"adaptive_max_pool2d {n}", lambda: F.adaptive_max_pool2d(x, 3).sum().backward())
        """
    ))
    assert _outcomes(out) == {
        "bincount": "ok",
        "bincount weights": "_bincount_xpu",
        "nll_loss2d none": "ok",
        "nll_loss2d mean": "nll_loss2d_forward_xpu",
        "histc": "_histc_xpu with floating point input",
        "embedding_bag sum": "ok",
        "embedding_bag max": "embedding_bag_backward_xpu_max",
        "index_reduce": "index_reduce_xpu",
        "adaptive_max_pool2d 0": "ok",
        "adaptive_max_pool2d 2": "adaptive_max_pool2d_backward_xpu",
    }


def test_the_operators_xpu_alerts_for_reach_the_fallback(run_emulated):
    out = run_emulated(_script(
        """
        torch.use_deterministic_algorithms(True)
        x = torch.randn(1, 2, 8, 8, device="xpu", requires_grad=True)
        check("upsample bicubic", lambda: F.interpolate(x, scale_factor=2, mode="bicubic").sum().backward())
        g = torch.randn(1, 2, 16, 16, device="xpu")
        check("upsample_bilinear2d_backward", lambda: torch.ops.aten.upsample_bilinear2d_backward(
            g, [16, 16], [1, 2, 8, 8], False))
        x1 = torch.randn(1, 2, 8, device="xpu", requires_grad=True)
        check("reflection_pad1d", lambda: F.pad(x1, (2, 2), mode="reflect").sum().backward())
        x3 = torch.randn(1, 1, 4, 4, 4, device="xpu", requires_grad=True)
        check("reflection_pad3d", lambda: F.pad(x3, (1, 1, 1, 1, 1, 1), mode="reflect").sum().backward())
        check("max_pool3d", lambda: F.max_pool3d(x3, 2).sum().backward())
        check("kthvalue", lambda: torch.kthvalue(torch.randn(5, device="xpu"), 2))
        check("median dim", lambda: torch.randn(5, device="xpu").median(0))
        check("grid_sample", lambda: F.grid_sample(x, torch.rand(1, 4, 4, 2, device="xpu") * 2 - 1,
                                                   align_corners=False).sum().backward())
        """
    ))
    assert _outcomes(out) == {
        "upsample bicubic": "upsample_bicubic2d_backward_out_xpu",
        "upsample_bilinear2d_backward": "upsample_bilinear2d_backward_out_xpu",
        "reflection_pad1d": "reflection_pad1d_backward_out_xpu",
        "reflection_pad3d": "reflection_pad3d_backward_out_xpu",
        "max_pool3d": "max_pool3d_with_indices_backward_xpu",
        "kthvalue": "kthvalue XPU",
        "median dim": "median XPU with indices output",
        "grid_sample": "grid_sampler_2d_backward_xpu",
    }


def test_deterministic_operators_never_alert(run_emulated):
    out = run_emulated(_script(
        """
        torch.use_deterministic_algorithms(True)
        a = torch.randn(4, 4, device="xpu", requires_grad=True)
        check("matmul add", lambda: (a @ a + a).sum().backward())
        conv = torch.nn.Conv2d(2, 2, 3).to("xpu")
        check("conv2d", lambda: conv(torch.randn(1, 2, 6, 6, device="xpu")).sum().backward())
        i = torch.tensor([0, 0, 1], device="xpu")
        src = torch.ones(3, device="xpu")
        # XPU takes deterministic paths for these (no alert in torch-xpu-ops): as on hardware
        check("index_add_", lambda: torch.zeros(3, device="xpu").index_add_(0, i, src))
        check("scatter_add_", lambda: torch.zeros(3, device="xpu").scatter_add_(0, i, src))
        check("index_put_ accumulate", lambda: torch.zeros(3, device="xpu").index_put_((i,), src, accumulate=True))
        check("median", lambda: torch.randn(5, device="xpu").median())
        x = torch.randn(1, 2, 8, 8, device="xpu", requires_grad=True)
        # torch.nn.functional decomposes these on any non-CPU device under deterministic algorithms
        check("interpolate bilinear", lambda: F.interpolate(x, scale_factor=2, mode="bilinear").sum().backward())
        check("pad replicate", lambda: F.pad(x, (1, 1, 1, 1), mode="replicate").sum().backward())
        """
    ))
    outcomes = _outcomes(out)
    assert len(outcomes) == 8 and set(outcomes.values()) == {"ok"}, outcomes


def test_every_table_row_fits_the_running_torch_and_reaches_the_fallback(run_emulated):
    """A row of an operator the dispatcher sends elsewhere (a composite kernel) would never alert: none is dead."""
    rows = re.findall(r'^\{"([\w:]+)", "(\w*)", "[^"]*", \d+, \{(.*)\}\},$', TABLE.read_text(), re.M)
    assert len(rows) > 40
    out = run_emulated(
        f"""
        import json, torch
        rows = {rows!r}
        bad = []
        for op, overload, conds in rows:
            if not op.startswith("aten::"):
                continue  # torchvision's operators exist only with torchvision
            full = op + ("." + overload if overload else "")
            try:
                schema = torch._C._get_schema(op, overload)
            except RuntimeError:
                bad.append(full + ": no such operator")
                continue
            names = {{a.name for a in schema.arguments}}
            for arg in __import__("re").findall(r'Cond::\\w+, \\w+, "(\\w+)"', conds):
                if arg not in names:
                    bad.append(f"{{full}}: no argument {{arg}}")
            xpu = torch._C._dispatch_has_kernel_for_dispatch_key(full, "XPU")
            composite = any(torch._C._dispatch_has_kernel_for_dispatch_key(full, k)
                            for k in ("CompositeImplicitAutograd", "CompositeExplicitAutograd"))
            if composite and not xpu:
                bad.append(full + ": a composite kernel runs instead of the fallback")
        print(json.dumps(bad))
        """
    )
    assert json.loads(out) == []
