// The DDP reducer's timer for XPU (what torch-xpu-ops' src/xccl/reducer_xpu.cpp registers, from release/2.8 on).
//
// DistributedDataParallel asks c10d's TimerRegistry for a timer of its parameters' device type; without one for XPU
// its logger prints "Time stats are currently only collected for CPU and CUDA devices" once per process, which an
// XPU build of torch never prints. The real XpuTimer measures between XPU events; the emulator's operators run on
// the host as they are dispatched, so host timestamps (the base class's record) measure the same intervals.
// torch internals: c10d::Timer and TimerRegistry (torch/csrc/distributed/c10d/reducer_timer.hpp).

#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace c10d {  // where TimerRegistry's registerers live
namespace {

class XpuTimer final : public Timer {
 public:
  explicit XpuTimer(c10::Device) {}

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const auto from = getTimestamp(start);
    const auto to = getTimestamp(end);
    if (!from.has_value() || !to.has_value() || *to < *from) return std::nullopt;  // as XpuTimer: unset or negative
    return *to - *from;
  }
};

C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kXPU, XpuTimer)

}  // namespace
}  // namespace c10d
