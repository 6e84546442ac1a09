// The boxed fallback: every operator without an XPU kernel of the emulator's own runs as its CPU kernel on host views
// of the xpu tensors, with the device checks, fp64 aspect, determinism alerts, stream accesses and generators of the
// XPU; an operator that the modelled release has no XPU kernel for behaves as there (xpu_ops.cpp).

#include "emulator.h"

#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <algorithm>
#include <deque>
#include <unordered_set>

namespace xpu_emu {

// ---------------------------------------------------------------- fallback
// Every other operator runs as its CPU kernel on host views of the xpu tensors: no copies,
// in-place updates and views land in the device memory. New outputs are adopted by the
// emulated device (booked in its statistics, subject to its memory limit).

at::Tensor wrap_on_xpu(c10::Storage st, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(st), c10::DispatchKeySet(c10::DispatchKey::XPU), like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return at::Tensor(std::move(impl));
}

// The indexing operators take CPU index tensors (aten moves them to the device); their values and every other
// tensor must be on the device, as aten's device check and TensorIterator require.
bool allows_host_tensor(const c10::OperatorName& name, const std::string& arg) {
  static const std::vector<std::string> ops = {"aten::index", "aten::index_put_", "aten::index_put",
                                               "aten::_index_put_impl_", "aten::_unsafe_index",
                                               "aten::_unsafe_index_put"};
  return arg == "indices" && std::find(ops.begin(), ops.end(), name.name) != ops.end();
}

// device_checks.cpp, generated at build time from torch's native_functions.yaml (_build.py): the operators whose
// device check is left to their kernel (`device_check: NoCheck`, TensorIterator's operators among them).
extern const char* const kNoDeviceCheckOps[];
extern const size_t kNoDeviceCheckOpCount;

// torchgen gives every other operator's XPU kernel, as it gives CUDA's, a check that its positional and out tensor
// arguments share one device, 0-dim CPU tensors included (TensorIterator's operators take those as scalars).
// An `index` argument is one in the kernel too: TensorIterator restrides it like `self` (index_fill_), never a scalar.
bool checks_devices(const c10::OperatorName& name, const c10::Argument& arg) {
  if (arg.kwarg_only() && !arg.is_out()) return false;
  if (arg.name() == "index") return true;
  static const auto& no_check = *[] {
    auto* ops = new std::unordered_set<std::string>();
    for (size_t i = 0; i < kNoDeviceCheckOpCount; ++i) ops->insert(kNoDeviceCheckOps[i]);
    return ops;
  }();
  std::string key = name.name.substr(name.name.find("::") + 2);
  if (!name.overload_name.empty()) key += "." + name.overload_name;
  return no_check.count(key) == 0;
}

// A ScalarType argument (`dtype=torch.float64`): the kernel computes in that type.
bool is_fp64_dtype_argument(const c10::Argument& arg, const c10::IValue& v) {
  auto type = arg.type();
  if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
  return type->kind() == c10::TypeKind::ScalarTypeType && v.isInt() && is_fp64(static_cast<c10::ScalarType>(v.toInt()));
}

struct FallbackState {
  const c10::OperatorHandle& op;
  HostViews hv;
  std::optional<c10::DeviceIndex> device;
  std::string host_arg;  // a non-scalar CPU tensor argument, for the error message
  bool fp64 = false;
  explicit FallbackState(const c10::OperatorHandle& o) : op(o) {}

  void note(const at::Tensor& t, const c10::Argument& argument) {
    if (!t.defined()) return;
    const auto& arg = argument.name();
    if (is_xpu(t)) {
      auto d = t.device().index();
      TORCH_CHECK(!device || *device == d,
                  "Expected all tensors to be on the same device, but found at least two devices, xpu:",
                  static_cast<int>(*device), " and xpu:", static_cast<int>(d), "! (when checking argument '", arg,
                  "' of ", op.schema().name(), ")");
      device = d;
      fp64 = fp64 || is_fp64(t.scalar_type());
    } else if (t.device().is_cpu() && host_arg.empty() && !allows_host_tensor(op.schema().operator_name(), arg) &&
               (t.dim() > 0 || checks_devices(op.schema().operator_name(), argument))) {
      host_arg = arg;
    }
  }

  c10::IValue to_host(const c10::IValue& v) {
    if (v.isTensor()) return hv.to_cpu(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(hv.to_cpu(t));
      return out;
    }
    if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> out;
      for (std::optional<at::Tensor> t : v.toOptionalTensorList())
        out.push_back(t ? std::optional<at::Tensor>(hv.to_cpu(*t)) : std::nullopt);
      return out;
    }
    return v;
  }

