// Native core of the emulated Intel XPU (lightning_xpu.emulator): the declarations its source files share.
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
//
// One file per concern: topology.cpp (configuration, devices), queues.cpp (the asynchronous stream model),
// device_guard.cpp, allocator.cpp (caching and pinned allocators), generator.cpp, hooks.cpp, kernels.cpp (the XPU
// kernels; SDPA's backend choice in sdpa.cpp, SyncBatchNorm's in batch_norm.cpp), fallback.cpp (the boxed CPU fallback), bindings.cpp (the Python module); sanitizer.cpp (the stream
// sanitizer), xccl.cpp (the collective backend), reducer_timer.cpp (DDP's timer for xpu), deterministic.cpp
// (determinism alerts), xpu_ops.cpp (which operators the modelled release implements for XPU).

#pragma once


#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/GPUTrace.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace xpu_emu {

constexpr c10::DeviceType kXPU = c10::DeviceType::XPU;
constexpr int kMaxDevices = 64;
// Process-lifetime globals (`T& x = *new T()`) are leaked on purpose; topology.cpp says why.

// ---------------------------------------------------------------- configuration and topology (topology.cpp)
// The emulated machine: `num_stacks` stacks (Level Zero sub-devices) on cards of `stacks_per_card` stacks each.
// Which of them become torch devices depends on ZE_FLAT_DEVICE_HIERARCHY and ZE_AFFINITY_MASK, read when the
// runtime first enumerates its devices (the first device count, device use or init), as the SYCL runtime does.
struct DeviceInfo {
  int card;
  int stack;  // -1: the whole card (a COMPOSITE root device, or a card of one stack)
  int64_t total_memory;
};

struct Config {
  int num_stacks = 0;
  int stacks_per_card = 1;
  int64_t stack_memory = 0;
  bool has_fp64 = true;
  bool fp64_conversion_emulation = true;  // -fsycl-fp64-conv-emu: without fp64, conversions to and from it still run
  int64_t memory_reserve = 0;             // per device, kept by the driver and other processes (never allocatable)
  int64_t architecture = 0;               // sycl::ext::oneapi::experimental::architecture (SDPA's flash check)
  bool free_memory_query = true;  // sycl::aspect::ext_intel_free_memory (integrated GPUs lack it)
  bool async = true;              // false: LIGHTNING_XPU_EMULATOR_SYNC=1
  std::string name;
  std::atomic<bool> enumerated{false};
  std::vector<DeviceInfo> devices;
  int num_devices = 0;
};
extern Config& config;
extern std::array<double, kMaxDevices> memory_fraction;  // set_memory_fraction(), per device

struct Counters {
  std::atomic<int64_t> device_init{0}, synchronize{0}, h2d{0}, h2d_bytes{0},
      d2h{0}, d2h_bytes{0}, d2d{0}, d2d_bytes{0}, item{0}, fallback_ops{0};
};
extern Counters counters;
extern std::atomic<bool> initialized;

void enumerate();
int num_devices();
int64_t total_memory(c10::DeviceIndex d);
void check_not_bad_fork();
void check_index(c10::DeviceIndex d);

// ---------------------------------------------------------------- asynchronous execution (queues.cpp)
constexpr unsigned char kPoison = 0xFF;  // NaN in every floating dtype, -1 in signed integers
extern const c10::StreamId kCollectiveStreamId;  // the stream async collectives are deferred on

struct QueueState {
  uint64_t enqueued = 0, completed = 0;
  std::vector<std::tuple<uint64_t, c10::StreamId, uint64_t>> waits;  // (my seq, other stream, its seq)
};
using Queues = std::map<std::pair<int, c10::StreamId>, QueueState>;

extern std::recursive_mutex& queue_mu;
extern Queues& queues;
extern thread_local c10::DeviceIndex tl_device;
extern thread_local std::array<c10::StreamId, kMaxDevices> tl_stream;

c10::StreamId current_stream_id(c10::DeviceIndex d);
uint64_t stream_position(c10::DeviceIndex d, c10::StreamId s);
bool ordered_before(c10::DeviceIndex d, c10::StreamId t, uint64_t seq, c10::StreamId s, uint64_t upto);
uint64_t enqueue(c10::DeviceIndex d, c10::StreamId s);
void complete(c10::DeviceIndex d, c10::StreamId s, uint64_t upto);
void complete_stream(c10::DeviceIndex d, c10::StreamId s);
void complete_device(c10::DeviceIndex d);
uint64_t defer(c10::DeviceIndex d, c10::StreamId s, at::Tensor dst, at::Tensor src);
void land_ids(const std::vector<uint64_t>& ids);
bool is_async();
uint64_t defer_collective(c10::DeviceIndex d, at::Tensor dst, at::Tensor src);
uint64_t collective_position(c10::DeviceIndex d);
bool landed(const std::vector<uint64_t>& ids);

