// The kernels of SyncBatchNorm (torch/nn/modules/_functions.py): batch_norm_stats,
// batch_norm_gather_stats(_with_counts), batch_norm_elemt, batch_norm_backward_reduce and batch_norm_backward_elemt.
// CUDA and XPU builds have them, the CPU none, so the fallback could not run them where an Intel GPU does.
//
// Each is composed of ordinary xpu operators (which go through the fallback: device checks, the stream model and the
// sanitizer see every access), with the semantics of torch-xpu-ops release/2.13's src/ATen/native/xpu/sycl/
// BatchNormKernels.cpp: statistics in the accumulate type (float for half and bfloat16 inputs), invstd =
// 1 / sqrt(biased var + eps), outputs in the dtypes its kernels allocate, and the dtype checks its tensor accessors
// make (a tensor read as another dtype raises "expected scalar type X but found Y").

#include "emulator.h"

#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

namespace xpu_emu {
namespace {

at::ScalarType acc_type(at::ScalarType st) { return at::toAccumulateType(st, c10::DeviceType::XPU); }

bool is_reduced_float(at::ScalarType st) { return st == at::kHalf || st == at::kBFloat16; }

// AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16, ...) of the XPU kernel.
void check_floating(at::ScalarType st, const char* kernel) {
  TORCH_CHECK_NOT_IMPLEMENTED(st == at::kFloat || st == at::kDouble || is_reduced_float(st), '"', kernel,
                              "\" not implemented for '", c10::toString(st), "'");
}

// A tensor accessor the kernel builds for `t` as dtype `st` (nothing for an undefined tensor: a dummy accessor).
void check_read_as(const at::Tensor& t, at::ScalarType st) {
  if (!t.defined()) return;
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kHalf, at::kBFloat16, at::kInt, st, "batch_norm accessor",
                                  [&] { (void)t.const_data_ptr<scalar_t>(); });
}

void check_same_stats_dtype(const at::Tensor& mean, const at::Tensor& invstd) {
  TORCH_CHECK(mean.dtype() == invstd.dtype(), "mean and invstd need to have the same data types");
}

at::Tensor defined_or_none(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// The input as (N, C, L) in the accumulate type: the kernels merge the feature dimensions.
at::Tensor as_ncl(const at::Tensor& t, at::ScalarType acc) { return t.reshape({t.size(0), t.size(1), -1}).to(acc); }

// A per-channel vector shaped to broadcast over (N, C, L).
at::Tensor per_channel(const at::Tensor& v, at::ScalarType acc) { return v.to(acc).view({1, -1, 1}); }

// is_mixed_type of the XPU kernels: a defined parameter of another dtype than the input makes the statistics and
// parameters the accumulate type.
bool mixed_type(const at::Tensor& input, const at::Tensor& parameter) {
  return parameter.defined() && parameter.scalar_type() != input.scalar_type();
}

bool uses_channels_last_kernels(const at::Tensor& t) {
  return t.is_contiguous(at::MemoryFormat::ChannelsLast) || t.is_contiguous(at::MemoryFormat::ChannelsLast3d) ||
         (t.is_contiguous() && t.strides()[1] == 1);
}

// invstd as the InvStd transform computes it: 0 where var and eps are both 0.
at::Tensor inv_std(const at::Tensor& var, double eps) {
  auto invstd = (var + eps).rsqrt();
  return eps == 0 ? at::where(var == 0, at::zeros_like(invstd), invstd) : invstd;
}

std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps) {
  check_floating(input.scalar_type(), "batch_norm_stats_xpu");
  const auto acc = acc_type(input.scalar_type());
  auto x = as_ncl(input, acc);
  auto mean = x.mean({0, 2});
  auto var = (x - mean.view({1, -1, 1})).square().mean({0, 2});
  return {mean, inv_std(var, eps)};
}

// (input - mean) * invstd * weight + bias in the accumulate type, written into `out` (input's dtype).
void elemt_into(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                const at::Tensor& mean, const at::Tensor& invstd) {
  check_floating(input.scalar_type(), "batch_norm_elementwise_xpu");
  const auto st = input.scalar_type(), acc = acc_type(st);
  const auto stat = mixed_type(input, weight.defined() ? weight : bias) ? acc : st;
  check_read_as(weight, stat);
  check_read_as(bias, stat);
  check_read_as(mean, acc_type(stat));
  check_read_as(invstd, acc_type(stat));
  auto y = (as_ncl(input, acc) - per_channel(mean, acc)) * per_channel(invstd, acc);
  if (weight.defined()) y = y * per_channel(weight, acc);
  if (bias.defined()) y = y + per_channel(bias, acc);
  out.copy_(y.view(input.sizes()));
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                            double /*eps*/) {
  auto out = at::empty_like(input);
  elemt_into(out, input, defined_or_none(weight), defined_or_none(bias), mean, invstd);
  return out;
}

at::Tensor& batch_norm_elemt_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                 const at::Tensor& invstd, double /*eps*/, at::Tensor& out) {
  at::native::resize_output(out, input.sizes());
  elemt_into(out, input, defined_or_none(weight), defined_or_none(bias), mean, invstd);
  return out;
}

