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
#include <ATen/native/TensorFactories.h>
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
#include <deque>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace xpu_emu {

constexpr c10::DeviceType kXPU = c10::DeviceType::XPU;
constexpr int kMaxDevices = 64;
void alert_if_nondeterministic(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first_arg);

// ---------------------------------------------------------------- configuration and topology
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
  bool free_memory_query = true;  // sycl::aspect::ext_intel_free_memory (integrated GPUs lack it)
  bool async = true;              // false: LIGHTNING_XPU_EMULATOR_SYNC=1
  std::string name;
  std::atomic<bool> enumerated{false};
  std::vector<DeviceInfo> devices;
  int num_devices = 0;
};
// Process-lifetime objects are leaked on purpose: torch's own static destructors (the autograd engine's device
// threads, tensors freed during interpreter shutdown) may still call into them after this library's statics die.
Config& config = *new Config();
std::mutex& enumerate_mu = *new std::mutex();
std::array<double, kMaxDevices> memory_fraction{};  // 0 = unset

struct Counters {
  std::atomic<int64_t> device_init{0}, synchronize{0}, h2d{0}, h2d_bytes{0},
      d2h{0}, d2h_bytes{0}, d2d{0}, d2d_bytes{0}, item{0}, fallback_ops{0};
};
Counters counters;
std::atomic<bool> initialized{false};

void make_default_generators(int n);  // below

// sanitizer.cpp
void sanitizer_enable(bool on);
bool sanitizer_enabled();
void sanitizer_allocated(const void* ctx, c10::DeviceIndex d);
void sanitizer_access(const at::Tensor& t, bool write, const char* op, const char* arg);
void sanitizer_access_at(const at::Tensor& t, bool write, c10::StreamId s, uint64_t seq, const char* op,
                         const char* arg);
void sanitizer_freed(const void* ctx) noexcept;
void sanitizer_allocating(c10::DeviceIndex d);
void sanitizer_record_stream(const void* ctx, c10::StreamId s);
void record_data_ptr_on_stream(const c10::DataPtr& dp, const c10::Stream& s);  // the allocator's recordStream
void xccl_set_torch_release(int major, int minor);  // xccl.cpp

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::vector<DeviceInfo> enumerate_devices() {
  auto hierarchy = env("ZE_FLAT_DEVICE_HIERARCHY");
  if (hierarchy.empty()) hierarchy = "FLAT";
  TORCH_CHECK_VALUE(hierarchy == "FLAT" || hierarchy == "COMPOSITE" || hierarchy == "COMBINED",
                    "ZE_FLAT_DEVICE_HIERARCHY=", hierarchy, ": expected FLAT, COMPOSITE or COMBINED");
  const int spc = config.stacks_per_card;
  const bool composite = hierarchy == "COMPOSITE" && spc > 1;
  TORCH_CHECK_VALUE(!composite || config.num_stacks % spc == 0, "ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE needs whole cards: "
                    "LIGHTNING_XPU_EMULATOR counts stacks (FLAT devices), ", spc, " per card, got ", config.num_stacks);
  std::vector<DeviceInfo> roots;  // the root devices before the mask, in Level Zero order
  if (composite) {
    for (int c = 0; c < config.num_stacks / spc; ++c) roots.push_back({c, -1, spc * config.stack_memory});
  } else {
    for (int s = 0; s < config.num_stacks; ++s)
      roots.push_back({s / spc, spc > 1 ? s % spc : -1, config.stack_memory});
  }
  auto mask = std::getenv("ZE_AFFINITY_MASK");
  if (mask == nullptr) return roots;
  // FLAT / COMBINED: "i" is the i-th root device. COMPOSITE: "c" is card c, "c.s" its stack s as a root device.
  // Entries that name nothing are ignored, as Level Zero ignores them; a mask that selects nothing leaves none.
  std::vector<DeviceInfo> picked;
  std::stringstream ss(mask);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto dot = item.find('.');
    char* end = nullptr;
    long first = std::strtol(item.c_str(), &end, 10);
    bool ok = end != item.c_str() && (dot == std::string::npos ? *end == '\0' : end == item.c_str() + dot);
    long second = -1;
    if (ok && dot != std::string::npos) {
      const char* s2 = item.c_str() + dot + 1;
      second = std::strtol(s2, &end, 10);
      ok = end != s2 && *end == '\0';
    }
    TORCH_CHECK_VALUE(ok && first >= 0, "ZE_AFFINITY_MASK='", mask, "': '", item, "' is not a device ('0') or a "
                      "stack of a device ('0.1')");
    DeviceInfo d{-2, -2, 0};
    if (second < 0) {
      if (first < static_cast<long>(roots.size())) d = roots[first];
    } else {
      TORCH_CHECK_VALUE(hierarchy == "COMPOSITE", "ZE_AFFINITY_MASK='", mask, "' uses COMPOSITE notation, but "
                        "ZE_FLAT_DEVICE_HIERARCHY is ", hierarchy, ": name devices by their FLAT index ('0,1')");
      if (first < (config.num_stacks + spc - 1) / spc && second < spc && first * spc + second < config.num_stacks)
        d = {static_cast<int>(first), spc > 1 ? static_cast<int>(second) : -1, config.stack_memory};
    }
    if (d.card == -2) continue;
    bool dup = false;
    for (auto& p : picked) dup = dup || (p.card == d.card && (p.stack == d.stack || p.stack == -1));
    if (!dup) picked.push_back(d);
  }
  std::sort(picked.begin(), picked.end(),
            [](const DeviceInfo& a, const DeviceInfo& b) { return std::tie(a.card, a.stack) < std::tie(b.card, b.stack); });
  return picked;
}

