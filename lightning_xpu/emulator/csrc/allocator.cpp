// The allocators: the caching device allocator (the books and statistics of torch's XPU caching allocator, an
// emulated memory limit) and the pinned host allocator.

#include "emulator.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace xpu_emu {

// ---------------------------------------------------------------- the caching device allocator
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

struct Block {
  c10::DeviceIndex device;
  MBlock* model;
  void* owned;           // memory from posix_memalign, freed with the block
  c10::DataPtr adopted;  // or memory a CPU kernel produced, released by its own deleter
};

// torch.xpu._gpu_trace's memory allocation callback, fired as XPUCachingAllocator's malloc fires it (not for 0 bytes).
void trace_allocation(void* p) {
  if (auto* t = p != nullptr ? gpu_trace() : nullptr)
    (*t)->trace_gpu_memory_allocation(kXPU, reinterpret_cast<uintptr_t>(p));
}

size_t EmuAllocator::round_size(size_t n) {
  return n < kMinBlockSize ? kMinBlockSize : kMinBlockSize * ((n + kMinBlockSize - 1) / kMinBlockSize);
}
size_t EmuAllocator::allocation_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

// What the driver and other processes leave of the device (LIGHTNING_XPU_EMULATOR_MEMORY_RESERVE).
int64_t EmuAllocator::usable(c10::DeviceIndex d) const { return total_memory(d) - config.memory_reserve; }

// The per-process fraction is of the total capacity, as in XPUCachingAllocator; the device runs out first if the
// reserve leaves less.
int64_t EmuAllocator::limit(c10::DeviceIndex d) const {
  double f = memory_fraction[d];
  return f > 0 ? std::min(static_cast<int64_t>(f * total_memory(d)), usable(d)) : usable(d);
}

template <typename F>
void EmuAllocator::for_types(bool small, F f) {
  f(static_cast<size_t>(StatType::AGGREGATE));
  f(static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL));
}

// Returns whole free segments to the device (emptyCache, and the retry before an out-of-memory error): the device's
// own cache and that of every private pool no MemPool holds any more.
void EmuAllocator::release_cached(c10::DeviceIndex d) {
  release_free_segments(d, models[d]);
  for (auto& [id, p] : private_pools[d])
    if (p.use_count == 0) release_free_segments(d, p.model);
}

void EmuAllocator::release_free_segments(c10::DeviceIndex d, DeviceModel& m) {
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
// The pool the calling thread allocates from on device d: a MemPool's inside use_mem_pool, else the device's.
thread_local std::array<c10::MempoolId_t, kMaxDevices> tl_pool{};

DeviceModel& EmuAllocator::allocating_model(c10::DeviceIndex d) {
  auto id = tl_pool[d];
  return id == c10::MempoolId_t{0, 0} ? models[d] : private_pools[d].at(id).model;
}

void EmuAllocator::create_or_incref_pool(c10::DeviceIndex d, c10::MempoolId_t id) {
  check_index(d);
  std::lock_guard<std::mutex> g(mu);
  private_pools[d][id].use_count++;
}

void EmuAllocator::release_pool(c10::DeviceIndex d, c10::MempoolId_t id) {
  check_index(d);
  std::lock_guard<std::mutex> g(mu);
  auto it = private_pools[d].find(id);
  TORCH_CHECK(it != private_pools[d].end() && it->second.use_count > 0, "Pool (", id.first, ", ", id.second,
              ") is not in use on device ", static_cast<int>(d));
  it->second.use_count--;
}

int EmuAllocator::pool_use_count(c10::DeviceIndex d, c10::MempoolId_t id) {
  check_index(d);
  std::lock_guard<std::mutex> g(mu);
  auto it = private_pools[d].find(id);
  return it == private_pools[d].end() ? 0 : it->second.use_count;
}

void EmuAllocator::begin_allocate_to_pool(c10::DeviceIndex d, c10::MempoolId_t id) {
  create_or_incref_pool(d, id);
  tl_pool[d] = id;
}

void EmuAllocator::end_allocate_to_pool(c10::DeviceIndex d, c10::MempoolId_t id) {
  check_index(d);
  if (tl_pool[d] == id) tl_pool[d] = {0, 0};
}

MBlock* EmuAllocator::book(c10::DeviceIndex d, size_t n) {
  std::lock_guard<std::mutex> g(mu);
  auto& m = allocating_model(d);
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
          format_size(std::max<int64_t>(usable(d) - reserved(), 0)), " is free. ", allowed, "Of the allocated memory ",
          format_size(st.allocated_bytes[0].current), " is allocated by PyTorch, and ",
          format_size(reserved() - st.allocated_bytes[0].current), " is reserved by PyTorch but unallocated.",
          " Please use `empty_cache` to release all unoccupied cached memory.");
    }
    b = new MBlock{alloc, 0, small, false, models[d].next_order};
    b->owner = &m;
    models[d].next_order += alloc;
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
    rest->owner = b->owner;
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

