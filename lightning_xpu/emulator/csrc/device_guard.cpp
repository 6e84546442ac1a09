// The c10 DeviceGuardImpl of the emulated XPU: current device and stream per thread, streams, events.

#include "emulator.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/GPUTrace.h>

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
  check_index(d);  // as c10::xpu's stream functions check_device_index() every device they are given
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kXPU, d), id);
}

c10::DeviceIndex resolve(c10::DeviceIndex d) { return d < 0 ? tl_device : d; }

// The value torch.xpu.Stream.sycl_queue shows for a stream (the address of its sycl::queue on hardware), and the
// one the GPU trace callbacks receive for it.
uintptr_t sycl_queue_handle(c10::DeviceIndex d, c10::StreamId s) {
  return 0x5EC00000u + static_cast<uintptr_t>(d) * 0x10000u + static_cast<uintptr_t>(s);
}

// Stream priorities as c10/xpu/XPUStream.cpp maps them: low 1, normal 0, high -1 (priority_range() is (1, -1));
// a priority outside the range is clamped to its nearest end. The default and pool streams are normal unless a
// high-priority pool stream was asked for.
std::mutex& priority_mu = *new std::mutex();
auto& priorities = *new std::map<std::pair<c10::DeviceIndex, c10::StreamId>, int>();

int stream_priority(c10::DeviceIndex d, c10::StreamId s) {
  std::lock_guard<std::mutex> g(priority_mu);
  auto it = priorities.find({d, s});
  return it == priorities.end() ? 0 : it->second;
}

c10::Stream prioritized(c10::Stream s, int priority) {
  std::lock_guard<std::mutex> g(priority_mu);
  priorities[{s.device_index(), s.id()}] = std::clamp(priority, -1, 1);
  return s;
}

// torch.xpu._gpu_trace: the callbacks fire where c10/xpu and ATen/xpu fire them (XPUEvent, XPUStream::synchronize,
// syncStreamsOnDevice, the caching allocator), once torch._C._activate_gpu_trace() registered an interpreter.
const c10::impl::PyInterpreter* gpu_trace() { return c10::impl::GPUTrace::get_trace(); }

// torch.xpu.synchronize(), torch.accelerator.synchronize(), the hooks' deviceSynchronize: syncStreamsOnDevice.
void synchronize_device(c10::DeviceIndex d) {
  d = resolve(d);
  check_index(d);
  counters.synchronize++;
  complete_device(d);
  if (auto* t = gpu_trace()) (*t)->trace_gpu_device_synchronization(kXPU);
}

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
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    // two pools of 32 as c10::xpu keeps per priority: normal 1-32, high 33-64 (new streams from 65 on)
    auto slot = static_cast<c10::StreamId>(next_stream_id++ % 32);
    return prioritized(make_stream(resolve(d.index()), (high_priority ? 33 : 1) + slot), high_priority ? -1 : 0);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return prioritized(make_stream(resolve(d.index()), 64 + next_stream_id++), priority);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto i = s.device_index();
    check_index(i);
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
    if (*event == nullptr) {
      *event = new EmuEvent();
      if (auto* t = gpu_trace()) (*t)->trace_gpu_event_creation(kXPU, reinterpret_cast<uintptr_t>(*event));
    }
    auto* e = static_cast<EmuEvent*>(*event);
    e->t = std::chrono::steady_clock::now();
    e->recorded = true;
    e->device = stream.device_index();
    e->stream = stream.id();
    {
      std::lock_guard<std::recursive_mutex> g(queue_mu);
      e->seq = config.async ? queues[{e->device, e->stream}].enqueued : 0;
    }
    if (auto* t = gpu_trace())
      (*t)->trace_gpu_event_record(kXPU, reinterpret_cast<uintptr_t>(e), sycl_queue_handle(e->device, e->stream));
  }
  // The stream waits for the event: completing the stream past this point completes the event's stream too.
  void block(void* event, const c10::Stream& stream) const override {
    auto* e = static_cast<EmuEvent*>(event);
    if (e == nullptr || !e->recorded) return;
    if (auto* t = gpu_trace())
      (*t)->trace_gpu_event_wait(kXPU, reinterpret_cast<uintptr_t>(e),
                                 sycl_queue_handle(stream.device_index(), stream.id()));
    if (!config.async) return;
    std::lock_guard<std::recursive_mutex> g(queue_mu);
    auto& q = queues[{stream.device_index(), stream.id()}];
    q.waits.emplace_back(++q.enqueued, e->stream, e->seq);
  }
  bool queryEvent(void* event) const override { return event_query(event); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event == nullptr) return;
    if (auto* t = gpu_trace()) (*t)->trace_gpu_event_deletion(kXPU, reinterpret_cast<uintptr_t>(event));
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
    if (auto* t = gpu_trace())
      (*t)->trace_gpu_stream_synchronization(kXPU, sycl_queue_handle(s.device_index(), s.id()));
  }
  void synchronizeEvent(void* event) const override {
    counters.synchronize++;
    auto* e = static_cast<EmuEvent*>(event);
    if (e == nullptr) return;  // never recorded: XPUEvent::synchronize does nothing
    if (e->recorded) complete(e->device, e->stream, e->seq);
    if (auto* t = gpu_trace()) (*t)->trace_gpu_event_synchronization(kXPU, reinterpret_cast<uintptr_t>(e));
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override { synchronize_device(d); }
  void recordDataPtrOnStream(const c10::DataPtr& dp, const c10::Stream& s) const override {
    record_data_ptr_on_stream(dp, s);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    return event_elapsed_ms(start, end);
  }
};

bool event_query(void* event) {
  auto* e = static_cast<EmuEvent*>(event);
  if (e == nullptr || !e->recorded || !config.async) return true;
  std::lock_guard<std::recursive_mutex> g(queue_mu);
  return queues[{e->device, e->stream}].completed >= e->seq;
}

// Host time between two completed events (torch.xpu.Event.elapsed_time and the guard's elapsedTime).
double event_elapsed_ms(void* start, void* end) {
  auto* a = static_cast<EmuEvent*>(start);
  auto* b = static_cast<EmuEvent*>(end);
  TORCH_CHECK(a && b && a->recorded && b->recorded, "Both events must be recorded before calculating elapsed time.");
  TORCH_CHECK(event_query(start) && event_query(end),
              "Both events must be completed before calculating elapsed time.");
  return std::chrono::duration<double, std::milli>(b->t - a->t).count();
}
// torch internals: the registry torch consults for every xpu DeviceGuard/Stream/Event.
C10_REGISTER_GUARD_IMPL(XPU, EmuGuardImpl);

}  // namespace xpu_emu
