// Native core of the emulated Intel XPU (lightning_xpu.emulator).
//
// Gives a CPU-only PyTorch build real `xpu` tensors whose memory is host memory:
//   * a DeviceGuardImpl and XPU hooks, so autograd, torch.accelerator and
//     torch.Stream/Event see N XPU devices;
//   * a DeviceAllocator with per-device statistics (the real memory_stats keys)
//     and an emulated total_memory limit that raises torch.OutOfMemoryError;
//   * per-device generators, pinned host memory;
//   * XPU kernels for creation, copies, views, resize and the set_ family
//     (storages, torch.save/torch.load, copy.deepcopy), and a boxed fallback that
//     runs every other operator with CPU kernels on CPU aliases of the same memory.
//
// Modelled on PyTorch's out-of-tree reference backend OpenReg
// (test/cpp_extensions/open_registration_extension/torch_openreg), registered for
// the XPU dispatch key instead of PrivateUse1. Lines that touch torch internals
// (what may change between torch versions) carry a "torch internals:" comment.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/XPUHooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_scaled_dot_product_attention_math.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace xpu_emu {

constexpr c10::DeviceType kXPU = c10::DeviceType::XPU;
constexpr int kMaxDevices = 64;
constexpr size_t kMinBlock = 512;            // the caching allocator's rounding
constexpr size_t kSmallSize = 1 << 20;       // small_pool vs large_pool boundary

// ---------------------------------------------------------------- configuration
struct Config {
  int num_devices = 0;
  int64_t total_memory = 0;
  bool has_fp64 = true;
  std::string name;
};
// Process-lifetime objects are leaked on purpose: torch's own static destructors (the autograd engine's device
// threads, tensors freed during interpreter shutdown) may still call into them after this library's statics die.
Config& config = *new Config();
std::array<double, kMaxDevices> memory_fraction{};  // 0 = unset

struct Counters {
  std::atomic<int64_t> device_init{0}, synchronize{0}, h2d{0}, h2d_bytes{0},
      d2h{0}, d2h_bytes{0}, d2d{0}, d2d_bytes{0}, item{0}, fallback_ops{0};
};
Counters counters;
std::atomic<bool> initialized{false};

void check_not_bad_fork() {
  // torch internals: the same flag torch.xpu._is_in_bad_fork() reads.
  TORCH_CHECK(
      !torch::utils::is_device_in_bad_fork(kXPU),
      "Cannot re-initialize XPU in forked subprocess. To use XPU with "
      "multiprocessing, you must use the 'spawn' start method");
}

void check_index(c10::DeviceIndex d) {
  TORCH_CHECK(
      d >= 0 && d < config.num_devices,
      "device is out of range, device is ", static_cast<int>(d),
      ", total number of device is ", config.num_devices, ".");
}

// ---------------------------------------------------------------- device guard
thread_local c10::DeviceIndex tl_device = 0;
thread_local std::array<c10::StreamId, kMaxDevices> tl_stream{};
std::atomic<c10::StreamId> next_stream_id{1};

struct EmuEvent {
  std::chrono::steady_clock::time_point t;
  bool recorded = false;
};

c10::Stream make_stream(c10::DeviceIndex d, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kXPU, d), id);
}

c10::DeviceIndex resolve(c10::DeviceIndex d) { return d < 0 ? tl_device : d; }