// ---------------------------------------------------------------- device guard (device_guard.cpp)
c10::DeviceIndex resolve(c10::DeviceIndex d);  // -1: the current device
uintptr_t sycl_queue_handle(c10::DeviceIndex d, c10::StreamId s);  // torch.xpu.Stream.sycl_queue
int stream_priority(c10::DeviceIndex d, c10::StreamId s);          // torch.xpu.Stream.priority
void synchronize_device(c10::DeviceIndex d);                       // -1: the current device
bool event_query(void* event);
double event_elapsed_ms(void* start, void* end);
// The interpreter torch._C._activate_gpu_trace() registered for torch.xpu._gpu_trace's callbacks, or nullptr.
const c10::impl::PyInterpreter* gpu_trace();

// ---------------------------------------------------------------- allocators (allocator.cpp)
using c10::CachingDeviceAllocator::DeviceStats;

struct DeviceModel;

// The caching allocator's books: a block of a segment, in address order within its device.
struct MBlock {
  size_t size;
  size_t requested = 0;
  bool small;
  bool allocated = false;
  uint64_t order;  // address order within the device
  MBlock* prev = nullptr;
  MBlock* next = nullptr;
  DeviceModel* owner = nullptr;  // the pool whose cache the block returns to: the device's, or a MemPool's
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct BySize {
  bool operator()(const MBlock* a, const MBlock* b) const {
    return std::tie(a->size, a->order) < std::tie(b->size, b->order);
  }
};

struct DeviceModel {
  std::set<MBlock*, BySize> small_free, large_free;
  uint64_t next_order = 0;
  std::set<MBlock*, BySize>& pool(bool small) { return small ? small_free : large_free; }
};

// A private pool (torch.xpu.MemPool, id (0, n)): its own cached blocks, and how many MemPool objects and
// use_mem_pool contexts hold it; at a use count of 0 its cache is freeable (empty_cache() returns it).
struct PrivatePool {
  DeviceModel model;
  int use_count = 0;
};

// The caching device allocator: the books of torch's XPU caching allocator over host memory.
struct EmuAllocator final : public c10::DeviceAllocator {
  std::mutex mu;
  std::array<DeviceStats, kMaxDevices> stats;
  std::array<DeviceModel, kMaxDevices> models;
  std::array<std::map<c10::MempoolId_t, PrivatePool>, kMaxDevices> private_pools;

  static size_t round_size(size_t n);
  static size_t allocation_size(size_t size);
  int64_t usable(c10::DeviceIndex d) const;
  int64_t limit(c10::DeviceIndex d) const;
  template <typename F>
  static void for_types(bool small, F f);
  void release_cached(c10::DeviceIndex d);
  void release_free_segments(c10::DeviceIndex d, DeviceModel& m);
  DeviceModel& allocating_model(c10::DeviceIndex d);
  // torch.xpu.MemPool (XPUCachingAllocator's createOrIncrefPool, releasePool, getPoolUseCount and the thread's
  // routing of allocations into a pool)
  void create_or_incref_pool(c10::DeviceIndex d, c10::MempoolId_t id);
  void release_pool(c10::DeviceIndex d, c10::MempoolId_t id);
  int pool_use_count(c10::DeviceIndex d, c10::MempoolId_t id);
  void begin_allocate_to_pool(c10::DeviceIndex d, c10::MempoolId_t id);
  void end_allocate_to_pool(c10::DeviceIndex d, c10::MempoolId_t id);
  MBlock* book(c10::DeviceIndex d, size_t n);
  void unbook(c10::DeviceIndex d, MBlock* b);

  static void deleter(void* ctx);