  void scan(const c10::IValue& v, const c10::Argument& arg) {
    if (v.isTensor()) note(v.toTensor(), arg);
    else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) note(t, arg);
    else if (v.isOptionalTensorList())
      for (std::optional<at::Tensor> t : v.toOptionalTensorList()) if (t) note(*t, arg);
    else if (v.isDevice() && v.toDevice().type() == kXPU) {
      auto d = v.toDevice().index() < 0 ? tl_device : v.toDevice().index();
      check_index(d);
      if (!device) device = d;
    }
  }

  // Output produced by the CPU kernel -> xpu tensor. `refs` counts the op's outputs per storage: memory
  // referenced only by them is adopted (zero-copy), anything else (a kernel's cache, a CPU input passed
  // through) is copied into a new device allocation.
  at::Tensor to_device(const at::Tensor& o, std::unordered_map<c10::StorageImpl*, c10::Storage>& adopted,
                       const std::unordered_map<c10::StorageImpl*, size_t>& refs) {
    if (!o.defined() || !o.device().is_cpu()) return o;
    if (const auto* xs = hv.xpu_storage_of(o)) return wrap_on_xpu(*xs, o);  // a view of an input
    auto* si = o.storage().unsafeGetStorageImpl();
    auto it = adopted.find(si);
    if (it == adopted.end()) {
      auto nbytes = si->nbytes();
      c10::DataPtr dp;
      if (o.storage().use_count() == refs.at(si)) {
        // torch internals: take the kernel's DataPtr over instead of copying the result.
        dp = allocator.adopt(si->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU))), nbytes, *device);
        si->set_nbytes(0);
      } else {
        const c10::DeviceGuard guard(c10::Device(kXPU, *device));
        dp = allocator.allocate(nbytes);
        if (nbytes) std::memcpy(dp.get(), si->data(), nbytes);
      }
      c10::Storage xs(c10::Storage::use_byte_size_t(), nbytes, std::move(dp), &allocator, true);
      it = adopted.emplace(si, xs).first;
    }
    return wrap_on_xpu(it->second, o);
  }
};

// A view (every result aliases an input, nothing is written): no kernel runs, so no device aspect is needed.
bool is_view(const c10::FunctionSchema& schema) {
  const auto& rets = schema.returns();
  return !rets.empty() && std::all_of(rets.begin(), rets.end(), [](const c10::Argument& r) {
    return r.alias_info() != nullptr && !r.alias_info()->isWrite();
  });
}

bool writes(const c10::Argument& arg) {
  const auto* ai = arg.alias_info();
  if (ai == nullptr) return false;
  if (ai->isWrite()) return true;
  for (const auto& contained : ai->containedTypes())
    if (contained.isWrite()) return true;
  return false;
}

