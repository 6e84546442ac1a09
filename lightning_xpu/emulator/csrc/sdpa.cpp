// scaled_dot_product_attention: the backend choice of torch 2.13's XPU build, then the math kernel.
//
// An XPU build asks `_fused_sdp_choice_stub` for a backend: select_sdp_backend_xpu in PyTorch's
// aten/src/ATen/native/mkldnn/xpu/Attention.cpp and the flash checks of aten/src/ATen/native/transformers/xpu/
// sdp_utils.cpp, read in the versions whose declarations match the 2.13 wheel's headers (checks that take
// `bool debug`, sycl-tla flash attention). It tries OVERRIDEABLE (oneDNN), FLASH_ATTENTION (sycl-tla), MATH, then
// EFFICIENT_ATTENTION (accepted, but run as MATH with a warning); CUDNN_ATTENTION never fits. Each is tried only where
// `torch.backends.cuda.enable_*_sdp` / `sdpa_kernel` leave it enabled and its constraints hold; when none fits, it
// warns why each was rejected and raises "No available kernel. Aborting execution.". The generic checks are torch's
// own (sdp_utils_cpp.h of the build compiled against), the XPU-specific ones are modelled here. Whatever is chosen,
// the math kernel runs (the CPU's numerics, never Intel's).

#include "emulator.h"

#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_scaled_dot_product_attention_math.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <mutex>