struct EmuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kXPU; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = c10::Device(kXPU, tl_device);
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kXPU, tl_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kXPU, "expected an xpu device, got ", d);
    if (d.index() >= 0) {
      check_index(d.index());
      tl_device = d.index();
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < config.num_devices) tl_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    auto i = resolve(d.index());
    return make_stream(i, tl_stream[i]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return make_stream(resolve(d.index()), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return make_stream(resolve(d.index()), 1 + (next_stream_id++ % 32));
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return make_stream(resolve(d.index()), 64 + next_stream_id++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto i = s.device_index();
    auto old = make_stream(i, tl_stream[i]);
    tl_stream[i] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(config.num_devices);
  }
  // Work runs synchronously on the host, so events only carry a timestamp.
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new EmuEvent();
    auto* e = static_cast<EmuEvent*>(*event);
    e->t = std::chrono::steady_clock::now();
    e->recorded = true;
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<EmuEvent*>(event);
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override { counters.synchronize++; }
  void synchronizeEvent(void*) const override { counters.synchronize++; }
  void synchronizeDevice(const c10::DeviceIndex) const override { counters.synchronize++; }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<EmuEvent*>(start);
    auto* b = static_cast<EmuEvent*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded,
                "Both events must be recorded before calculating elapsed time.");
    return std::chrono::duration<double, std::milli>(b->t - a->t).count();
  }
};
// torch internals: the registry torch consults for every xpu DeviceGuard/Stream/Event.
C10_REGISTER_GUARD_IMPL(XPU, EmuGuardImpl);

// ---------------------------------------------------------------- allocators
std::string format_size(uint64_t n) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (n <= 1024) os << n << " bytes";
  else if (n <= 1048576) os << (n / 1024.0) << " KiB";
  else if (n <= 1073741824ULL) os << (n / 1048576.0) << " MiB";
  else os << (n / 1073741824.0) << " GiB";
  return os.str();
}

struct Block {
  size_t size;       // rounded (what the stats count)
  size_t requested;  // what the caller asked for
  c10::DeviceIndex device;
  void* owned;           // memory from posix_memalign, freed with the block
  c10::DataPtr adopted;  // or memory a CPU kernel produced, released by its own deleter
};

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

struct EmuAllocator final : public c10::DeviceAllocator {
  std::mutex mu;
  std::array<DeviceStats, kMaxDevices> stats;

  static size_t round(size_t n) { return n == 0 ? 0 : ((n + kMinBlock - 1) / kMinBlock) * kMinBlock; }

  int64_t limit(c10::DeviceIndex d) const {
    double f = memory_fraction[d];
    return f > 0 ? static_cast<int64_t>(f * config.total_memory) : config.total_memory;
  }

  // Books `size` bytes on device d or raises torch.OutOfMemoryError like the real runtime.
  void book(c10::DeviceIndex d, size_t size, size_t requested) {
    std::lock_guard<std::mutex> g(mu);
    auto& st = stats[d];
    auto used = st.allocated_bytes[0].current;
    if (used + static_cast<int64_t>(size) > limit(d)) {
      st.num_ooms++;
      TORCH_CHECK_WITH(
          OutOfMemoryError, false,
          "XPU out of memory. Tried to allocate ", format_size(size), ". GPU ",
          static_cast<int>(d), " has a total capacity of ", format_size(config.total_memory),
          ". Of the allocated memory ", format_size(used),
          " is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated."
          " Please use `empty_cache` to release all unoccupied cached memory."
          " (emulated device: ", config.name, ")");
    }
    for (auto type : {StatType::AGGREGATE, size < kSmallSize ? StatType::SMALL_POOL : StatType::LARGE_POOL}) {
      auto t = static_cast<size_t>(type);
      st.allocation[t].increase(1);
      st.segment[t].increase(1);
      st.active[t].increase(1);
      st.allocated_bytes[t].increase(size);
      st.reserved_bytes[t].increase(size);
      st.active_bytes[t].increase(size);
      st.requested_bytes[t].increase(requested);
    }
    st.num_device_alloc++;
  }

  void unbook(const Block& b) {
    std::lock_guard<std::mutex> g(mu);
    auto& st = stats[b.device];
    for (auto type : {StatType::AGGREGATE, b.size < kSmallSize ? StatType::SMALL_POOL : StatType::LARGE_POOL}) {
      auto t = static_cast<size_t>(type);
      st.allocation[t].decrease(1);
      st.segment[t].decrease(1);
      st.active[t].decrease(1);
      st.allocated_bytes[t].decrease(b.size);
      st.reserved_bytes[t].decrease(b.size);
      st.active_bytes[t].decrease(b.size);
      st.requested_bytes[t].decrease(b.requested);
    }
    st.num_device_free++;
  }

