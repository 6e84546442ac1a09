// The XPU stream sanitizer of the emulated Intel XPU (lightning_xpu.emulator).
//
// Operators run eagerly on the host, so a kernel on one stream never races one on another, and code that forgets
// to order its streams passes here and corrupts memory on an Intel GPU. This records, per allocation, the last write
// and the reads since (stream and position) and refuses an access that is not ordered after them: the same in-order
// queue, work the host saw complete, or a wait (Stream.wait_stream, Event.wait, Work.wait) directly or through other
// streams. PyTorch's CUDA sanitizer (TORCH_CUDA_SANITIZER=1) checks the same on CUDA. Not checked: a block freed
// while another stream still uses it without record_stream (the allocator here never hands memory on early).
// On by default; LIGHTNING_XPU_EMULATOR_SANITIZER=0 switches it off.

#include <ATen/ATen.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace xpu_emu {

// emulator.cpp
extern std::recursive_mutex& queue_mu;
bool is_async();
c10::StreamId current_stream_id(c10::DeviceIndex d);
uint64_t stream_position(c10::DeviceIndex d, c10::StreamId s);
bool ordered_before(c10::DeviceIndex d, c10::StreamId t, uint64_t seq, c10::StreamId s, uint64_t upto);
const void* allocation_of(const at::Tensor& t);
extern const c10::StreamId kCollectiveStreamId;

namespace {

struct Access {
  c10::StreamId stream;
  uint64_t seq;
};

struct Accesses {
  c10::DeviceIndex device;
  std::optional<Access> write;
  std::vector<Access> reads;  // since the last write: the latest per stream
};

bool enabled = false;
auto& table = *new std::unordered_map<const void*, Accesses>();

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
  table[ctx] = Accesses{d, Access{s, stream_position(d, s)}, {}};
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
  table.erase(ctx);
}

}  // namespace xpu_emu
