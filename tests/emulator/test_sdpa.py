"""scaled_dot_product_attention chooses its backend as torch 2.13's XPU build does (csrc/sdpa.cpp)."""

from __future__ import annotations

import json

import pytest

# Runs `cases` (name -> (backends for sdpa_kernel or None, dtype, head dim, requires_grad, dropout)) and prints, per
# case, "ok" or the error's first line, with the warnings it raised.
_CASES = """
import json, warnings, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

def attend(backends, dtype, head_dim, grad, dropout):
    q = torch.randn(2, 4, 8, head_dim, device="xpu", dtype=getattr(torch, dtype)).requires_grad_(grad)
    if backends is None:
        return F.scaled_dot_product_attention(q, q, q, dropout_p=dropout)
    with sdpa_kernel([getattr(SDPBackend, b) for b in backends]):
        return F.scaled_dot_product_attention(q, q, q, dropout_p=dropout)

results = {}
for name, case in CASES.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = attend(*case)
            result = "ok" if out.device.type == "xpu" else str(out.device)
        except RuntimeError as e:
            result = str(e).splitlines()[0]
    results[name] = [result, [str(w.message).split(" (Triggered internally")[0] for w in caught]]
print(json.dumps(results))
"""


def _run(run_emulated, cases, profile=None, prelude=""):
    out = run_emulated(f"import torch\n{prelude}\nCASES = {cases!r}\n{_CASES}", profile=profile)
    return json.loads(out.strip().splitlines()[-1])


NO_KERNEL = "No available kernel. Aborting execution."


def test_default_flags_always_find_a_backend(run_emulated):
    """With every backend enabled (the default), math takes whatever the fused kernels refuse, without a warning."""
    cases = {
        "fp32_training": (None, "float32", 16, True, 0.0),
        "bf16_inference": (None, "bfloat16", 64, False, 0.0),
        "dropout": (None, "float32", 16, True, 0.1),
        "large_head": (None, "float32", 1024, False, 0.0),
    }
    assert _run(run_emulated, cases) == {name: ["ok", []] for name in cases}


def test_backends_xpu_lacks_are_refused(run_emulated):
    """cuDNN does not exist on XPU; with only it allowed, the choice fails before any kernel is tried."""
    r = _run(run_emulated, {"cudnn": (["CUDNN_ATTENTION"], "float32", 16, False, 0.0)})
    assert r["cudnn"] == [
        "No viable backend for scaled_dot_product_attention was found. This is likely due to turning off both the "
        "math kernel and the overrideable kernels.",
        [],
    ]


def test_efficient_attention_runs_as_math_when_its_constraints_hold(run_emulated):
    cases = {
        "aligned": (["EFFICIENT_ATTENTION"], "float32", 8, False, 0.0),
        "unaligned": (["EFFICIENT_ATTENTION"], "float32", 6, False, 0.0),
    }
    r = _run(run_emulated, cases)
    assert r["aligned"] == [
        "ok",
        ["SDPA Memory Efficient Attention backend is not supported on XPU, falling back to math backend."],
    ]
    result, warned = r["unaligned"]
    assert result == NO_KERNEL
    # the reasons, backend by backend, as torch's XPU selection warns them
    assert warned[0] == "Flash attention kernel not used because:"
    assert warned[1].startswith("FlashAttentionXPU expected query, key, and value to all be of dtype: {bfloat16, half}")
    assert warned[2:5] == [
        "Overrideable attention kernel not used because:",
        "CuDNN attention kernel not used because:",
        "XPU don't support SDPA cudnn attention backend.",
    ]
    assert warned[5] == "Memory Efficient attention kernel not used because:"
    assert warned[6].startswith("Mem efficient attention requires last dimension of inputs to be divisible by 4.")


@pytest.mark.parametrize("profile", ["max1550", "b580", "arc-a770", "lnl"])
def test_flash_attention_needs_half_precision_and_a_supported_architecture(run_emulated, profile):
    cases = {
        "fp32": (["FLASH_ATTENTION"], "float32", 64, False, 0.0),
        "bf16": (["FLASH_ATTENTION"], "bfloat16", 64, True, 0.0),
        "bf16_head_256": (["FLASH_ATTENTION"], "bfloat16", 256, False, 0.0),
        "bf16_dropout": (["FLASH_ATTENTION"], "bfloat16", 64, False, 0.1),
    }
    r = _run(run_emulated, cases, profile=profile)
    architecture = "XPU device architecture does not support flash attention."
    supported = profile in ("max1550", "b580")  # intel_gpu_pvc, intel_gpu_bmg_g21
    if supported:
        assert r["bf16"] == ["ok", []]  # training included: sycl-tla has a backward
    else:
        assert r["bf16"][0] == NO_KERNEL
        assert r["bf16"][1][1].startswith(architecture)
    for name in ("fp32", "bf16_head_256", "bf16_dropout"):
        assert r[name][0] == NO_KERNEL
    expected_reasons = {
        "fp32": "FlashAttentionXPU expected query, key, and value to all be of dtype",
        "bf16_head_256": "FlashAttentionXPU supports head dimension up to 192. Got head dimension: 256 instead.",
        "bf16_dropout": "Both fused kernels do not support non-zero dropout.",
    }
    for name, reason in expected_reasons.items():
        flash_reason = r[name][1][1]
        assert flash_reason.startswith(reason if supported else architecture), (name, flash_reason)


def test_overrideable_is_onednn_for_inference_only(run_emulated):
    cases = {
        "inference": (["OVERRIDEABLE"], "float32", 16, False, 0.0),
        "training": (["OVERRIDEABLE"], "float32", 16, True, 0.0),
        "dropout": (["OVERRIDEABLE"], "float32", 16, False, 0.1),
        "float64": (["OVERRIDEABLE"], "float64", 16, False, 0.0),
    }
    r = _run(run_emulated, cases)
    assert r["inference"] == ["ok", []]
    reasons = {
        "training": "Backward or grad to be supported.",
        "dropout": "Both fused kernels do not support non-zero dropout.",
        "float64": "Expected query, key and value to all be of dtype: {Float, BFloat16, Half}",
    }
    for name, reason in reasons.items():
        result, warned = r[name]
        assert result == NO_KERNEL
        onednn = warned[warned.index("Overrideable attention kernel not used because:") + 1]
        assert onednn.startswith(reason), (name, onednn)


def test_global_flags_and_determinism_are_honoured(run_emulated):
    """Without math and memory-efficient attention (which XPU runs as math), fp32 training has no kernel on XPU
    (oneDNN is inference-only, flash needs half precision); deterministic algorithms rule flash out."""
    r = _run(
        run_emulated,
        {"fp32_training": (None, "float32", 16, True, 0.0), "bf16_training": (None, "bfloat16", 16, True, 0.0)},
        prelude="torch.backends.cuda.enable_math_sdp(False); torch.backends.cuda.enable_mem_efficient_sdp(False)",
    )
    assert r["fp32_training"][0] == NO_KERNEL
    assert r["bf16_training"] == ["ok", []]  # flash
    r = _run(
        run_emulated,
        {"bf16_training": (["FLASH_ATTENTION"], "bfloat16", 16, True, 0.0)},
        prelude="torch.use_deterministic_algorithms(True)",
    )
    assert r["bf16_training"][0] == NO_KERNEL
    assert r["bf16_training"][1][1] == "Flash attention XPU is not deterministic."