// The runtime's device enumeration: once per process, on first need.
void enumerate() {
  if (config.enumerated.load()) return;
  std::lock_guard<std::mutex> g(enumerate_mu);
  if (config.enumerated.load()) return;
  TORCH_CHECK(config.num_stacks > 0, "the XPU emulator is not configured");
  auto devices = enumerate_devices();
  TORCH_CHECK(devices.size() <= static_cast<size_t>(kMaxDevices), "the emulator supports up to ", kMaxDevices,
              " devices");
  config.devices = std::move(devices);
  config.num_devices = static_cast<int>(config.devices.size());
  make_default_generators(config.num_devices);
  config.enumerated = true;
}

int num_devices() {
  if (config.num_stacks == 0) return 0;  // before configure(): torch's accelerator probe
  enumerate();
  return config.num_devices;
}

int64_t total_memory(c10::DeviceIndex d) { return config.devices.at(d).total_memory; }

void check_not_bad_fork() {
  // torch internals: the same flag torch.xpu._is_in_bad_fork() reads.
  TORCH_CHECK(
      !torch::utils::is_device_in_bad_fork(kXPU),
      "Cannot re-initialize XPU in forked subprocess. To use XPU with "
      "multiprocessing, you must use the 'spawn' start method");
}

void check_index(c10::DeviceIndex d) {
  auto n = num_devices();
  TORCH_CHECK(
      d >= 0 && d < n,
      "device is out of range, device is ", static_cast<int>(d),
      ", total number of device is ", n, ".");
}

// ---------------------------------------------------------------- asynchronous execution
// Every stream is an in-order queue. Operators still run eagerly on the host, but what the host may observe is
// what it could observe on an Intel GPU: work enqueued on a stream is complete only once something waited for it
// (Stream/Event/device synchronize, a blocking copy or .item() on that stream). Until then queries answer false,
// a non_blocking device-to-host copy leaves kPoison bytes in its destination, and an async collective's outputs
// keep their old values; completion writes what the device had when the work was enqueued.
constexpr unsigned char kPoison = 0xFF;  // NaN in every floating dtype, -1 in signed integers
constexpr c10::StreamId kCollectiveStream = -2;  // XCCL's own queue: only wait() or a device synchronize
extern const c10::StreamId kCollectiveStreamId = kCollectiveStream;

struct QueueState {
  uint64_t enqueued = 0, completed = 0;
  std::vector<std::tuple<uint64_t, c10::StreamId, uint64_t>> waits;  // (my seq, other stream, its seq)
};

struct Deferred {
  uint64_t id;
  c10::DeviceIndex device;
  c10::StreamId stream;
  uint64_t seq;
  at::Tensor dst;  // host memory (a CPU tensor, or a host view of device memory)
  at::Tensor src;  // the values to land there
};

std::recursive_mutex& queue_mu = *new std::recursive_mutex();
auto& queues = *new std::map<std::pair<int, c10::StreamId>, QueueState>();
auto& deferred = *new std::vector<Deferred>();
uint64_t next_deferred_id = 1;

thread_local c10::DeviceIndex tl_device = 0;
thread_local std::array<c10::StreamId, kMaxDevices> tl_stream{};

c10::StreamId current_stream_id(c10::DeviceIndex d) { return tl_stream[d]; }

uint64_t stream_position(c10::DeviceIndex d, c10::StreamId s) {
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  return queues[{d, s}].enqueued;
}