  static void deleter(void* ctx);

  c10::DataPtr allocate(size_t n) override {
    check_not_bad_fork();
    auto d = tl_device;
    size_t size = round(n);
    book(d, size, n);
    void* p = nullptr;
    if (size > 0 && posix_memalign(&p, 64, size) != 0) {
      unbook(Block{size, n, d, nullptr, {}});
      TORCH_CHECK_WITH(OutOfMemoryError, false, "XPU out of memory. Tried to allocate ",
                       format_size(size), " (host memory backing the emulated device is exhausted)");
    }
    auto* blk = new Block{size, n, d, p, {}};
    return {p, blk, &EmuAllocator::deleter, c10::Device(kXPU, d)};
  }

  // Takes over memory a CPU kernel allocated for an output (zero-copy), booking it on device d.
  c10::DataPtr adopt(c10::DataPtr cpu, size_t n, c10::DeviceIndex d) {
    size_t size = round(n);
    book(d, size, n);
    void* p = cpu.get();
    auto* blk = new Block{size, n, d, nullptr, std::move(cpu)};
    return {p, blk, &EmuAllocator::deleter, c10::Device(kXPU, d)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}  // nothing is cached
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    check_index(d);
    std::lock_guard<std::mutex> g(mu);
    return stats[d];
  }
  void resetAccumulatedStats(c10::DeviceIndex d) override {
    check_index(d);
    std::lock_guard<std::mutex> g(mu);
    auto& st = stats[d];
    for (auto* arr : {&st.allocation, &st.segment, &st.active, &st.inactive_split, &st.allocated_bytes,
                      &st.reserved_bytes, &st.active_bytes, &st.inactive_split_bytes, &st.requested_bytes})
      for (auto& s : *arr) s.reset_accumulated();
    st.num_alloc_retries = 0;
    st.num_ooms = 0;
  }
  void resetPeakStats(c10::DeviceIndex d) override {
    check_index(d);
    std::lock_guard<std::mutex> g(mu);
    auto& st = stats[d];
    for (auto* arr : {&st.allocation, &st.segment, &st.active, &st.inactive_split, &st.allocated_bytes,
                      &st.reserved_bytes, &st.active_bytes, &st.inactive_split_bytes, &st.requested_bytes})
      for (auto& s : *arr) s.reset_peak();
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    check_index(d);
    std::lock_guard<std::mutex> g(mu);
    auto used = stats[d].allocated_bytes[0].current;
    return {static_cast<size_t>(std::max<int64_t>(config.total_memory - used, 0)),
            static_cast<size_t>(config.total_memory)};
  }
};
EmuAllocator& allocator = *new EmuAllocator();

void EmuAllocator::deleter(void* ctx) {
  auto* blk = static_cast<Block*>(ctx);
  allocator.unbook(*blk);
  free(blk->owned);
  delete blk;
}

// Pinned host memory: plain host memory whose ranges are remembered for is_pinned().
struct PinnedAllocator final : public c10::Allocator {
  std::mutex mu;
  std::map<uintptr_t, size_t> ranges;
  static void deleter(void* p);
  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n > 0) {
      TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&p, 64, n) == 0, "out of pinned host memory");
      std::lock_guard<std::mutex> g(mu);
      ranges[reinterpret_cast<uintptr_t>(p)] = n;
    }
    return {p, p, &PinnedAllocator::deleter, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::deleter; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
  bool contains(const void* ptr) {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> g(mu);
    auto it = ranges.upper_bound(p);
    if (it == ranges.begin()) return false;
    --it;
    return p < it->first + it->second;
  }
};
PinnedAllocator& pinned = *new PinnedAllocator();
void PinnedAllocator::deleter(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> g(pinned.mu);
    pinned.ranges.erase(reinterpret_cast<uintptr_t>(p));
  }
  free(p);
}

