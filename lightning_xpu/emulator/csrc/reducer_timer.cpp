// DDP's timer for xpu: the Reducer measures forward, backward and communication time per iteration with the timer
// registered for its parameters' device type (DistributedDataParallel's logging data, `_get_ddp_logging_data()`).
// torch registers timers for CPU and CUDA; XPU builds of torch with xccl register theirs in torch-xpu-ops
// (src/xccl/reducer_xpu.cpp, release/2.8 onwards: XPU events on the current stream). Without one, the Reducer warns
// "Time stats are currently only collected for CPU and CUDA devices" once in every rank, which an Intel GPU never
// prints. This timer is that one, on the emulated events: recorded on the device's current stream, measured once both
// completed (the emulator's events time when their stream reaches them).

#include "emulator.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <array>
#include <optional>

namespace c10d {
namespace {

class EmulatedXpuTimer : public Timer {
 public:
  explicit EmulatedXpuTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event);  // the host-side timestamp, as every timer records it
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::XPU);
    event_for(event).record(impl.getStream(device_));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::Event& start_event = event_for(start);
    c10::Event& end_event = event_for(end);
    if (!start_event.was_marked_for_recording() || !end_event.was_marked_for_recording()) return std::nullopt;
    start_event.synchronize();
    end_event.synchronize();
    const double milliseconds = start_event.elapsedTime(end_event);
    if (milliseconds < 0) return std::nullopt;  // an end recorded before its start (DDP without sync, as CUDA's)
    return static_cast<int64_t>(milliseconds * 1000000.0);
  }

 private:
  c10::Event& event_for(Event event) {
    return events_[static_cast<size_t>(event)];
  }

  static c10::Event timing_event() {
    return c10::Event(c10::DeviceType::XPU, c10::EventFlag::BACKEND_DEFAULT);  // enable_timing=True
  }

  c10::Device device_;
  // one per Timer::Event, in its order
  std::array<c10::Event, 5> events_{timing_event(), timing_event(), timing_event(), timing_event(), timing_event()};
};

// torch internals: the registry the Reducer consults by device type (torch/csrc/distributed/c10d/reducer_timer.hpp)
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kXPU, EmulatedXpuTimer)

}  // namespace
}  // namespace c10d
