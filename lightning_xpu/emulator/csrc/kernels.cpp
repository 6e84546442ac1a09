// The kernels registered for the XPU dispatch key: creation, copies (transfers, non_blocking ones deferred), views,
// resize, the set_ family, record_stream, and operators whose CPU path does not fit a device (convolution, fused
// RNN cells, dropout; scaled_dot_product_attention is sdpa.cpp's).

#include "emulator.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

namespace xpu_emu {

// ---------------------------------------------------------------- kernels
// As the empty kernels of every backend: under torch.use_deterministic_algorithms(True) with
// torch.utils.deterministic.fill_uninitialized_memory (the default), new memory is NaN (floats) or the largest value.
at::Tensor fill_if_deterministic(at::Tensor t) {
  auto& ctx = at::globalContext();
  if (C10_UNLIKELY(ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory()))
    at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> mf) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "Non strided layout not supported on xpu");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return fill_if_deterministic(at::detail::empty_generic(size, &allocator, c10::DispatchKeySet(c10::DispatchKey::XPU),
                                                         c10::dtype_or_default(dtype), mf));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "Non strided layout not supported on xpu");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return fill_if_deterministic(at::detail::empty_strided_generic(
      size, stride, &allocator, c10::DispatchKeySet(c10::DispatchKey::XPU), c10::dtype_or_default(dtype)));
}

bool is_fp64(c10::ScalarType st) { return st == at::kDouble || st == at::kComplexDouble; }

thread_local bool tl_in_fallback = false;  // copies made by torch's cpu_fallback are not "transfers"

void count_copy(const at::Tensor& src, const at::Tensor& dst) {
  if (tl_in_fallback) return;
  auto bytes = static_cast<int64_t>(dst.numel() * dst.element_size());
  if (is_xpu(src) && is_xpu(dst)) { counters.d2d++; counters.d2d_bytes += bytes; }
  else if (is_xpu(dst)) { counters.h2d++; counters.h2d_bytes += bytes; }
  else { counters.d2h++; counters.d2h_bytes += bytes; }
}

void poison(const at::Tensor& t) {
  if (t.is_contiguous()) {
    std::memset(t.data_ptr(), kPoison, t.nbytes());
  } else {
    auto p = at::empty_like(t, at::MemoryFormat::Contiguous);
    std::memset(p.data_ptr(), kPoison, p.nbytes());
    t.copy_(p);
  }
}

// Whether torch-xpu-ops' copy (Copy.cpp) launches a kernel on the device: within the device unless it is a memcpy
// (same dtype, contiguous); between host and device only to make the device side contiguous, or to convert the
// dtype of a non_blocking device-to-host copy (blocking transfers convert on the host).
bool copy_runs_device_kernel(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  const bool same_dtype = src.scalar_type() == dst.scalar_type();
  if (is_xpu(src) && is_xpu(dst)) return !(same_dtype && src.is_contiguous() && dst.is_contiguous());
  const at::Tensor& on_device = is_xpu(src) ? src : dst;
  return !on_device.is_contiguous() || (is_xpu(src) && non_blocking && !same_dtype);
}

// Without native fp64, a build with -fsycl-fp64-conv-emu (PyTorch's wheels) still converts to and from fp64;
// without the flag (LIGHTNING_XPU_EMULATOR_FP64_CONV_EMU=0) any copy kernel that touches fp64 raises.
void check_fp64_copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  if (config.has_fp64 || config.fp64_conversion_emulation || tl_in_fallback) return;
  if (!is_fp64(src.scalar_type()) && !is_fp64(dst.scalar_type())) return;
  TORCH_CHECK(!copy_runs_device_kernel(src, dst, non_blocking), "Required aspect fp64 is not supported on the device (",
              config.name, " has no native fp64, and this build lacks -fsycl-fp64-conv-emu; operator aten::copy_)");
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  check_not_bad_fork();
  TORCH_CHECK(self.defined() && dst.defined(), "copy_: undefined tensor");
  check_fp64_copy(self, dst, non_blocking);
  count_copy(self, dst);
  HostViews hv;
  at::Tensor d = hv.to_cpu(dst);
  at::Tensor s = hv.to_cpu(self);
  if (config.async && !tl_in_fallback) {
    const bool d2h = is_xpu(self) && !is_xpu(dst), h2d = !is_xpu(self) && is_xpu(dst);
    const auto dev = is_xpu(self) ? self.device().index() : dst.device().index();
    const auto stream = current_stream_id(dev);
    if (d2h && non_blocking) {
      // The copy is enqueued: the destination holds poison until the stream completes, then the values the
      // device had now.
      auto values = at::empty_like(d);
      values.copy_(s);
      poison(d);
      defer(dev, stream, d, values);
      sanitizer_access(self, false, "aten::copy_", "src");
      return dst;
    }
    auto seq = enqueue(dev, stream);
    for (const auto* t : {&self, &dst})
      if (is_xpu(*t) && t->device().index() == dev) sanitizer_access(*t, t == &dst, "aten::copy_", t == &dst ? "self" : "src");
    if ((d2h || h2d) && !non_blocking) complete(dev, stream, seq);  // a blocking copy waits for its stream
  }
  d.copy_(s, non_blocking);  // host memory on both sides: a CPU copy (with dtype conversion)
  return dst;
}

