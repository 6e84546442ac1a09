// The XPU stream sanitizer of the emulated Intel XPU (lightning_xpu.emulator).
//
// Operators run eagerly on the host, so a kernel on one stream never races one on another, and code that forgets
// to order its streams passes here and corrupts memory on an Intel GPU. This records, per allocation, the last write
// and the reads since (stream and position) and refuses an access that is not ordered after them: the same in-order
// queue, work the host saw complete, or a wait (Stream.wait_stream, Event.wait, Work.wait) directly or through other
// streams. PyTorch's CUDA sanitizer (TORCH_CUDA_SANITIZER=1) checks the same on CUDA.
// It also checks what the caching allocator of an Intel GPU makes of a free: the block goes back to the pool of the
// stream that allocated it, and that stream's next allocation may take it while another stream's work on it is still
// pending, unless the tensor was given to Tensor.record_stream for that stream. A free like that is reported at the
// allocating stream's next allocation, if that stream has not waited for the other one by then.
// On by default; LIGHTNING_XPU_EMULATOR_SANITIZER=0 switches it off.

#include "emulator.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace xpu_emu {

namespace {

struct Access {
  c10::StreamId stream;
  uint64_t seq;
};

struct Accesses {
  c10::DeviceIndex device;
  c10::StreamId allocated_on;
  std::optional<Access> write;
  std::vector<Access> reads;  // since the last write: the latest per stream
  std::vector<c10::StreamId> recorded;  // Tensor.record_stream
};

// A block back in its stream's pool while another stream's access to it may still be pending.
struct EarlyFree {
  Access pending;
  bool wrote;
};

bool enabled = false;
auto& table = *new std::unordered_map<const void*, Accesses>();
auto& early_frees = *new std::map<std::pair<c10::DeviceIndex, c10::StreamId>, std::vector<EarlyFree>>();

std::string stream_name(c10::StreamId s) {
  if (s == 0) return "the default stream";
  if (s == kCollectiveStreamId) return "XCCL's stream (an async collective)";
  return "stream " + std::to_string(s);
}

std::string how_to_wait(c10::StreamId other) {
  if (other == kCollectiveStreamId)
    return "call `work.wait()` on the collective's Work (async_op=True) first";
  return "make this stream wait first: `torch.xpu.current_stream().wait_stream(other_stream)` or `event.wait()`";
}

constexpr const char* kSwitch = " (the emulator's stream sanitizer; LIGHTNING_XPU_EMULATOR_SANITIZER=0 switches it off)";

[[noreturn]] void race(const Accesses& a, const Access& earlier, bool earlier_wrote, c10::StreamId s, bool write,
                       const char* op, const char* arg) {
  std::ostringstream msg;
  msg << "XPU stream sanitizer: " << op << " (argument '" << arg << "') on " << stream_name(s) << " of xpu:"
      << static_cast<int>(a.device) << (write ? " writes" : " reads") << " memory that " << stream_name(earlier.stream)
      << (earlier_wrote ? " writes" : " reads")
      << " and this stream did not wait for: a data race on an Intel GPU; " << how_to_wait(earlier.stream) << kSwitch;
  TORCH_CHECK(false, msg.str());
}

void check_and_record(Accesses& a, c10::StreamId s, uint64_t seq, bool write, const char* op, const char* arg) {
  auto unordered = [&](const Access& x) {
    return x.stream != s && !ordered_before(a.device, x.stream, x.seq, s, seq);
  };
  if (a.write && unordered(*a.write)) race(a, *a.write, true, s, write, op, arg);
  if (write) {
    for (const auto& r : a.reads)
      if (unordered(r)) race(a, r, false, s, write, op, arg);
    a.write = Access{s, seq};
    a.reads.clear();
    return;
  }
  for (auto& r : a.reads)
    if (r.stream == s) {
      r.seq = seq;
      return;
    }
  a.reads.push_back({s, seq});
}

}  // namespace