// torch internals: c10::GetAllocator(kXPU) / at::getDeviceAllocator(kXPU) return this.
REGISTER_ALLOCATOR(kXPU, &allocator);

// ---------------------------------------------------------------- generators
// An xpu-typed generator whose random engine is a CPU generator: CPU kernels run by the
// fallback receive the engine, Python sees a generator on xpu:i with the CPU state format.
struct EmuGenerator final : public c10::GeneratorImpl {
  at::Generator engine;
  explicit EmuGenerator(c10::DeviceIndex d, at::Generator e = at::detail::createCPUGenerator())
      : c10::GeneratorImpl(c10::Device(kXPU, d), c10::DispatchKeySet(c10::DispatchKey::XPU)),
        engine(std::move(e)) {}
  c10::GeneratorImpl* eng() const { return engine.unsafeGetGeneratorImpl(); }
  void set_current_seed(uint64_t s) override { std::lock_guard<std::mutex> g(eng()->mutex_); eng()->set_current_seed(s); }
  void set_offset(uint64_t o) override { std::lock_guard<std::mutex> g(eng()->mutex_); eng()->set_offset(o); }
  uint64_t get_offset() const override { std::lock_guard<std::mutex> g(eng()->mutex_); return eng()->get_offset(); }
  uint64_t current_seed() const override { return eng()->current_seed(); }
  uint64_t seed() override { std::lock_guard<std::mutex> g(eng()->mutex_); return eng()->seed(); }
  void set_state(const c10::TensorImpl& s) override { std::lock_guard<std::mutex> g(eng()->mutex_); eng()->set_state(s); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override { std::lock_guard<std::mutex> g(eng()->mutex_); return eng()->get_state(); }
  static c10::DeviceType device_type() { return kXPU; }
 private:
  EmuGenerator* clone_impl() const override {
    std::lock_guard<std::mutex> g(eng()->mutex_);
    return new EmuGenerator(device().index(), engine.clone());
  }
};

std::vector<at::Generator>& default_generators = *new std::vector<at::Generator>();

const at::Generator& default_generator(c10::DeviceIndex d) {
  d = resolve(d);
  check_index(d);
  return default_generators.at(d);
}

// ---------------------------------------------------------------- hooks
struct EmuXPUHooks final : public at::XPUHooksInterface {
  EmuXPUHooks() = default;
  explicit EmuXPUHooks(at::XPUHooksArgs) {}
  void init() const override {
    check_not_bad_fork();
    counters.device_init++;
    initialized = true;
  }
  bool hasXPU() const override { return true; }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return config.num_devices > 0; }
  std::string showConfig() const override { return "emulated XPU (lightning_xpu.emulator): " + config.name + "\n"; }
  int32_t getGlobalIdxFromDevice(const c10::Device& d) const override { return d.index(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override { return default_generator(d); }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    d = resolve(d);
    check_index(d);
    return at::make_generator<EmuGenerator>(d);
  }
  c10::DeviceIndex getNumGPUs() const override { return static_cast<c10::DeviceIndex>(config.num_devices); }
  c10::DeviceIndex deviceCount() const override { return getNumGPUs(); }
  c10::DeviceIndex current_device() const override { return tl_device; }
  c10::DeviceIndex getCurrentDevice() const override { return tl_device; }
  void setCurrentDevice(c10::DeviceIndex d) const override { check_index(d); tl_device = d; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = tl_device;
    if (d >= 0) { check_index(d); tl_device = d; }
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  c10::Device getDeviceFromPtr(void*) const override { return c10::Device(kXPU, tl_device); }
  void deviceSynchronize(c10::DeviceIndex) const override { counters.synchronize++; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned; }
  bool isPinnedPtr(const void* p) const override { return pinned.contains(p); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return initialized.load(); }
};

}  // namespace xpu_emu

// torch internals: at::detail::getXPUHooks() instantiates the class registered as "XPUHooks"
// the first time anything asks (cached afterwards), so this library must load before that.
namespace at {
C10_REGISTER_CLASS(XPUHooksRegistry, XPUHooks, xpu_emu::EmuXPUHooks);
}

namespace xpu_emu {

// ---------------------------------------------------------------- host views
bool is_xpu(const at::Tensor& t) { return t.defined() && t.device().type() == kXPU; }

// A CPU tensor over the same host memory as an xpu tensor (same storage offset, sizes,
// strides); it keeps the xpu storage alive. One CPU storage per xpu storage, so CPU kernels
// see exactly the aliasing the xpu tensors have.
struct HostViews {
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> cpu_to_xpu;
  std::unordered_map<c10::StorageImpl*, c10::Storage> xpu_to_cpu;