// Registered as copy_ itself: torch's generic copy_ would hand xpu tensors to a CPU DispatchStub.
at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  copy_from(src, self, non_blocking);
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  check_not_bad_fork();
  counters.item++;
  const auto dev = self.device().index();
  complete(dev, current_stream_id(dev), enqueue(dev, current_stream_id(dev)));  // a blocking read of one value
  sanitizer_access(self, false, "aten::_local_scalar_dense", "self");
  HostViews hv;
  return at::native::_local_scalar_dense_cpu(hv.to_cpu(self));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> mf) {
  const c10::DeviceGuard guard(self.device());  // new storage is booked on the tensor's device
  return at::native::resize_(self, size, mf);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage src, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  const c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(src), offset, size, stride);  // device-agnostic body
}

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage st(c10::Storage::use_byte_size_t(), 0, &allocator, true);
  return set_storage(self, st, 0, {0}, {});
}

// The caching allocator keeps the block from its stream's next allocations until s's work so far is done; here
// memory is never reused while deferred work holds it, so only the stream sanitizer needs to know.
void record_stream(at::Tensor& self, c10::Stream s) { allocator.recordStream(self.storage().data_ptr(), s); }
void record_data_ptr_on_stream(const c10::DataPtr& dp, const c10::Stream& s) { allocator.recordStream(dp, s); }

// A CPU result placed in new memory on `like`'s xpu device.
at::Tensor on_device_of(const at::Tensor& cpu, const at::Tensor& like) {
  if (!cpu.defined()) return cpu;
  auto out = empty_strided(cpu.sizes(), cpu.strides(), cpu.scalar_type(), std::nullopt, like.device(), std::nullopt);
  HostViews hv;
  hv.to_cpu(out).copy_(cpu);
  return out;
}

// The checks the fallback makes for every operator, for kernels that bypass it.
void check_operands(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  check_not_bad_fork();
  const at::Tensor* first = nullptr;
  for (const auto* t : tensors) {
    if (!t->defined()) continue;
    if (first == nullptr) first = t;
    TORCH_CHECK(t->device() == first->device(), "Expected all tensors to be on the same device, but found at least "
                "two devices, ", first->device(), " and ", t->device(), "! (in ", op, ")");
    TORCH_CHECK(config.has_fp64 || !is_fp64(t->scalar_type()),
                "Required aspect fp64 is not supported on the device (", config.name, " has no native fp64; operator ",
                op, ")");
  }
}

// torch internals: at::_convolution sends devices other than CPU/CUDA to convolution_overrideable, which has no
// CPU kernel for the fallback to run; compute it (and its backward) with the CPU convolution on host views.
at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                    bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  static const at::Tensor none;
  check_operands("aten::convolution_overrideable", {&input, &weight, bias ? &*bias : &none});
  HostViews hv;
  std::optional<at::Tensor> b = bias && bias->defined() ? std::optional<at::Tensor>(hv.to_cpu(*bias)) : std::nullopt;
  auto out = at::convolution(hv.to_cpu(input), hv.to_cpu(weight), b, stride, padding, dilation, transposed,
                             output_padding, groups);
  return on_device_of(out, input);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  check_operands("aten::convolution_backward_overrideable", {&grad_output, &input, &weight});
  HostViews hv;
  std::vector<int64_t> bias_sizes{weight.size(transposed ? 1 : 0) * (transposed ? groups : 1)};
  auto [gi, gw, gb] = at::convolution_backward(hv.to_cpu(grad_output), hv.to_cpu(input), hv.to_cpu(weight),
                                               output_mask[2] ? at::OptionalIntArrayRef(bias_sizes) : std::nullopt,
                                               stride, padding, dilation, transposed, output_padding, groups,
                                               output_mask);
  return {on_device_of(gi, input), on_device_of(gw, input), on_device_of(gb, input)};
}