// Whether the work at position `seq` of (d, t) is ordered before the work at position `upto` of (d, s): the host saw
// it complete, or s waited for t up to `seq` or later, directly or through the streams it waited for.
bool ordered_before(c10::DeviceIndex d, c10::StreamId t, uint64_t seq, c10::StreamId s, uint64_t upto) {
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  if (queues[{d, t}].completed >= seq) return true;
  std::vector<std::pair<c10::StreamId, uint64_t>> todo{{s, upto}};
  std::map<c10::StreamId, uint64_t> explored;  // the furthest position of each stream whose waits were followed
  while (!todo.empty()) {
    auto [x, up] = todo.back();
    todo.pop_back();
    if (x == t) {
      if (seq <= up) return true;
      continue;
    }
    auto seen = explored.find(x);
    if (seen != explored.end() && seen->second >= up) continue;
    explored[x] = up;
    for (auto& [mine, other, oseq] : queues[{d, x}].waits)
      if (mine <= up) todo.emplace_back(other, oseq);
  }
  return false;
}

// Enqueues one unit of work on (d, s) (every operator, copy and collective does); returns its position.
uint64_t enqueue(c10::DeviceIndex d, c10::StreamId s) {
  if (!config.async) return 0;
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  return ++queues[{d, s}].enqueued;
}

void land(std::vector<Deferred>::iterator first, std::vector<Deferred>::iterator last) {
  for (auto it = first; it != last; ++it) it->dst.copy_(it->src);
}

// Completes (d, s) up to position `upto`: lands its deferred writes and what it waited for on other streams.
void complete(c10::DeviceIndex d, c10::StreamId s, uint64_t upto) {
  if (!config.async) return;
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  auto& q = queues[{d, s}];
  if (upto <= q.completed) return;
  q.completed = upto;
  std::vector<std::pair<c10::StreamId, uint64_t>> deps;
  for (auto& [mine, other, seq] : q.waits)
    if (mine <= upto) deps.emplace_back(other, seq);
  std::erase_if(q.waits, [&](const auto& w) { return std::get<0>(w) <= upto; });
  for (auto& [other, seq] : deps) complete(d, other, seq);
  auto done = std::stable_partition(deferred.begin(), deferred.end(), [&](const Deferred& e) {
    return !(e.device == d && e.stream == s && e.seq <= upto);
  });
  std::vector<Deferred> landing(std::make_move_iterator(done), std::make_move_iterator(deferred.end()));
  deferred.erase(done, deferred.end());
  land(landing.begin(), landing.end());
}

void complete_stream(c10::DeviceIndex d, c10::StreamId s) {
  if (!config.async) return;
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  complete(d, s, queues[{d, s}].enqueued);
}

void complete_device(c10::DeviceIndex d) {
  if (!config.async) return;
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  std::vector<c10::StreamId> ids;
  for (auto& [key, q] : queues)
    if (key.first == d) ids.push_back(key.second);
  for (auto s : ids) complete_stream(d, s);
}

// A write to host memory that lands when (d, s) completes past the current position.
uint64_t defer(c10::DeviceIndex d, c10::StreamId s, at::Tensor dst, at::Tensor src) {
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  auto seq = ++queues[{d, s}].enqueued;
  auto id = next_deferred_id++;
  deferred.push_back({id, d, s, seq, std::move(dst), std::move(src)});
  return id;
}

// Lands the given deferred writes now (Work.wait() of a collective).
void land_ids(const std::vector<uint64_t>& ids) {
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  auto done = std::stable_partition(deferred.begin(), deferred.end(), [&](const Deferred& e) {
    return std::find(ids.begin(), ids.end(), e.id) == ids.end();
  });
  std::vector<Deferred> landing(std::make_move_iterator(done), std::make_move_iterator(deferred.end()));
  deferred.erase(done, deferred.end());
  for (const auto& e : landing) {  // Work.wait(): the current stream waits for the collective
    auto& q = queues[{e.device, tl_stream[e.device]}];
    q.waits.emplace_back(++q.enqueued, e.stream, e.seq);
  }
  land(landing.begin(), landing.end());
}

bool is_async() { return config.async; }

// An async collective's result; as ProcessGroupXCCL's stream does, XCCL's queue first waits for the current stream.
uint64_t defer_collective(c10::DeviceIndex d, at::Tensor dst, at::Tensor src) {
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  const auto after = queues[{d, tl_stream[d]}].enqueued;
  auto id = defer(d, kCollectiveStream, std::move(dst), std::move(src));
  auto& q = queues[{d, kCollectiveStream}];
  q.waits.emplace_back(q.enqueued, tl_stream[d], after);
  return id;
}

uint64_t collective_position(c10::DeviceIndex d) { return stream_position(d, kCollectiveStream); }