  c10::Storage cpu_storage(const c10::Storage& xs) {
    auto* key = xs.unsafeGetStorageImpl();
    auto it = xpu_to_cpu.find(key);
    if (it != xpu_to_cpu.end()) return it->second;
    auto* keep = new c10::Storage(xs);
    c10::DataPtr dp(xs.mutable_data(), keep,
                    [](void* ctx) { delete static_cast<c10::Storage*>(ctx); }, c10::Device(c10::kCPU));
    c10::Storage cs(c10::Storage::use_byte_size_t(), xs.nbytes(), std::move(dp), nullptr, false);
    xpu_to_cpu.emplace(key, cs);
    cpu_to_xpu.emplace_back(cs.unsafeGetStorageImpl(), xs);
    return cs;
  }

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!is_xpu(t)) return t;
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        cpu_storage(t.storage()), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    return at::Tensor(std::move(impl));
  }

  const c10::Storage* xpu_storage_of(const at::Tensor& cpu) const {
    auto* si = cpu.storage().unsafeGetStorageImpl();
    for (auto& [c, x] : cpu_to_xpu)
      if (c == si) return &x;
    return nullptr;
  }
};

at::Tensor wrap_on_xpu(c10::Storage st, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(st), c10::DispatchKeySet(c10::DispatchKey::XPU), like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return at::Tensor(std::move(impl));
}

// ---------------------------------------------------------------- kernels
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> mf) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "Non strided layout not supported on xpu");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, &allocator, c10::DispatchKeySet(c10::DispatchKey::XPU),
                                   c10::dtype_or_default(dtype), mf);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "Non strided layout not supported on xpu");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, &allocator, c10::DispatchKeySet(c10::DispatchKey::XPU),
                                           c10::dtype_or_default(dtype));
}

thread_local bool tl_in_fallback = false;  // copies made by torch's cpu_fallback are not "transfers"

void count_copy(const at::Tensor& src, const at::Tensor& dst) {
  if (tl_in_fallback) return;
  auto bytes = static_cast<int64_t>(dst.numel() * dst.element_size());
  if (is_xpu(src) && is_xpu(dst)) { counters.d2d++; counters.d2d_bytes += bytes; }
  else if (is_xpu(dst)) { counters.h2d++; counters.h2d_bytes += bytes; }
  else { counters.d2h++; counters.d2h_bytes += bytes; }
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  check_not_bad_fork();
  TORCH_CHECK(self.defined() && dst.defined(), "copy_: undefined tensor");
  count_copy(self, dst);
  HostViews hv;
  at::Tensor d = hv.to_cpu(dst);
  d.copy_(hv.to_cpu(self), non_blocking);  // host memory on both sides: a CPU copy (with dtype conversion)
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

void record_stream(at::Tensor&, c10::Stream) {}  // work is synchronous: nothing to defer

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
    TORCH_CHECK(config.has_fp64 || (t->scalar_type() != at::kDouble && t->scalar_type() != at::kComplexDouble),
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

// torch internals: scaled_dot_product_attention asks a DispatchStub for the fused kernel of the query's device
// type, which asserts for XPU on a CPU build. Registered for AutogradXPU, the math implementation (itself a
// composite of differentiable ops) runs instead, as it does for any device without a fused kernel.
at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                                        std::optional<double> scale, bool enable_gqa) {
  return std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, mask, dropout_p, is_causal, std::nullopt,
                                                            scale, enable_gqa));
}