// Combines the per-rank means and invstds ([world, C]) weighted by their counts ([world]): the global mean and
// invstd from the biased variance; running_mean/var (optional) move by `momentum` towards the mean and the unbiased
// variance, in place.
std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats_with_counts(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean_opt, const std::optional<at::Tensor>& running_var_opt,
    double momentum, double eps, const at::Tensor& counts) {
  const auto running_mean = defined_or_none(running_mean_opt), running_var = defined_or_none(running_var_opt);
  const auto st = running_mean.defined() ? running_mean.scalar_type() : input.scalar_type();
  check_floating(st, "batch_norm_update_stats_kernel");
  const auto acc = acc_type(st);
  check_read_as(mean, acc);
  check_read_as(invstd, acc);
  check_read_as(running_mean, st);
  check_read_as(running_var, st);
  check_read_as(counts, st);
  auto n = counts.to(acc).view({-1, 1});
  auto total = n.sum(0);
  auto global_mean = (n * mean).sum(0) / total;
  auto rank_var = invstd.reciprocal().square() - eps;
  auto var_n = (n * (rank_var + (mean - global_mean).square())).sum(0);
  const auto out_dtype = is_reduced_float(mean.scalar_type()) ? at::kFloat : mean.scalar_type();
  auto global_invstd = (var_n / total + eps).rsqrt();
  if (running_mean.defined())
    running_mean.copy_(running_mean.to(acc) * (1 - momentum) + global_mean * momentum);
  if (running_var.defined())
    running_var.copy_(running_var.to(acc) * (1 - momentum) + var_n / (total - 1) * momentum);
  return {global_mean.to(out_dtype), global_invstd.to(out_dtype)};
}

std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats(const at::Tensor& input, const at::Tensor& mean,
                                                           const at::Tensor& invstd,
                                                           const std::optional<at::Tensor>& running_mean,
                                                           const std::optional<at::Tensor>& running_var,
                                                           double momentum, double eps, int64_t count) {
  const auto rm = defined_or_none(running_mean);
  auto counts = at::full({mean.size(0)}, count, input.options().dtype(rm.defined() ? rm.scalar_type()
                                                                                     : input.scalar_type()));
  return xpu_emu::batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps,
                                                      counts);
}

// Per channel: sum(dy), sum(dy * (x - mean)), and from them grad_weight = sum(dy * (x - mean)) * invstd and
// grad_bias = sum(dy), each only where its flag asks for it.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight_opt, bool input_g, bool weight_g, bool bias_g) {
  const auto weight = defined_or_none(weight_opt);
  check_floating(grad_out.scalar_type(), "batch_norm_backward_reduce_xpu");
  check_same_stats_dtype(mean, invstd);
  const auto st = grad_out.scalar_type(), acc = acc_type(st);
  check_read_as(input, st);
  check_read_as(mean, acc);
  check_read_as(invstd, acc);
  if (weight_g || bias_g) check_read_as(weight, mixed_type(input, weight) ? acc : st);  // grad_weight/grad_bias's dtype
  auto dy = as_ncl(grad_out, acc);
  auto sum_dy = dy.sum({0, 2});
  auto sum_dy_xmu = (dy * (as_ncl(input, acc) - per_channel(mean, acc))).sum({0, 2});
  const auto grad_options = weight.defined() ? weight.options() : mean.options();
  return {input_g ? sum_dy.to(mean.scalar_type()) : at::Tensor(),
          input_g ? sum_dy_xmu.to(mean.scalar_type()) : at::Tensor(),
          weight_g ? (sum_dy_xmu * invstd.to(acc)).to(grad_options.dtype()) : at::Tensor(),
          bias_g ? sum_dy.to(grad_options.dtype()) : at::Tensor()};
}

// grad_input = (dy - sum_dy / N - (x - mean) * invstd^2 * sum_dy_xmu / N) * invstd * weight, N the sum of the
// per-rank element counts (int32).
at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                                     const at::Tensor& invstd, const std::optional<at::Tensor>& weight_opt,
                                     const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu,
                                     const at::Tensor& count) {
  const auto weight = defined_or_none(weight_opt);
  check_floating(grad_out.scalar_type(), "batch_norm_backward_elemt_xpu");
  check_same_stats_dtype(mean, invstd);
  const auto st = grad_out.scalar_type(), acc = acc_type(st);
  const auto stat = is_reduced_float(st) && mean.scalar_type() == at::kFloat ? acc : st;
  check_read_as(input, st);
  check_read_as(weight, stat);
  for (const auto* t : {&mean, &invstd, &sum_dy, &sum_dy_xmu}) check_read_as(*t, acc);
  check_read_as(count, at::kInt);
  auto norm = count.to(at::kLong).sum().to(acc).reciprocal();
  auto m_invstd = per_channel(invstd, acc);
  auto scale = weight.defined() ? m_invstd * per_channel(weight, acc) : m_invstd;
  auto xmu_factor = m_invstd.square() * per_channel(sum_dy_xmu, acc) * norm;
  auto grad_in = (as_ncl(grad_out, acc) - per_channel(sum_dy, acc) * norm -
                  (as_ncl(input, acc) - per_channel(mean, acc)) * xmu_factor) * scale;
  auto out = at::empty_like(input, uses_channels_last_kernels(grad_out) && uses_channels_last_kernels(input)
                                       ? input.suggest_memory_format()
                                       : at::MemoryFormat::Contiguous);
  out.copy_(grad_in.view(input.sizes()));
  return out;
}

}  // namespace
}  // namespace xpu_emu

// torch internals: these operators have CUDA and XPU kernels but no CPU kernel for the fallback to run.
TORCH_LIBRARY_IMPL(aten, XPU, m) {
  using namespace xpu_emu;
  m.impl("batch_norm_stats", batch_norm_stats);
  m.impl("batch_norm_elemt", batch_norm_elemt);
  m.impl("batch_norm_elemt.out", batch_norm_elemt_out);
  m.impl("batch_norm_gather_stats", batch_norm_gather_stats);
  m.impl("batch_norm_gather_stats_with_counts", batch_norm_gather_stats_with_counts);
  m.impl("batch_norm_backward_reduce", batch_norm_backward_reduce);
  m.impl("batch_norm_backward_elemt", batch_norm_backward_elemt);
}