void sanitizer_enable(bool on) { enabled = on; }
bool sanitizer_enabled() { return enabled && is_async(); }

void sanitizer_allocated(const void* ctx, c10::DeviceIndex d) {
  if (!sanitizer_enabled()) return;
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  auto s = current_stream_id(d);
  // new memory counts as written by its stream now: the operator that asked for it fills it there
  table[ctx] = Accesses{d, s, Access{s, stream_position(d, s)}, {}, {}};
}

// Before an allocation on the current stream of d: a block this stream freed early may be the one it gets.
void sanitizer_allocating(c10::DeviceIndex d) {
  if (!sanitizer_enabled()) return;
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  auto s = current_stream_id(d);
  auto it = early_frees.find({d, s});
  if (it == early_frees.end()) return;
  auto now = stream_position(d, s);
  auto frees = std::move(it->second);
  early_frees.erase(it);
  for (const auto& f : frees) {
    if (ordered_before(d, f.pending.stream, f.pending.seq, s, now)) continue;
    std::ostringstream msg;
    msg << "XPU stream sanitizer: a tensor allocated on " << stream_name(s) << " of xpu:" << static_cast<int>(d)
        << " was freed while " << stream_name(f.pending.stream) << (f.wrote ? " wrote" : " read")
        << " it, and this stream did not wait for that: the caching allocator hands its memory to this stream's "
           "next allocation (this one) while the other stream may still use it, a data race on an Intel GPU; call "
           "`tensor.record_stream(other_stream)` before the tensor goes, or make this stream wait for the other "
           "first (`wait_stream`, `event.wait()`)"
        << kSwitch;
    TORCH_CHECK(false, msg.str());
  }
}

void sanitizer_record_stream(const void* ctx, c10::StreamId s) {
  if (!sanitizer_enabled() || ctx == nullptr) return;
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  auto it = table.find(ctx);
  if (it != table.end()) it->second.recorded.push_back(s);
}

// An access by the operator just enqueued on (d, s) at position `seq`.
void sanitizer_access_at(const at::Tensor& t, bool write, c10::StreamId s, uint64_t seq, const char* op,
                         const char* arg) {
  if (!sanitizer_enabled() || !t.defined() || !t.has_storage()) return;
  const void* ctx = allocation_of(t);
  if (ctx == nullptr) return;
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  auto it = table.find(ctx);
  if (it == table.end()) return;  // allocated while the sanitizer was off
  check_and_record(it->second, s, seq, write, op, arg);
}

// An access by the operator just enqueued on the current stream of the tensor's device.
void sanitizer_access(const at::Tensor& t, bool write, const char* op, const char* arg) {
  if (!sanitizer_enabled() || !t.defined() || !t.is_xpu()) return;
  auto d = t.device().index();
  auto s = current_stream_id(d);
  sanitizer_access_at(t, write, s, stream_position(d, s), op, arg);
}

void sanitizer_freed(const void* ctx) noexcept {
  if (!enabled) return;  // set once, when the emulator is enabled: no lock per free without the sanitizer
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  auto it = table.find(ctx);
  if (it == table.end()) return;
  const auto& a = it->second;
  const auto s = a.allocated_on;
  const auto now = stream_position(a.device, s);
  auto early = [&](const Access& x) {
    return x.stream != s && std::find(a.recorded.begin(), a.recorded.end(), x.stream) == a.recorded.end() &&
           !ordered_before(a.device, x.stream, x.seq, s, now);
  };
  std::vector<EarlyFree> frees;
  if (a.write && early(*a.write)) frees.push_back({*a.write, true});
  for (const auto& r : a.reads)
    if (early(r)) frees.push_back({r, false});
  if (!frees.empty()) {
    auto& pending = early_frees[{a.device, s}];
    pending.insert(pending.end(), frees.begin(), frees.end());
  }
  table.erase(it);
}

}  // namespace xpu_emu