// ---------------------------------------------------------------- fallback
// Every other operator runs as its CPU kernel on host views of the xpu tensors: no copies,
// in-place updates and views land in the device memory. New outputs are adopted by the
// emulated device (booked in its statistics, subject to its memory limit).

bool allows_host_tensors(const c10::OperatorName& name) {
  // Operators whose real XPU kernels accept CPU index tensors.
  static const std::vector<std::string> ops = {"aten::index", "aten::index_put_", "aten::index_put",
                                               "aten::_index_put_impl_", "aten::_unsafe_index",
                                               "aten::_unsafe_index_put"};
  return std::find(ops.begin(), ops.end(), name.name) != ops.end();
}

struct FallbackState {
  const c10::OperatorHandle& op;
  HostViews hv;
  std::optional<c10::DeviceIndex> device;
  std::string host_arg;  // a non-scalar CPU tensor argument, for the error message
  bool fp64 = false;
  explicit FallbackState(const c10::OperatorHandle& o) : op(o) {}

  void note(const at::Tensor& t, const std::string& arg) {
    if (!t.defined()) return;
    if (is_xpu(t)) {
      auto d = t.device().index();
      TORCH_CHECK(!device || *device == d,
                  "Expected all tensors to be on the same device, but found at least two devices, xpu:",
                  static_cast<int>(*device), " and xpu:", static_cast<int>(d), "! (when checking argument '", arg,
                  "' of ", op.schema().name(), ")");
      device = d;
      auto st = t.scalar_type();
      fp64 = fp64 || st == at::kDouble || st == at::kComplexDouble;
    } else if (t.device().is_cpu() && t.dim() > 0 && host_arg.empty()) {
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

  void scan(const c10::IValue& v, const std::string& arg) {
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

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_not_bad_fork();
  counters.fallback_ops++;
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const auto n_args = args.size();
  auto first = stack->size() - n_args;
  FallbackState fs(op);

  bool has_out = false;
  for (size_t i = 0; i < n_args; ++i) {
    fs.scan((*stack)[first + i], args[i].name());
    has_out = has_out || args[i].is_out();
  }
  if (!fs.device) fs.device = tl_device;
  TORCH_CHECK(fs.host_arg.empty() || allows_host_tensors(schema.operator_name()),
              "Expected all tensors to be on the same device, but found at least two devices, xpu:",
              static_cast<int>(*fs.device), " and cpu! (when checking argument '", fs.host_arg, "' of ",
              schema.name(), ")");
  TORCH_CHECK(config.has_fp64 || !fs.fp64,
              "Required aspect fp64 is not supported on the device (", config.name,
              " has no native fp64; operator ", schema.name(), ")");
  const c10::DeviceGuard guard(c10::Device(kXPU, *fs.device));

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
    return;
  }

  std::vector<c10::IValue> originals(stack->begin() + first, stack->end());
  for (size_t i = 0; i < n_args; ++i) {
    auto& v = (*stack)[first + i];
    if (v.isDevice() && v.toDevice().type() == kXPU) {
      v = c10::IValue(c10::Device(c10::kCPU));
    } else if (v.isGenerator() && v.toGenerator().device().type() == kXPU) {
      auto* g = dynamic_cast<EmuGenerator*>(v.toGenerator().unsafeGetGeneratorImpl());
      TORCH_CHECK(g, "not an emulated xpu generator");
      v = c10::IValue(g->engine);
    } else if (v.isNone() && args[i].name() == "generator") {
      auto* g = static_cast<EmuGenerator*>(default_generator(*fs.device).unsafeGetGeneratorImpl());
      v = c10::IValue(g->engine);
    } else {
      v = fs.to_host(v);
    }
  }

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  const auto& rets = schema.returns();
  auto n_rets = rets.size();
  auto rfirst = stack->size() - n_rets;
  std::unordered_map<c10::StorageImpl*, c10::Storage> adopted;
  std::unordered_map<c10::StorageImpl*, size_t> refs;
  auto count = [&](const at::Tensor& t) {
    if (t.defined() && t.device().is_cpu() && t.has_storage()) refs[t.storage().unsafeGetStorageImpl()]++;
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
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
  m.impl("_thnn_fused_lstm_cell", fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward_impl);
  m.impl("_thnn_fused_gru_cell", fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", fused_gru_cell_backward);
}

TORCH_LIBRARY_IMPL(aten, AutogradXPU, m) {
  m.impl("scaled_dot_product_attention", xpu_emu::scaled_dot_product_attention);
}

TORCH_LIBRARY_IMPL(_, XPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&xpu_emu::fallback>());
}

// ---------------------------------------------------------------- Python bindings
namespace xpu_emu {

at::Tensor host_view(const at::Tensor& t) {
  HostViews hv;  // the view keeps the device storage alive on its own
  return hv.to_cpu(t);
}

void register_xccl(py::module& m);  // xccl.cpp

py::dict stat_array(const c10::CachingAllocator::StatArray& a) {
  static const char* names[] = {"all", "small_pool", "large_pool"};
  py::dict d;
  for (size_t i = 0; i < 3; ++i) {
    py::dict s;
    s["current"] = a[i].current;
    s["peak"] = a[i].peak;
    s["allocated"] = a[i].allocated;
    s["freed"] = a[i].freed;
    d[names[i]] = s;
  }
  return d;
}

py::dict memory_stats(c10::DeviceIndex d) {
  auto st = allocator.getDeviceStats(d);
  py::dict r;  // the nested layout of torch/csrc/xpu/Module.cpp's _xpu_memoryStats
  r["allocation"] = stat_array(st.allocation);
  r["segment"] = stat_array(st.segment);
  r["active"] = stat_array(st.active);
  r["inactive_split"] = stat_array(st.inactive_split);
  r["allocated_bytes"] = stat_array(st.allocated_bytes);
  r["reserved_bytes"] = stat_array(st.reserved_bytes);
  r["active_bytes"] = stat_array(st.active_bytes);
  r["inactive_split_bytes"] = stat_array(st.inactive_split_bytes);
  r["requested_bytes"] = stat_array(st.requested_bytes);
  return r;
}

}  // namespace xpu_emu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace xpu_emu;
  m.def("configure", [](int n, int64_t total_memory, bool has_fp64, std::string name) {
    TORCH_CHECK(n >= 1 && n <= kMaxDevices, "the emulator supports 1 to ", kMaxDevices, " devices, got ", n);
    TORCH_CHECK(config.num_devices == 0 || config.num_devices == n,
                "the emulator is already configured with ", config.num_devices, " devices");
    config.num_devices = n;
    config.total_memory = total_memory;
    config.has_fp64 = has_fp64;
    config.name = std::move(name);
    if (default_generators.empty())
      for (int i = 0; i < n; ++i) default_generators.push_back(at::make_generator<EmuGenerator>(i));
  });
  m.def("init", []() {
    // As torch/csrc/xpu/Module.cpp's _xpu_init: arm the fork poisoning, init the hooks once.
    TORCH_CHECK(!torch::utils::is_device_in_bad_fork(kXPU),
                "Cannot re-initialize XPU in forked subprocess. To use XPU with "
                "multiprocessing, you must use the 'spawn' start method");
    torch::utils::register_fork_handler_for_device_init(kXPU);
    at::globalContext().lazyInitDevice(kXPU);
  });
  m.def("default_generators", []() {
    py::tuple t(config.num_devices);
    for (int i = 0; i < config.num_devices; ++i)
      t[i] = py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generators[i]));
    return t;
  });
  m.def("is_in_bad_fork", []() { return torch::utils::is_device_in_bad_fork(kXPU); });
  m.def("device_count", []() { return config.num_devices; });
  m.def("set_device", [](c10::DeviceIndex d) { check_index(d); tl_device = d; });
  m.def("get_device", []() { return tl_device; });
  m.def("exchange_device", [](c10::DeviceIndex d) {
    auto old = tl_device;
    if (d >= 0) { check_index(d); tl_device = d; }
    return d < 0 ? c10::DeviceIndex(-1) : old;
  });
  m.def("current_stream", [](c10::DeviceIndex d) {
    d = resolve(d);
    check_index(d);
    return std::make_tuple(tl_stream[d], d, static_cast<int>(kXPU));
  });
  m.def("set_stream", [](int64_t id, c10::DeviceIndex d, int) {
    check_index(d);
    tl_device = d;
    tl_stream[d] = id;
  });
  m.def("synchronize", [](c10::DeviceIndex d) {
    check_index(resolve(d));
    counters.synchronize++;
  });
  m.def("memory_stats", &memory_stats);
  m.def("reset_peak_memory_stats", [](c10::DeviceIndex d) { allocator.resetPeakStats(resolve(d)); });
  m.def("reset_accumulated_memory_stats", [](c10::DeviceIndex d) { allocator.resetAccumulatedStats(resolve(d)); });
  m.def("mem_get_info", [](c10::DeviceIndex d) { return allocator.getMemoryInfo(resolve(d)); });
  m.def("set_memory_fraction", [](double f, c10::DeviceIndex d) {
    d = resolve(d);
    check_index(d);
    TORCH_CHECK(f > 0 && f <= 1, "invalid fraction: ", f, ". Please set within (0, 1].");
    memory_fraction[d] = f;
  });
  m.def("get_memory_fraction", [](c10::DeviceIndex d) {
    d = resolve(d);
    check_index(d);
    return memory_fraction[d] > 0 ? memory_fraction[d] : 1.0;
  });
  m.def("counters", []() {
    py::dict d;
    d["device_init"] = counters.device_init.load();
    d["synchronize"] = counters.synchronize.load();
    d["h2d_copies"] = counters.h2d.load();
    d["h2d_bytes"] = counters.h2d_bytes.load();
    d["d2h_copies"] = counters.d2h.load();
    d["d2h_bytes"] = counters.d2h_bytes.load();
    d["d2d_copies"] = counters.d2d.load();
    d["d2d_bytes"] = counters.d2d_bytes.load();
    d["item"] = counters.item.load();
    d["fallback_ops"] = counters.fallback_ops.load();
    return d;
  });
  m.def("reset_counters", []() {
    for (auto* c : {&counters.device_init, &counters.synchronize, &counters.h2d, &counters.h2d_bytes,
                    &counters.d2h, &counters.d2h_bytes, &counters.d2d, &counters.d2d_bytes, &counters.item,
                    &counters.fallback_ops})
      c->store(0);
  });
  m.def("stop_autograd_device_threads", []() {
    // torch internals: autograd runs xpu backward on one engine thread per device. Left alive until C++ static
    // destruction, such a thread re-takes the GIL of a finalized interpreter and aborts the process
    // ("terminate called without an active exception"). Called from atexit: stop them while Python is alive.
    py::gil_scoped_release no_gil;
    torch::autograd::Engine::get_default_engine().stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let them take/drop the GIL and exit
  });
  m.def("host_view", &host_view, "A CPU tensor over the same host memory as an xpu tensor (no copy).");
  register_xccl(m);
}
