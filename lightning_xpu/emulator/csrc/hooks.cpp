// The XPU hooks (at::XPUHooksInterface): what torch asks the XPU runtime (devices, generators, pinned memory).

#include "emulator.h"

#include <ATen/detail/XPUHooksInterface.h>

namespace xpu_emu {

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
  void deviceSynchronize(c10::DeviceIndex d) const override { synchronize_device(d); }
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

// torch internals: whether at::detail::getXPUHooks() is this library's (without counting devices, which would
// enumerate them and fix ZE_AFFINITY_MASK before the runtime is initialised).
bool hooks_installed() { return dynamic_cast<const EmuXPUHooks*>(&at::detail::getXPUHooks()) != nullptr; }

}  // namespace xpu_emu