void EmuAllocator::unbook(c10::DeviceIndex d, MBlock* b) {
  std::lock_guard<std::mutex> g(mu);
  auto& st = stats[d];
  auto& pool = b->owner->pool(b->small);
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

c10::DataPtr EmuAllocator::allocate(size_t n) {
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
  trace_allocation(p);
  return {p, blk, &EmuAllocator::deleter, c10::Device(kXPU, d)};
}

// Takes over memory a CPU kernel allocated for an output (zero-copy), booking it on device d.
c10::DataPtr EmuAllocator::adopt(c10::DataPtr cpu, size_t n, c10::DeviceIndex d) {
  sanitizer_allocating(d);
  MBlock* model = book(d, n);
  void* p = cpu.get();
  auto* blk = new Block{d, model, nullptr, std::move(cpu)};
  sanitizer_allocated(blk, d);
  trace_allocation(p);
  return {p, blk, &EmuAllocator::deleter, c10::Device(kXPU, d)};
}

// empty_cache(): the device's cache and freeable pools'; a MemPool's destructor: that pool's cache alone.
void EmuAllocator::emptyCache(c10::MempoolId_t id) {
  std::lock_guard<std::mutex> g(mu);
  for (int i = 0; i < config.num_devices; ++i) {
    auto d = static_cast<c10::DeviceIndex>(i);
    if (id == c10::MempoolId_t{0, 0}) {
      release_cached(d);
    } else if (auto it = private_pools[d].find(id); it != private_pools[d].end()) {
      release_free_segments(d, it->second.model);
    }
  }
}
void EmuAllocator::recordStream(const c10::DataPtr& dp, c10::Stream s) {
  if (dp.get_deleter() == &EmuAllocator::deleter) sanitizer_record_stream(dp.get_context(), s.id());
}
DeviceStats EmuAllocator::getDeviceStats(c10::DeviceIndex d) {
  check_index(d);
  std::lock_guard<std::mutex> g(mu);
  return stats[d];
}
void EmuAllocator::resetAccumulatedStats(c10::DeviceIndex d) {
  check_index(d);
  std::lock_guard<std::mutex> g(mu);
  auto& st = stats[d];
  for (auto* arr : {&st.allocation, &st.segment, &st.active, &st.inactive_split, &st.allocated_bytes,
                    &st.reserved_bytes, &st.active_bytes, &st.inactive_split_bytes, &st.requested_bytes})
    for (auto& s : *arr) s.reset_accumulated();
  st.num_alloc_retries = 0;
  st.num_ooms = 0;
}
void EmuAllocator::resetPeakStats(c10::DeviceIndex d) {
  check_index(d);
  std::lock_guard<std::mutex> g(mu);
  auto& st = stats[d];
  for (auto* arr : {&st.allocation, &st.segment, &st.active, &st.inactive_split, &st.allocated_bytes,
                    &st.reserved_bytes, &st.active_bytes, &st.inactive_split_bytes, &st.requested_bytes})
    for (auto& s : *arr) s.reset_peak();
}
std::pair<size_t, size_t> EmuAllocator::getMemoryInfo(c10::DeviceIndex d) {
  check_index(d);
  TORCH_CHECK(config.free_memory_query, "The device (", config.name, ") doesn't support querying the available "
              "free memory. You can file an issue at https://github.com/pytorch/pytorch/issues to help us "
              "prioritize its implementation.");
  std::lock_guard<std::mutex> g(mu);
  auto used = stats[d].reserved_bytes[0].current;
  return {static_cast<size_t>(std::max<int64_t>(usable(d) - used, 0)),
          static_cast<size_t>(total_memory(d))};
}
EmuAllocator& allocator = *new EmuAllocator();

// The allocation behind an xpu tensor's memory (what the sanitizer keys its records by), or nullptr.
const void* allocation_of(const at::Tensor& t) {
  const auto& dp = t.storage().data_ptr();
  return dp.get_deleter() == &EmuAllocator::deleter ? dp.get_context() : nullptr;
}

void EmuAllocator::deleter(void* ctx) {
  auto* blk = static_cast<Block*>(ctx);
  void* p = blk->owned != nullptr ? blk->owned : blk->adopted.get();
  if (auto* t = p != nullptr ? gpu_trace() : nullptr)
    (*t)->trace_gpu_memory_deallocation(kXPU, reinterpret_cast<uintptr_t>(p));
  sanitizer_freed(blk);
  allocator.unbook(blk->device, blk->model);
  free(blk->owned);
  delete blk;
}

c10::DataPtr PinnedAllocator::allocate(size_t n) {
  void* p = nullptr;
  if (n > 0) {
    TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&p, 64, n) == 0, "out of pinned host memory");
    std::lock_guard<std::mutex> g(mu);
    ranges[reinterpret_cast<uintptr_t>(p)] = n;
  }
  return {p, p, &PinnedAllocator::deleter, c10::Device(c10::kCPU)};
}
bool PinnedAllocator::contains(const void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> g(mu);
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return false;
  --it;
  return p < it->first + it->second;
}
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

}  // namespace xpu_emu