  c10::DataPtr allocate(size_t n) override;
  c10::DataPtr adopt(c10::DataPtr cpu, size_t n, c10::DeviceIndex d);

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override;
  void recordStream(const c10::DataPtr& dp, c10::Stream s) override;
  DeviceStats getDeviceStats(c10::DeviceIndex d) override;
  void resetAccumulatedStats(c10::DeviceIndex d) override;
  void resetPeakStats(c10::DeviceIndex d) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override;
};
extern EmuAllocator& allocator;

const void* allocation_of(const at::Tensor& t);

// Pinned host memory: plain host memory whose ranges are remembered for is_pinned().
struct PinnedAllocator final : public c10::Allocator {
  std::mutex mu;
  std::map<uintptr_t, size_t> ranges;
  static void deleter(void* p);
  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::deleter; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
  bool contains(const void* ptr);
};
extern PinnedAllocator& pinned;

// ---------------------------------------------------------------- generators (generator.cpp)
struct EmuGeneratorState : public c10::intrusive_ptr_target {
  uint64_t seed = c10::default_rng_seed_val;
  uint64_t offset = 0;
  EmuGeneratorState(uint64_t s, uint64_t o) : seed(s), offset(o) {}
};

// The generator of torch's XPUGeneratorImpl (seed, offset), drawing through CPU engines.
struct EmuGenerator final : public c10::GeneratorImpl {
  c10::intrusive_ptr<EmuGeneratorState> state;
  explicit EmuGenerator(c10::DeviceIndex d, c10::intrusive_ptr<EmuGeneratorState> st =
                                                 c10::make_intrusive<EmuGeneratorState>(c10::default_rng_seed_val, 0))
      : c10::GeneratorImpl(c10::Device(kXPU, d), c10::DispatchKeySet(c10::DispatchKey::XPU)), state(std::move(st)) {}
  // As in torch, callers (torch.Generator's methods, the kernels) hold mutex_; these do not lock.
  void set_current_seed(uint64_t s) override { state->seed = s; state->offset = 0; }
  void set_offset(uint64_t o) override;
  uint64_t get_offset() const override { return state->offset; }
  uint64_t current_seed() const override { return state->seed; }
  uint64_t seed() override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  void set_state(const c10::TensorImpl& s) override;
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& other) override;
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override;
  // What a kernel does with philox_engine_inputs(increment), caller holding mutex_: the CPU generator the operator
  // runs with, derived from (seed, offset); `advance` then moves the offset past what the operator drew.
  at::Generator engine() const;
  void advance(uint64_t increment);
  static c10::DeviceType device_type() { return kXPU; }
 private:
  EmuGenerator* clone_impl() const override;
};

extern std::vector<at::Generator>& default_generators;
const at::Generator& default_generator(c10::DeviceIndex d);
void make_default_generators(int n);

// ---------------------------------------------------------------- hooks (hooks.cpp)
bool hooks_installed();

// ---------------------------------------------------------------- host views (used by kernels.cpp, fallback.cpp)
inline bool is_xpu(const at::Tensor& t) { return t.defined() && t.device().type() == kXPU; }

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

// ---------------------------------------------------------------- kernels (kernels.cpp)
extern thread_local bool tl_in_fallback;  // set while torch's cpu_fallback runs an out= operator
bool is_fp64(c10::ScalarType st);
void record_data_ptr_on_stream(const c10::DataPtr& dp, const c10::Stream& s);  // the allocator's recordStream

// ---------------------------------------------------------------- fallback (fallback.cpp)
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void register_functional_fallbacks();

// ---------------------------------------------------------------- Python bindings (bindings.cpp)
at::Tensor host_view(const at::Tensor& t);  // a CPU tensor over the same host memory (xccl.cpp's collectives)

// ---------------------------------------------------------------- stream sanitizer (sanitizer.cpp)
void sanitizer_enable(bool on);
bool sanitizer_enabled();
void sanitizer_allocated(const void* ctx, c10::DeviceIndex d);
void sanitizer_access(const at::Tensor& t, bool write, const char* op, const char* arg);
void sanitizer_access_at(const at::Tensor& t, bool write, c10::StreamId s, uint64_t seq, const char* op,
                         const char* arg);
void sanitizer_freed(const void* ctx) noexcept;
void sanitizer_allocating(c10::DeviceIndex d);
void sanitizer_record_stream(const void* ctx, c10::StreamId s);

// ---------------------------------------------------------------- collectives (xccl.cpp)
void xccl_set_torch_release(int major, int minor);

// ---------------------------------------------------------------- determinism alerts (deterministic.cpp)
void alert_if_nondeterministic(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first_arg);

// ---------------------------------------------------------------- XPU operator coverage (xpu_ops.cpp)
// What an XPU build of the modelled release has for an operator that reaches the emulator's fallback: its own XPU
// kernel, torch-xpu-ops' registration to run on the CPU, or nothing (its boxed fallback).
enum class XpuCoverage { KERNEL, CPU_FALLBACK, UNIMPLEMENTED };
XpuCoverage xpu_coverage(const c10::OperatorName& name);
// Raises NotImplementedError as torch-xpu-ops does for an operator it lacks; true (after its device check and
// warning) when the operator runs on the CPU there: on the fallback list, or any lacking one under
// PYTORCH_ENABLE_XPU_FALLBACK=1.
bool enter_xpu_fallback(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first_arg);

}  // namespace xpu_emu
