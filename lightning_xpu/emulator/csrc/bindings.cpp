// The Python module of the native part (lightning_xpu_emulator_C): configuration, device and stream control,
// memory statistics and counters for lightning_xpu.emulator's Python side.

#include "emulator.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <thread>

// ---------------------------------------------------------------- Python bindings
namespace xpu_emu {

at::Tensor host_view(const at::Tensor& t) {
  HostViews hv;  // the view keeps the device storage alive on its own
  return hv.to_cpu(t);
}

void register_xccl(py::module& m);  // xccl.cpp (declared here: emulator.h stays free of pybind11)

// A kernel that torch.compile generated for xpu (lightning_xpu/emulator/_inductor.py runs it on the host right after):
// enqueued on the current stream of its device like any operator, so the stream model and the sanitizer see its reads
// and writes. `written[i]`: whether the kernel writes tensors[i] (`names[i]` names it in the sanitizer's message).
void launch_kernel(const std::string& kernel, c10::DeviceIndex device, const std::vector<at::Tensor>& tensors,
                   const std::vector<bool>& written, const std::vector<std::string>& names) {
  check_not_bad_fork();
  const auto d = resolve(device);
  check_index(d);
  const auto stream = current_stream_id(d);
  const auto seq = enqueue(d, stream);
  for (size_t i = 0; i < tensors.size(); ++i) {
    TORCH_CHECK(tensors[i].device() == c10::Device(kXPU, d), "compiled kernel ", kernel, " on xpu:",
                static_cast<int>(d), " got argument '", names[i], "' on ", tensors[i].device());
    sanitizer_access_at(tensors[i], written[i], stream, seq, kernel.c_str(), names[i].c_str());
  }
}

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
  m.def("configure", [](int stacks, int stacks_per_card, int64_t stack_memory, bool has_fp64,
                        bool fp64_conversion_emulation, int64_t memory_reserve, int64_t architecture,
                        bool free_memory_query, bool async, std::string name) {
    TORCH_CHECK(stacks >= 1 && stacks <= kMaxDevices, "the emulator supports 1 to ", kMaxDevices, " devices, got ",
                stacks);
    TORCH_CHECK(config.num_stacks == 0 || config.num_stacks == stacks,
                "the emulator is already configured with ", config.num_stacks, " devices");
    config.num_stacks = stacks;
    config.stacks_per_card = stacks_per_card;
    config.stack_memory = stack_memory;
    config.has_fp64 = has_fp64;
    config.fp64_conversion_emulation = fp64_conversion_emulation;
    config.memory_reserve = memory_reserve;
    config.architecture = architecture;
    config.free_memory_query = free_memory_query;
    config.async = async;
    config.name = std::move(name);
  });
  m.def("register_functional_fallbacks", &register_functional_fallbacks);
  m.def("set_sanitizer", &sanitizer_enable, "Switch the stream sanitizer on or off (sanitizer.cpp).");
  m.def("set_torch_release", &xccl_set_torch_release, "The torch release whose ProcessGroupXCCL is modelled.");
  m.def("hooks_installed", &hooks_installed);  // hooks.cpp
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
  m.def("sycl_queue", &sycl_queue_handle, "The sycl_queue value of a stream (device, stream id).");
  m.def("stream_priority", &stream_priority, "The priority of a stream (device, stream id): 1, 0 or -1.");
  m.def("event_elapsed_time", [](uintptr_t start, uintptr_t end) {
    return event_elapsed_ms(reinterpret_cast<void*>(start), reinterpret_cast<void*>(end));
  }, "Milliseconds between two completed events, given their event_id.");
  m.def("set_stream", [](int64_t id, c10::DeviceIndex d, int) {
    check_index(d);
    tl_device = d;
    tl_stream[d] = id;
  });
  m.def("synchronize", &synchronize_device);
  m.def("empty_cache", [](c10::MempoolId_t id) { allocator.emptyCache(id); }, py::arg("pool") = c10::MempoolId_t{0, 0});
  // torch.xpu.MemPool and use_mem_pool (_runtime.py's MemPool base and torch._C._xpu_*Pool functions)
  m.def("pool_create_or_incref", [](c10::DeviceIndex d, c10::MempoolId_t id) {
    allocator.create_or_incref_pool(resolve(d), id);
  });
  m.def("pool_release", [](c10::DeviceIndex d, c10::MempoolId_t id) { allocator.release_pool(resolve(d), id); });
  m.def("pool_use_count", [](c10::DeviceIndex d, c10::MempoolId_t id) {
    return allocator.pool_use_count(resolve(d), id);
  });
  m.def("pool_begin_allocate", [](c10::DeviceIndex d, c10::MempoolId_t id) {
    allocator.begin_allocate_to_pool(resolve(d), id);
  });
  m.def("pool_end_allocate", [](c10::DeviceIndex d, c10::MempoolId_t id) {
    allocator.end_allocate_to_pool(resolve(d), id);
  });
  m.def("memory_stats", &memory_stats);
  m.def("reset_peak_memory_stats", [](c10::DeviceIndex d) { allocator.resetPeakStats(resolve(d)); });
  m.def("reset_accumulated_memory_stats", [](c10::DeviceIndex d) { allocator.resetAccumulatedStats(resolve(d)); });
  m.def("mem_get_info", [](c10::DeviceIndex d) { return allocator.getMemoryInfo(resolve(d)); });
  m.def("set_memory_fraction", [](double f, c10::DeviceIndex d) {
    d = resolve(d);
    check_index(d);
    // XPUCachingAllocator::setMemoryFraction: a ValueError
    TORCH_CHECK_VALUE(f > 0 && f <= 1, "invalid fraction:", f, ". Please set within (0, 1].");
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
  m.def("launch_kernel", &launch_kernel, "Enqueue a compiled kernel's accesses on its device's current stream.");
  m.def("host_view", &host_view, "A CPU tensor over the same host memory as an xpu tensor (no copy).");
  register_xccl(m);
}
