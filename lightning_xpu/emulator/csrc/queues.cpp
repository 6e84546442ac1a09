// The asynchronous stream model: every stream an in-order queue, with its position, its completion, the waits
// between streams and the writes deferred until completion (non_blocking copies, async collectives).

#include "emulator.h"

#include <algorithm>

namespace xpu_emu {

// ---------------------------------------------------------------- asynchronous execution
// Every stream is an in-order queue. Operators still run eagerly on the host, but what the host may observe is
// what it could observe on an Intel GPU: work enqueued on a stream is complete only once something waited for it
// (Stream/Event/device synchronize, a blocking copy or .item() on that stream). Until then queries answer false,
// a non_blocking device-to-host copy leaves kPoison bytes in its destination, and an async collective's outputs
// keep their old values; completion writes what the device had when the work was enqueued.
constexpr c10::StreamId kCollectiveStream = -2;  // XCCL's own queue: only wait() or a device synchronize
extern const c10::StreamId kCollectiveStreamId = kCollectiveStream;

struct Deferred {
  uint64_t id;
  c10::DeviceIndex device;
  c10::StreamId stream;
  uint64_t seq;
  at::Tensor dst;  // host memory (a CPU tensor, or a host view of device memory)
  at::Tensor src;  // the values to land there
};

std::recursive_mutex& queue_mu = *new std::recursive_mutex();
Queues& queues = *new Queues();
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

}  // namespace xpu_emu