bool landed(const std::vector<uint64_t>& ids) {
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  for (auto& e : deferred)
    if (std::find(ids.begin(), ids.end(), e.id) != ids.end()) return false;
  return true;
}

// ---------------------------------------------------------------- device guard
std::atomic<c10::StreamId> next_stream_id{1};

struct EmuEvent {
  std::chrono::steady_clock::time_point t;
  bool recorded = false;
  c10::DeviceIndex device = 0;
  c10::StreamId stream = 0;
  uint64_t seq = 0;  // the stream's position when recorded
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
    try {
      return static_cast<c10::DeviceIndex>(num_devices());
    } catch (...) {
      return 0;
    }
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device ",
                static_cast<int>(device_index), " does not match recording stream's device ",
                static_cast<int>(stream.device_index()), ".");
    if (*event == nullptr) *event = new EmuEvent();
    auto* e = static_cast<EmuEvent*>(*event);
    e->t = std::chrono::steady_clock::now();
    e->recorded = true;
    e->device = stream.device_index();
    e->stream = stream.id();
    std::lock_guard<std::recursive_mutex> g(queue_mu);
    e->seq = config.async ? queues[{e->device, e->stream}].enqueued : 0;
  }
  // The stream waits for the event: completing the stream past this point completes the event's stream too.
  void block(void* event, const c10::Stream& stream) const override {
    auto* e = static_cast<EmuEvent*>(event);
    if (e == nullptr || !e->recorded || !config.async) return;
    std::lock_guard<std::recursive_mutex> g(queue_mu);
    auto& q = queues[{stream.device_index(), stream.id()}];
    q.waits.emplace_back(++q.enqueued, e->stream, e->seq);
  }
  bool queryEvent(void* event) const override {
    auto* e = static_cast<EmuEvent*>(event);
    if (e == nullptr || !e->recorded || !config.async) return true;
    std::lock_guard<std::recursive_mutex> g(queue_mu);
    return queues[{e->device, e->stream}].completed >= e->seq;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<EmuEvent*>(event);
  }
  bool queryStream(const c10::Stream& s) const override {
    if (!config.async) return true;
    std::lock_guard<std::recursive_mutex> g(queue_mu);
    auto& q = queues[{s.device_index(), s.id()}];
    return q.completed >= q.enqueued;
  }
  void synchronizeStream(const c10::Stream& s) const override {
    counters.synchronize++;
    complete_stream(s.device_index(), s.id());
  }
  void synchronizeEvent(void* event) const override {
    counters.synchronize++;
    auto* e = static_cast<EmuEvent*>(event);
    if (e != nullptr && e->recorded) complete(e->device, e->stream, e->seq);
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    counters.synchronize++;
    complete_device(resolve(d));
  }
  void recordDataPtrOnStream(const c10::DataPtr& dp, const c10::Stream& s) const override {
    record_data_ptr_on_stream(dp, s);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<EmuEvent*>(start);
    auto* b = static_cast<EmuEvent*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded,
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(queryEvent(start) && queryEvent(end),
                "Both events must be completed before calculating elapsed time.");
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

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

// The bookkeeping of c10/xpu/XPUCachingAllocator.cpp (torch 2.13), without its memory: requests are rounded to
// blocks, blocks are carved out of segments reserved from the device (2 MiB for small requests, 20 MiB for
// requests under 10 MiB, else rounded to 2 MiB), freed blocks stay cached and merge with free neighbours, and only
// empty_cache() (or an allocation that would not fit otherwise) returns whole free segments to the device. The
// statistics and the out-of-memory decision follow these books; the bytes themselves are ordinary host memory.
constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = 1048576;
constexpr size_t kSmallBuffer = 2097152;
constexpr size_t kLargeBuffer = 20971520;
constexpr size_t kMinLargeAlloc = 10485760;
constexpr size_t kRoundLarge = 2097152;

struct MBlock {
  size_t size;
  size_t requested = 0;
  bool small;
  bool allocated = false;
  uint64_t order;  // address order within the device
  MBlock* prev = nullptr;
  MBlock* next = nullptr;
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct BySize {
  bool operator()(const MBlock* a, const MBlock* b) const {
    return std::tie(a->size, a->order) < std::tie(b->size, b->order);
  }
};

struct Block {
  c10::DeviceIndex device;
  MBlock* model;
  void* owned;           // memory from posix_memalign, freed with the block
  c10::DataPtr adopted;  // or memory a CPU kernel produced, released by its own deleter
};

struct DeviceModel {
  std::set<MBlock*, BySize> small_free, large_free;
  uint64_t next_order = 0;
  std::set<MBlock*, BySize>& pool(bool small) { return small ? small_free : large_free; }
};

struct EmuAllocator final : public c10::DeviceAllocator {
  std::mutex mu;
  std::array<DeviceStats, kMaxDevices> stats;
  std::array<DeviceModel, kMaxDevices> models;

  static size_t round_size(size_t n) {
    return n < kMinBlockSize ? kMinBlockSize : kMinBlockSize * ((n + kMinBlockSize - 1) / kMinBlockSize);
  }
  static size_t allocation_size(size_t size) {
    if (size <= kSmallSize) return kSmallBuffer;
    if (size < kMinLargeAlloc) return kLargeBuffer;
    return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
  }

  int64_t limit(c10::DeviceIndex d) const {
    double f = memory_fraction[d];
    return f > 0 ? static_cast<int64_t>(f * total_memory(d)) : total_memory(d);
  }

  template <typename F>
  static void for_types(bool small, F f) {
    f(static_cast<size_t>(StatType::AGGREGATE));
    f(static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL));
  }

  // Returns whole free segments to the device (emptyCache, and the retry before an out-of-memory error).
  void release_cached(c10::DeviceIndex d) {
    auto& m = models[d];
    auto& st = stats[d];
    for (auto* pool : {&m.small_free, &m.large_free}) {
      for (auto it = pool->begin(); it != pool->end();) {
        MBlock* b = *it;
        if (b->is_split()) { ++it; continue; }
        for_types(b->small, [&](size_t t) {
          st.segment[t].decrease(1);
          st.reserved_bytes[t].decrease(b->size);
        });
        st.num_device_free++;
        it = pool->erase(it);
        delete b;
      }
    }
  }

  // Books a request of n bytes on device d (a cached block, or a new segment) or raises like the real allocator.
  MBlock* book(c10::DeviceIndex d, size_t n) {
    std::lock_guard<std::mutex> g(mu);
    auto& m = models[d];
    auto& st = stats[d];
    size_t size = round_size(n);
    bool small = size <= kSmallSize;
    auto& pool = m.pool(small);
    MBlock key{size, 0, small, false, 0};
    auto it = pool.lower_bound(&key);
    MBlock* b = nullptr;
    if (it != pool.end()) {
      b = *it;
      pool.erase(it);
    } else {
      size_t alloc = allocation_size(size);
      auto reserved = [&] { return st.reserved_bytes[0].current; };
      if (reserved() + static_cast<int64_t>(alloc) > limit(d)) {
        release_cached(d);
        st.num_alloc_retries++;
      }
      if (reserved() + static_cast<int64_t>(alloc) > limit(d)) {
        st.num_ooms++;
        std::string allowed = memory_fraction[d] > 0 ? format_size(limit(d)) + " allowed; " : "";
        TORCH_CHECK_WITH(
            OutOfMemoryError, false,
            "XPU out of memory. Tried to allocate ", format_size(alloc), ". GPU ", static_cast<int>(d),
            " has a total capacity of ", format_size(total_memory(d)), " of which ",
            format_size(total_memory(d) - reserved()), " is free. ", allowed, "Of the allocated memory ",
            format_size(st.allocated_bytes[0].current), " is allocated by PyTorch, and ",
            format_size(reserved() - st.allocated_bytes[0].current), " is reserved by PyTorch but unallocated.",
            " Please use `empty_cache` to release all unoccupied cached memory.");
      }
      b = new MBlock{alloc, 0, small, false, m.next_order};
      m.next_order += alloc;
      for_types(small, [&](size_t t) {
        st.segment[t].increase(1);
        st.reserved_bytes[t].increase(alloc);
      });
      st.num_device_alloc++;
    }
    bool already_split = b->is_split();
    size_t remaining = b->size - size;
    if (small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
      auto* rest = new MBlock{remaining, 0, small, false, b->order + size};
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      pool.insert(rest);
      for_types(small, [&](size_t t) {
        if (already_split) {
          st.inactive_split_bytes[t].decrease(size);
        } else {
          st.inactive_split[t].increase(1);
          st.inactive_split_bytes[t].increase(remaining);
        }
      });
    } else if (already_split) {
      for_types(small, [&](size_t t) {
        st.inactive_split[t].decrease(1);
        st.inactive_split_bytes[t].decrease(b->size);
      });
    }
    b->allocated = true;
    b->requested = n;
    for_types(small, [&](size_t t) {
      st.allocation[t].increase(1);
      st.active[t].increase(1);
      st.allocated_bytes[t].increase(b->size);
      st.active_bytes[t].increase(b->size);
      st.requested_bytes[t].increase(n);
    });
    return b;
  }

  void unbook(c10::DeviceIndex d, MBlock* b) {
    std::lock_guard<std::mutex> g(mu);
    auto& st = stats[d];
    auto& pool = models[d].pool(b->small);
    for_types(b->small, [&](size_t t) {
      st.allocation[t].decrease(1);
      st.active[t].decrease(1);
      st.allocated_bytes[t].decrease(b->size);
      st.active_bytes[t].decrease(b->size);
      st.requested_bytes[t].decrease(b->requested);
    });
    b->allocated = false;
    int64_t split_blocks = 0, split_bytes = 0;
    for (MBlock* c : {b->prev, b->next}) {
      if (c == nullptr || c->allocated) continue;
      pool.erase(c);
      if (c == b->prev) {
        b->order = c->order;
        b->prev = c->prev;
        if (b->prev) b->prev->next = b;
      } else {
        b->next = c->next;
        if (b->next) b->next->prev = b;
      }
      b->size += c->size;
      split_blocks -= 1;
      split_bytes -= static_cast<int64_t>(c->size);
      delete c;
    }
    if (b->is_split()) {
      split_blocks += 1;
      split_bytes += static_cast<int64_t>(b->size);
    }
    pool.insert(b);
    for_types(b->small, [&](size_t t) {
      if (split_blocks > 0) st.inactive_split[t].increase(split_blocks);
      if (split_blocks < 0) st.inactive_split[t].decrease(-split_blocks);
      if (split_bytes > 0) st.inactive_split_bytes[t].increase(split_bytes);
      if (split_bytes < 0) st.inactive_split_bytes[t].decrease(-split_bytes);
    });
  }

  static void deleter(void* ctx);

  c10::DataPtr allocate(size_t n) override {
    check_not_bad_fork();
    auto d = tl_device;
    check_index(d);
    sanitizer_allocating(d);
    MBlock* model = book(d, n);
    void* p = nullptr;
    if (n > 0 && posix_memalign(&p, 64, n) != 0) {
      unbook(d, model);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "XPU out of memory. Tried to allocate ",
                       format_size(n), " (host memory backing the emulated device is exhausted)");
    }
    // Device memory is not cleared: a new block holds what its last user left (here: poison bytes, never the
    // zeros of fresh host pages).
    if (n > 0) std::memset(p, kPoison, n);
    auto* blk = new Block{d, model, p, {}};
    sanitizer_allocated(blk, d);
    return {p, blk, &EmuAllocator::deleter, c10::Device(kXPU, d)};
  }

  // Takes over memory a CPU kernel allocated for an output (zero-copy), booking it on device d.
  c10::DataPtr adopt(c10::DataPtr cpu, size_t n, c10::DeviceIndex d) {
    sanitizer_allocating(d);
    MBlock* model = book(d, n);
    void* p = cpu.get();
    auto* blk = new Block{d, model, nullptr, std::move(cpu)};
    sanitizer_allocated(blk, d);
    return {p, blk, &EmuAllocator::deleter, c10::Device(kXPU, d)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {
    std::lock_guard<std::mutex> g(mu);
    for (int d = 0; d < config.num_devices; ++d) release_cached(static_cast<c10::DeviceIndex>(d));
  }
  void recordStream(const c10::DataPtr& dp, c10::Stream s) override {
    if (dp.get_deleter() == &EmuAllocator::deleter) sanitizer_record_stream(dp.get_context(), s.id());
  }
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
    TORCH_CHECK(config.free_memory_query, "The device (", config.name, ") doesn't support querying the available "
                "free memory. You can file an issue at https://github.com/pytorch/pytorch/issues to help us "
                "prioritize its implementation.");
    std::lock_guard<std::mutex> g(mu);
    auto used = stats[d].reserved_bytes[0].current;
    return {static_cast<size_t>(std::max<int64_t>(total_memory(d) - used, 0)),
            static_cast<size_t>(total_memory(d))};
  }
};
EmuAllocator& allocator = *new EmuAllocator();

// The allocation behind an xpu tensor's memory (what the sanitizer keys its records by), or nullptr.
const void* allocation_of(const at::Tensor& t) {
  const auto& dp = t.storage().data_ptr();
  return dp.get_deleter() == &EmuAllocator::deleter ? dp.get_context() : nullptr;
}

void EmuAllocator::deleter(void* ctx) {
  auto* blk = static_cast<Block*>(ctx);
  sanitizer_freed(blk);
  allocator.unbook(blk->device, blk->model);
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
// A seed + offset generator with the state layout and semantics of torch's XPUGeneratorImpl (Philox on hardware):
// get_state() is 16 bytes (uint64 seed, uint64 offset), set_state() takes 16 bytes (or 8: seed only, offset 0),
// setting the seed resets the offset to 0, offsets are multiples of 4, and every random operator reserves
// (seed, offset) under the generator's lock and advances the offset. The fallback runs the CPU kernel with a fresh
// CPU generator derived from that (seed, offset) pair: the same pair gives the same numbers, but not Intel's numbers.
struct EmuGeneratorState : public c10::intrusive_ptr_target {
  uint64_t seed = c10::default_rng_seed_val;
  uint64_t offset = 0;
  EmuGeneratorState(uint64_t s, uint64_t o) : seed(s), offset(o) {}
};

constexpr uint64_t kPhiloxRound = 4;
constexpr size_t kSeedSize = sizeof(uint64_t), kOffsetSize = sizeof(uint64_t);

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

struct EmuGenerator final : public c10::GeneratorImpl {
  c10::intrusive_ptr<EmuGeneratorState> state;
  explicit EmuGenerator(c10::DeviceIndex d, c10::intrusive_ptr<EmuGeneratorState> st =
                                                 c10::make_intrusive<EmuGeneratorState>(c10::default_rng_seed_val, 0))
      : c10::GeneratorImpl(c10::Device(kXPU, d), c10::DispatchKeySet(c10::DispatchKey::XPU)), state(std::move(st)) {}
  // As in torch, callers (torch.Generator's methods, the kernels) hold mutex_; these do not lock.
  void set_current_seed(uint64_t s) override { state->seed = s; state->offset = 0; }
  void set_offset(uint64_t o) override {
    TORCH_CHECK(o % kPhiloxRound == 0, "offset must be a multiple of 4");
    state->offset = o;
  }
  uint64_t get_offset() const override { return state->offset; }
  uint64_t current_seed() const override { return state->seed; }
  uint64_t seed() override {
    auto random = c10::detail::getNonDeterministicRandom(true);
    set_current_seed(random);
    return random;
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::detail::empty_cpu({static_cast<int64_t>(kSeedSize + kOffsetSize)}, c10::ScalarType::Byte,
                                   std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    std::memcpy(t.data_ptr<uint8_t>(), &state->seed, kSeedSize);
    std::memcpy(t.data_ptr<uint8_t>() + kSeedSize, &state->offset, kOffsetSize);
    return t.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& s) override {
    at::detail::check_rng_state(s);
    auto n = s.numel();
    TORCH_CHECK(n == static_cast<int64_t>(kSeedSize) || n == static_cast<int64_t>(kSeedSize + kOffsetSize),
                "RNG state is wrong size");
    const auto* bytes = s.data_dtype_initialized<uint8_t>();
    uint64_t seed = 0, offset = 0;
    std::memcpy(&seed, bytes, kSeedSize);
    if (n > static_cast<int64_t>(kSeedSize)) std::memcpy(&offset, bytes + kSeedSize, kOffsetSize);
    set_current_seed(seed);
    set_offset(offset);
  }
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& other) override {
    auto* g = dynamic_cast<EmuGenerator*>(other.get());
    TORCH_CHECK(g, "Expected a XPU Generator");
    state = g->state;
  }
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override {
    return c10::make_intrusive<EmuGenerator>(device().index(), state);
  }
  // What a kernel does with philox_engine_inputs(increment), caller holding mutex_: the CPU generator the operator
  // runs with, derived from (seed, offset); `advance` then moves the offset past what the operator drew.
  at::Generator engine() const {
    return at::detail::createCPUGenerator(splitmix64(state->seed ^ splitmix64(state->offset)));
  }
  void advance(uint64_t increment) {
    state->offset += (increment + kPhiloxRound - 1) / kPhiloxRound * kPhiloxRound;
  }
  static c10::DeviceType device_type() { return kXPU; }
 private:
  EmuGenerator* clone_impl() const override {
    return new EmuGenerator(device().index(), c10::make_intrusive<EmuGeneratorState>(state->seed, state->offset));
  }
};

std::vector<at::Generator>& default_generators = *new std::vector<at::Generator>();

const at::Generator& default_generator(c10::DeviceIndex d) {
  d = resolve(d);
  check_index(d);
  return default_generators.at(d);
}

void make_default_generators(int n) {
  for (int i = static_cast<int>(default_generators.size()); i < n; ++i) {
    default_generators.push_back(at::make_generator<EmuGenerator>(i));
    default_generators.back().seed();  // a default generator starts from a random seed, as getDefaultXPUGenerator's
  }
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
  bool isAvailable() const override { return num_devices() > 0; }
  std::string showConfig() const override { return "emulated XPU (lightning_xpu.emulator): " + config.name + "\n"; }
  int32_t getGlobalIdxFromDevice(const c10::Device& d) const override { return d.index(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override { return default_generator(d); }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    d = resolve(d);
    check_index(d);
    return at::make_generator<EmuGenerator>(d);
  }
  c10::DeviceIndex getNumGPUs() const override { return static_cast<c10::DeviceIndex>(num_devices()); }
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
  void deviceSynchronize(c10::DeviceIndex d) const override {
    counters.synchronize++;
    complete_device(resolve(d));
  }
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

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  check_not_bad_fork();
  TORCH_CHECK(self.defined() && dst.defined(), "copy_: undefined tensor");
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

bool is_fp64(c10::ScalarType st) { return st == at::kDouble || st == at::kComplexDouble; }

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
  TORCH_CHECK(config.has_fp64 || !fs.fp64 || is_view(schema),
              "Required aspect fp64 is not supported on the device (", config.name,
              " has no native fp64; operator ", schema.name(), ")");
  const c10::DeviceGuard guard(c10::Device(kXPU, *fs.device));
  alert_if_nondeterministic(op, *stack, first);  // deterministic.cpp: as Intel's XPU kernels alert
  enqueue(*fs.device, current_stream_id(*fs.device));
  if (sanitizer_enabled()) sanitize_arguments(schema, *stack, first);

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
    TORCH_CHECK(config.has_fp64 || !is_fp64(t.scalar_type()) || is_view(schema),
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
}

TORCH_LIBRARY_IMPL(aten, AutogradXPU, m) {
  m.impl("scaled_dot_product_attention", xpu_emu::scaled_dot_product_attention);
}

TORCH_LIBRARY_IMPL(_, XPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&xpu_emu::fallback>());
}

// ---------------------------------------------------------------- Python bindings
namespace xpu_emu {

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
    bool has_out = false;
    for (const auto& a : op->schema().arguments()) has_out = has_out || a.is_out();
    if (has_out) continue;
    static auto& names = *new std::deque<std::string>();
    names.push_back(name.overload_name.empty() ? name.name.substr(6) : name.name.substr(6) + "." + name.overload_name);
    lib->impl(names.back().c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

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
  m.def("configure", [](int stacks, int stacks_per_card, int64_t stack_memory, bool has_fp64, bool free_memory_query,
                        bool async, std::string name) {
    TORCH_CHECK(stacks >= 1 && stacks <= kMaxDevices, "the emulator supports 1 to ", kMaxDevices, " devices, got ",
                stacks);
    TORCH_CHECK(config.num_stacks == 0 || config.num_stacks == stacks,
                "the emulator is already configured with ", config.num_stacks, " devices");
    config.num_stacks = stacks;
    config.stacks_per_card = stacks_per_card;
    config.stack_memory = stack_memory;
    config.has_fp64 = has_fp64;
    config.free_memory_query = free_memory_query;
    config.async = async;
    config.name = std::move(name);
  });
  m.def("register_functional_fallbacks", &register_functional_fallbacks);
  m.def("set_sanitizer", &sanitizer_enable, "Switch the stream sanitizer on or off (sanitizer.cpp).");
  m.def("set_torch_release", &xccl_set_torch_release, "The torch release whose ProcessGroupXCCL is modelled.");
  // torch internals: whether at::detail::getXPUHooks() is this library's (without counting devices, which would
  // enumerate them and fix ZE_AFFINITY_MASK before the runtime is initialised).
  m.def("hooks_installed", []() { return dynamic_cast<const EmuXPUHooks*>(&at::detail::getXPUHooks()) != nullptr; });
  m.def("devices", []() {
    enumerate();
    py::list out;
    for (auto& d : config.devices) out.append(py::make_tuple(d.card, d.stack, d.total_memory));
    return out;
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
    py::tuple t(num_devices());
    for (int i = 0; i < config.num_devices; ++i)
      t[i] = py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generators[i]));
    return t;
  });
  m.def("is_in_bad_fork", []() { return torch::utils::is_device_in_bad_fork(kXPU); });
  m.def("device_count", []() { return num_devices(); });
  m.def("get_device_count", []() {
    // As torch/csrc/xpu/Module.cpp's _xpu_getDeviceCount: counting through the runtime arms the fork poisoning.
    torch::utils::register_fork_handler_for_device_init(kXPU);
    return num_devices();
  });
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
    complete_device(resolve(d));
  });
  m.def("empty_cache", []() { allocator.emptyCache({0, 0}); });
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