// torch internals: LSTM/GRU cells on non-CPU devices call fused cell kernels that only CUDA and XPU builds
// have. These compute the same cell from ordinary (fallback) operators on the xpu tensors; the workspace
// layouts are private to the forward/backward pairs below (and match the CUDA kernels': activated gates).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                               const at::Tensor& cx, const std::optional<at::Tensor>& ib,
                                                               const std::optional<at::Tensor>& hb) {
  auto gates = input_gates + hidden_gates;
  if (ib && ib->defined()) gates = gates + *ib;
  if (hb && hb->defined()) gates = gates + *hb;
  auto c = gates.chunk(4, 1);
  auto i = c[0].sigmoid(), f = c[1].sigmoid(), g = c[2].tanh(), o = c[3].sigmoid();
  auto cy = f * cx + i * g;
  auto hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  bool has_hy = grad_hy && grad_hy->defined(), has_cy = grad_cy && grad_cy->defined();
  if (!has_hy && !has_cy) return {at::Tensor(), at::Tensor(), at::Tensor()};
  auto w = workspace.chunk(4, 1);
  auto &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  auto tanh_cy = cy.tanh();
  auto gcx = has_cy ? grad_cy->clone() : at::zeros_like(cx);
  auto go = at::zeros_like(o);
  if (has_hy) {
    gcx = gcx + *grad_hy * o * (1 - tanh_cy * tanh_cy);
    go = *grad_hy * tanh_cy * o * (1 - o);
  }
  auto gi = gcx * g * i * (1 - i);
  auto gf = gcx * cx * f * (1 - f);
  auto gg = gcx * i * (1 - g * g);
  auto grad_gates = at::cat({gi, gf, gg, go}, 1);
  return {grad_gates, gcx * f, has_bias ? grad_gates.sum(0) : at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& ib,
                                                  const std::optional<at::Tensor>& hb) {
  auto ig = ib && ib->defined() ? input_gates + *ib : input_gates;
  auto hg = hb && hb->defined() ? hidden_gates + *hb : hidden_gates;
  auto a = ig.chunk(3, 1), b = hg.chunk(3, 1);
  auto r = (a[0] + b[0]).sigmoid(), z = (a[1] + b[1]).sigmoid();
  auto n = (a[2] + r * b[2]).tanh();
  auto hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, b[2]}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(5, 1);
  auto &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  auto gn = grad_hy * (1 - z) * (1 - n * n);
  auto gz = grad_hy * (hx - n) * z * (1 - z);
  auto gr = gn * hn * r * (1 - r);
  auto grad_input = at::cat({gr, gz, gn}, 1);
  auto grad_hidden = at::cat({gr, gz, gn * r}, 1);
  return {grad_input, grad_hidden, grad_hy * z, has_bias ? grad_input.sum(0) : at::Tensor(),
          has_bias ? grad_hidden.sum(0) : at::Tensor()};
}

// CPU's native_dropout draws its mask from the CPU default generator (it has no generator argument); on XPU it
// draws from the device's. Composed of xpu operators, its bernoulli_ goes through the fallback's xpu generator.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) return std::make_tuple(input, at::empty_like(input));
  if (train.has_value() && !*train)
    return std::make_tuple(input.clone(), at::ones_like(input, input.options().dtype(at::kBool)));
  const double p1m = 1. - p;
  const double scale = p1m == 0 ? 0. : 1. / p1m;
  auto mask = at::empty_like(input, input.options().dtype(at::kBool)).bernoulli_(p1m);
  return std::make_tuple(input.mul(mask).mul_(scale), mask);
}

// abs on bool: torch-xpu-ops' abs_kernel dispatches Bool (AbsKernel.cpp: the identity), CPU's abs has no Bool kernel,
// so running the CPU kernel would refuse what an XPU build runs. Bool tensors run as abs of the same bytes read as
// uint8 (the identity too), through the fallback: its device checks, stream model and sanitizer stay in force.
void abs_out(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto& self = (*stack)[stack->size() - 2];
  auto& out = (*stack)[stack->size() - 1];
  if (!self.isTensor() || !out.isTensor() || self.toTensor().scalar_type() != at::kBool ||
      out.toTensor().scalar_type() != at::kBool) {
    fallback(op, stack);  // every other dtype, and the dtype errors of a mismatched out, as the CPU kernel gives them
    return;
  }
  at::Tensor result = out.toTensor();
  at::native::resize_output(result, self.toTensor().sizes());
  self = self.toTensor().view(at::kByte);
  out = result.view(at::kByte);
  fallback(op, stack);
  stack->back() = result;  // abs.out returns `out` itself
}

}  // namespace xpu_emu

// torch internals: the XPU dispatch key has no kernels in a CPU build; these fill it.
TORCH_LIBRARY_IMPL(aten, XPU, m) {
  using namespace xpu_emu;
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", resize_);
  m.impl("copy_", copy_);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Storage", at::native::set_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Tensor", at::native::set_tensor_);
  m.impl("set_", set_empty);
  m.impl("record_stream", record_stream);
  m.impl("native_dropout", native_dropout);
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
  m.impl("_thnn_fused_lstm_cell", fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward_impl);
  m.impl("_thnn_fused_gru_cell", fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", fused_gru_cell_backward);
  m.impl("abs.out", torch::CppFunction::makeFromBoxedFunction<&abs_out>());
}