// Every xpu tensor argument is an access by the operator just enqueued: a write where the schema says so.
void sanitize_arguments(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first) {
  const auto& args = schema.arguments();
  const auto& name = schema.name();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& v = stack[first + i];
    const bool write = writes(args[i]);
    auto one = [&](const at::Tensor& t) {
      if (is_xpu(t)) sanitizer_access(t, write, name.c_str(), args[i].name().c_str());
    };
    if (v.isTensor()) one(v.toTensor());
    else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) one(t);
    else if (v.isOptionalTensorList())
      for (std::optional<at::Tensor> t : v.toOptionalTensorList()) if (t) one(*t);
  }
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_not_bad_fork();
  counters.fallback_ops++;
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const auto n_args = args.size();
  auto first = stack->size() - n_args;
  // Raises where the release has no XPU kernel; true where torch-xpu-ops runs the operator on the CPU.
  const bool on_cpu = enter_xpu_fallback(op, *stack, first);
  FallbackState fs(op);

  bool has_out = false;
  for (size_t i = 0; i < n_args; ++i) {
    fs.scan((*stack)[first + i], args[i]);
    fs.fp64 = fs.fp64 || (!config.has_fp64 && is_fp64_dtype_argument(args[i], (*stack)[first + i]));
    has_out = has_out || args[i].is_out();
  }
  if (!fs.device) fs.device = tl_device;
  TORCH_CHECK(fs.host_arg.empty(),
              "Expected all tensors to be on the same device, but found at least two devices, xpu:",
              static_cast<int>(*fs.device), " and cpu! (when checking argument '", fs.host_arg, "' of ",
              schema.name(), ")");
  const bool checks_fp64 = !config.has_fp64 && !on_cpu && !is_view(schema);  // the CPU has fp64
  TORCH_CHECK(!checks_fp64 || !fs.fp64, "Required aspect fp64 is not supported on the device (", config.name,
              " has no native fp64; operator ", schema.name(), ")");
  const c10::DeviceGuard guard(c10::Device(kXPU, *fs.device));
  alert_if_nondeterministic(op, *stack, first);  // deterministic.cpp: as Intel's XPU kernels alert
  const auto stream = current_stream_id(*fs.device);
  const auto seq = enqueue(*fs.device, stream);
  if (sanitizer_enabled()) sanitize_arguments(schema, *stack, first);
  // torch-xpu-ops' CPU fallback copies the arguments to the host and the results back with blocking copies.
  if (on_cpu) complete(*fs.device, stream, seq);

  // A random operator: hold its xpu generator's lock while the CPU kernel runs with the engine for (seed, offset),
  // then advance the offset by what it wrote.
  EmuGenerator* rng = nullptr;
  std::unique_lock<std::mutex> rng_lock;
  for (size_t i = 0; i < n_args && !rng; ++i) {
    auto type = args[i].type();
    if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
    if (type->kind() != c10::TypeKind::GeneratorType) continue;
    auto& v = (*stack)[first + i];
    const at::Generator& gen = v.isNone() ? default_generator(*fs.device) : v.toGenerator();
    TORCH_CHECK(gen.device().type() == kXPU, "Expected a 'xpu' device type for generator but found '",
                c10::DeviceTypeName(gen.device().type(), true), "'");
    rng = dynamic_cast<EmuGenerator*>(gen.unsafeGetGeneratorImpl());
    TORCH_CHECK(rng, "not an emulated xpu generator");
    rng_lock = std::unique_lock<std::mutex>(rng->mutex_);
    v = c10::IValue(rng->engine());
  }
  auto advance_rng = [&]() {
    if (!rng) return;
    int64_t written = 0;
    const auto n_rets = schema.returns().size();
    for (size_t i = stack->size() - n_rets; i < stack->size(); ++i) {
      const auto& v = (*stack)[i];
      if (v.isTensor()) written = std::max(written, v.toTensor().numel());
      else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) written = std::max(written, t.numel());
    }
    rng->advance(static_cast<uint64_t>(written));
  };

  if (has_out) {
    // out= variants may resize their outputs: torch's own CPU fallback copies in and out.
    tl_in_fallback = true;
    try {
      at::native::cpu_fallback(op, stack);
    } catch (...) {
      tl_in_fallback = false;
      throw;
    }
    tl_in_fallback = false;
    advance_rng();
    return;
  }

  std::vector<c10::IValue> originals(stack->begin() + first, stack->end());
  for (size_t i = 0; i < n_args; ++i) {
    auto& v = (*stack)[first + i];
    if (v.isDevice() && v.toDevice().type() == kXPU) {
      v = c10::IValue(c10::Device(c10::kCPU));
    } else {
      v = fs.to_host(v);
    }
  }

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  advance_rng();

  const auto& rets = schema.returns();
  auto n_rets = rets.size();
  auto rfirst = stack->size() - n_rets;
  std::unordered_map<c10::StorageImpl*, c10::Storage> adopted;
  std::unordered_map<c10::StorageImpl*, size_t> refs;
  auto count = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    TORCH_CHECK(!checks_fp64 || !is_fp64(t.scalar_type()),
                "Required aspect fp64 is not supported on the device (", config.name,
                " has no native fp64; operator ", schema.name(), ")");
    if (t.device().is_cpu() && t.has_storage()) refs[t.storage().unsafeGetStorageImpl()]++;
  };
  for (size_t i = 0; i < n_rets; ++i) {
    const auto& v = (*stack)[rfirst + i];
    if (v.isTensor()) count(v.toTensor());
    else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) count(t);
  }
  for (size_t i = 0; i < n_rets; ++i) {
    auto& v = (*stack)[rfirst + i];
    const auto* ai = rets[i].alias_info();
    if (ai && ai->isWrite()) {  // in-place: hand back the very tensor the caller passed
      for (size_t j = 0; j < n_args; ++j) {
        const auto* aj = args[j].alias_info();
        if (aj && aj->beforeSets() == ai->beforeSets()) { v = originals[j]; break; }
      }
      continue;
    }
    if (v.isTensor()) v = fs.to_device(v.toTensor(), adopted, refs);
    else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(fs.to_device(t, adopted, refs));
      v = out;
    }
  }
}

// torch internals (the dispatcher's kernel precedence): a structured operator's functional and in-place variants have a
// CompositeExplicitAutogradNonFunctional kernel that allocates the output and calls the out= variant; the dispatcher
// prefers it to a backend fallback. On the emulated XPU that sent e.g. mse_loss through mse_loss.out, whose CPU
// kernel resizes a 0-dim output ("An output with one or more elements was resized ..."), where CPU and XPU builds
// run the functional kernel. Registering the fallback for these variants runs the CPU functional kernel instead.
void register_functional_fallbacks() {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::XPU, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) || op->hasKernelForDispatchKey(c10::DispatchKey::XPU))
      continue;
    // Without an XPU kernel in the release, the composite kernel runs there as here, and its out= variant meets the
    // XPU fallback (xpu_ops.cpp), which names that variant.
    if (xpu_coverage(name) == XpuCoverage::UNIMPLEMENTED) continue;
    bool has_out = false;
    for (const auto& a : op->schema().arguments()) has_out = has_out || a.is_out();
    if (has_out) continue;
    static auto& names = *new std::deque<std::string>();
    names.push_back(name.overload_name.empty() ? name.name.substr(6) : name.name.substr(6) + "." + name.overload_name);
    lib->impl(names.back().c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

}  // namespace xpu_emu

TORCH_LIBRARY_IMPL(_, XPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&xpu_emu::fallback>());
}