namespace xpu_emu {
namespace {

using sdp::sdp_params;
using Backend = sdp::SDPBackend;

// ---------------------------------------------------------------- OVERRIDEABLE (oneDNN)
bool onednn_head_dims(const sdp_params& p, bool debug) {
  const auto q = p.query.sym_size(-1), k = p.key.sym_size(-1), v = p.value.sym_size(-1);
  if (q != k) {
    if (debug)
      TORCH_WARN("OneDNN attention requires q,k to have the same last dimension.", " Got Query.size(-1): ", q,
                 ", Key.size(-1): ", k, " instead.");
    return false;
  }
  constexpr int kMaxHeadDim = 576;
  if (q.max(v) > kMaxHeadDim) {
    if (debug)
      TORCH_WARN("OneDNN attention requires q,k,v to have head dimension less than ", kMaxHeadDim, ". Got ",
                 q.max(v), " instead.");
    return false;
  }
  return true;
}

// The oneDNN kernel is forward-only on XPU: inputs that require grad under grad mode go elsewhere.
bool onednn_no_grad(const sdp_params& p, bool debug) {
  const bool needs_grad = at::GradMode::is_enabled() &&
                          (p.query.requires_grad() || p.key.requires_grad() || p.value.requires_grad());
  if (debug && needs_grad) TORCH_WARN("Backward or grad to be supported.");
  return !needs_grad;
}

bool can_use_onednn(const sdp_params& p, bool debug) {
  constexpr std::array<bool (*)(const sdp_params&, bool), 9> constraints{
      sdp::check_nested_tensor,
      sdp::check_for_dropout,
      sdp::check_tensor_shapes,
      sdp::check_batch_size_and_num_heads_dense<true /*supports GQA*/>,
      sdp::check_attn_mask_shape,
      sdp::check_nonzero_sequence_lengths_dense,
      sdp::check_last_dim_stride_equals_1_dense<false /*ignore_singleton_dim*/>,
      onednn_head_dims,
      onednn_no_grad};
  for (auto constraint : constraints)
    if (!constraint(p, debug)) return false;
  constexpr std::array<at::ScalarType, 3> dtypes{at::kFloat, at::kBFloat16, at::kHalf};
  return sdp::check_tensor_dtype(p, dtypes, debug);
}

// ---------------------------------------------------------------- FLASH_ATTENTION (sycl-tla)
// SYCL architecture ids (as _profiles.py's): intel_gpu_pvc, intel_gpu_pvc_vg, intel_gpu_bmg_g21.
constexpr std::array<int64_t, 3> kFlashArchitectures{0x030F0007, 0x030F4007, 0x05004000};

bool flash_hardware(const sdp_params&, bool debug) {
  if (std::find(kFlashArchitectures.begin(), kFlashArchitectures.end(), config.architecture) !=
      kFlashArchitectures.end())
    return true;
  if (debug)
    TORCH_WARN("XPU device architecture does not support flash attention. Supported architectures are: "
               "intel_gpu_pvc, intel_gpu_pvc_vg, intel_gpu_bmg_g21.");
  return false;
}

bool flash_causal_square(const sdp_params& p, bool debug) {
  if (!p.is_causal || p.query.sym_size(-2) == p.key.sym_size(-2)) return true;
  if (debug)
    TORCH_WARN("Flash attention XPU does not support the is_causal flag when seqlen_q != seqlen_k. ",
               "Got seqlen_q: ", p.query.sym_size(-2), " seqlen_k: ", p.key.sym_size(-2),
               ". If you would like to use causal attention with non-square masks, please see CausalAttnMask.");
  return false;
}

bool flash_dtypes(const sdp_params& p, bool debug) {
  const auto dt = p.query.scalar_type();
  if (dt == p.key.scalar_type() && dt == p.value.scalar_type() && (dt == at::kBFloat16 || dt == at::kHalf))
    return true;
  if (debug)
    TORCH_WARN("FlashAttentionXPU expected query, key, and value to all be of dtype: {", "bfloat16, half",
               "}. Got ", "Query dtype: ", p.query.dtype(), ", Key dtype: ", p.key.dtype(),
               ", and Value dtype: ", p.value.dtype(), " instead.");
  return false;
}

bool flash_head_dims(const sdp_params& p, bool debug) {
  const auto q = p.query.size(-1), k = p.key.size(-1), v = p.value.size(-1);
  if (q != k || q != v) {
    if (debug)
      TORCH_WARN("FlashAttentionXPU requires q,k,v to have the same last dimension.", " Got Query.size(-1): ", q,
                 ", Key.size(-1): ", k, ", Value.size(-1): ", v, " instead.");
    return false;
  }
  constexpr int64_t kMaxHeadDim = 192;
  if (q > kMaxHeadDim) {
    if (debug)
      TORCH_WARN("FlashAttentionXPU supports head dimension up to ", kMaxHeadDim, ". ", "Got head dimension: ", q,
                 " instead.");
    return false;
  }
  return true;
}

bool flash_nondeterministic_allowed(const sdp_params&, bool debug) {
  if (!at::globalContext().deterministicAlgorithms()) return true;
  if (debug) TORCH_WARN("Flash attention XPU is not deterministic.");
  return false;
}

// PyTorch's XPU wheels build the sycl-tla kernels (USE_SYCLTLA); sycl-tla accepts every layout, so the layout check
// always passes.
bool can_use_flash(const sdp_params& p, bool debug) {
  constexpr std::array<bool (*)(const sdp_params&, bool), 12> constraints{
      flash_hardware,
      sdp::check_for_attn_mask,
      sdp::check_for_dropout,
      sdp::check_nested_tensor,
      sdp::check_tensor_shapes,
      sdp::check_batch_size_and_num_heads_dense<true /*supports GQA*/>,
      sdp::check_nonzero_sequence_lengths_dense,
      sdp::check_last_dim_stride_equals_1_dense<false /*ignore_singleton_dim*/>,
      flash_causal_square,
      flash_dtypes,
      flash_head_dims,
      flash_nondeterministic_allowed};
  for (auto constraint : constraints)
    if (!constraint(p, debug)) return false;
  return true;
}

// ---------------------------------------------------------------- EFFICIENT_ATTENTION, CUDNN_ATTENTION
bool efficient_head_dims(const sdp_params& p, bool debug) {
  const bool half = p.query.scalar_type() == at::kHalf || p.query.scalar_type() == at::kBFloat16;
  const int64_t alignment = half ? 8 : 4;  // a 128-bit GEMM alignment in elements
  const auto q = p.query.sym_size(-1), k = p.key.sym_size(-1), v = p.value.sym_size(-1);
  if (q == k && q % alignment == 0 && q > 0 && v % alignment == 0 && v > 0) return true;
  if (debug)
    TORCH_WARN("Mem efficient attention requires last dimension of inputs to be divisible by ", alignment, ". ",
               "Got Query.size(-1): ", q, ", Key.size(-1): ", k, ", Value.size(-1): ", v, " instead.");
  return false;
}

// Nested tensors do not exist on the emulated XPU, so only the dense constraints apply.
bool can_use_efficient(const sdp_params& p, bool debug) {
  constexpr std::array<bool (*)(const sdp_params&, bool), 6> constraints{
      sdp::check_runtime_disabled_mem_efficient,
      sdp::check_tensor_shapes,
      efficient_head_dims,
      sdp::check_nonzero_sequence_lengths_dense,
      sdp::check_last_dim_stride_equals_1_dense<false>,
      sdp::check_batch_size_and_num_heads_dense<false>};
  for (auto constraint : constraints)
    if (!constraint(p, debug)) return false;
  return true;
}

bool can_use_cudnn(const sdp_params&, bool debug) {
  if (debug) TORCH_WARN("XPU don't support SDPA cudnn attention backend.");
  return false;
}

// As XPU's priority_order(): its default order is written into the global context on the first choice, so a later
// `sdpa_kernel(..., set_priority=True)` reorders it.
std::array<Backend, sdp::num_backends> priority_order() {
  static std::once_flag once;
  std::call_once(once, [] {
    at::globalContext().setSDPPriorityOrder(
        {static_cast<int64_t>(Backend::overrideable), static_cast<int64_t>(Backend::flash_attention),
         static_cast<int64_t>(Backend::math), static_cast<int64_t>(Backend::efficient_attention),
         static_cast<int64_t>(Backend::cudnn_attention)});
  });
  return at::globalContext().sDPPriorityOrder();
}

Backend select_backend(const sdp_params& p) {
  auto& ctx = at::globalContext();
  TORCH_CHECK(ctx.userEnabledMathSDP() || ctx.userEnabledOverrideableSDP() || ctx.userEnabledFlashSDP() ||
                  ctx.userEnabledMemEfficientSDP(),
              "No viable backend for scaled_dot_product_attention was found. ",
              "This is likely due to turning off both the math kernel and the overrideable kernels.");
  for (auto backend : priority_order()) {
    switch (backend) {
      case Backend::overrideable:
        if (ctx.userEnabledOverrideableSDP() && can_use_onednn(p, false)) return backend;
        break;
      case Backend::flash_attention:
        if (ctx.userEnabledFlashSDP() && can_use_flash(p, false)) return backend;
        break;
      case Backend::math:
        if (ctx.userEnabledMathSDP()) return backend;
        break;
      case Backend::efficient_attention:
        if (ctx.userEnabledMemEfficientSDP() && can_use_efficient(p, false)) {
          TORCH_WARN_ONCE("SDPA Memory Efficient Attention backend is not supported on XPU, falling back to math "
                          "backend.");
          return Backend::math;
        }
        break;
      case Backend::cudnn_attention:
        break;  // never available on XPU
      default:
        TORCH_CHECK(false, "Invalid backend");
    }
  }
  TORCH_WARN("Flash attention kernel not used because:");
  can_use_flash(p, true);
  TORCH_WARN("Overrideable attention kernel not used because:");
  can_use_onednn(p, true);
  TORCH_WARN("CuDNN attention kernel not used because:");
  can_use_cudnn(p, true);
  TORCH_WARN("Memory Efficient attention kernel not used because:");
  can_use_efficient(p, true);
  TORCH_CHECK(false, "No available kernel. Aborting execution.");
}

// torch internals: scaled_dot_product_attention asks a DispatchStub for the fused kernel of the query's device
// type, which asserts for XPU on a CPU build. Registered for AutogradXPU, the choice is made here and the math
// implementation (itself a composite of differentiable ops) runs.
at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                                        std::optional<double> scale, bool enable_gqa) {
  select_backend(sdp_params{q, k, v, mask, dropout_p, is_causal, enable_gqa});
  return std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, mask, dropout_p, is_causal, std::nullopt,
                                                            scale, enable_gqa));
}

}  // namespace
}  // namespace xpu_emu

TORCH_LIBRARY_IMPL(aten, AutogradXPU, m) {
  m.impl("scaled_dot_product_attention", xpu_emu::scaled_dot_product_attention);
}
