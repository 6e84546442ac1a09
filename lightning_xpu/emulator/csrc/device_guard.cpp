// The c10 DeviceGuardImpl of the emulated XPU: current device and stream per thread, streams, events.

#include "emulator.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>

namespace xpu_emu {

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

}  // namespace xpu_emu
