// The emulated machine: its configuration (configure()), its devices as the runtime enumerates them
// (ZE_FLAT_DEVICE_HIERARCHY, ZE_AFFINITY_MASK), the counters, and the device checks every entry point makes.

#include "emulator.h"

#include <torch/csrc/utils/device_lazy_init.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace xpu_emu {

// Process-lifetime objects are leaked on purpose: torch's own static destructors (the autograd engine's device
// threads, tensors freed during interpreter shutdown) may still call into them after this library's statics die.
Config& config = *new Config();
std::mutex& enumerate_mu = *new std::mutex();
std::array<double, kMaxDevices> memory_fraction{};  // 0 = unset

Counters counters;
std::atomic<bool> initialized{false};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::vector<DeviceInfo> enumerate_devices() {
  auto hierarchy = env("ZE_FLAT_DEVICE_HIERARCHY");
  if (hierarchy.empty()) hierarchy = "FLAT";
  TORCH_CHECK_VALUE(hierarchy == "FLAT" || hierarchy == "COMPOSITE" || hierarchy == "COMBINED",
                    "ZE_FLAT_DEVICE_HIERARCHY=", hierarchy, ": expected FLAT, COMPOSITE or COMBINED");
  const int spc = config.stacks_per_card;
  const bool composite = hierarchy == "COMPOSITE" && spc > 1;
  TORCH_CHECK_VALUE(!composite || config.num_stacks % spc == 0, "ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE needs whole cards: "
                    "LIGHTNING_XPU_EMULATOR counts stacks (FLAT devices), ", spc, " per card, got ", config.num_stacks);
  std::vector<DeviceInfo> roots;  // the root devices before the mask, in Level Zero order
  if (composite) {
    for (int c = 0; c < config.num_stacks / spc; ++c) roots.push_back({c, -1, spc * config.stack_memory});
  } else {
    for (int s = 0; s < config.num_stacks; ++s)
      roots.push_back({s / spc, spc > 1 ? s % spc : -1, config.stack_memory});
  }
  auto mask = std::getenv("ZE_AFFINITY_MASK");
  if (mask == nullptr) return roots;
  // FLAT / COMBINED: "i" is the i-th root device. COMPOSITE: "c" is card c, "c.s" its stack s as a root device.
  // Entries that name nothing are ignored, as Level Zero ignores them; a mask that selects nothing leaves none.
  std::vector<DeviceInfo> picked;
  std::stringstream ss(mask);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto dot = item.find('.');
    char* end = nullptr;
    long first = std::strtol(item.c_str(), &end, 10);
    bool ok = end != item.c_str() && (dot == std::string::npos ? *end == '\0' : end == item.c_str() + dot);
    long second = -1;
    if (ok && dot != std::string::npos) {
      const char* s2 = item.c_str() + dot + 1;
      second = std::strtol(s2, &end, 10);
      ok = end != s2 && *end == '\0';
    }
    TORCH_CHECK_VALUE(ok && first >= 0, "ZE_AFFINITY_MASK='", mask, "': '", item, "' is not a device ('0') or a "
                      "stack of a device ('0.1')");
    DeviceInfo d{-2, -2, 0};
    if (second < 0) {
      if (first < static_cast<long>(roots.size())) d = roots[first];
    } else {
      TORCH_CHECK_VALUE(hierarchy == "COMPOSITE", "ZE_AFFINITY_MASK='", mask, "' uses COMPOSITE notation, but "
                        "ZE_FLAT_DEVICE_HIERARCHY is ", hierarchy, ": name devices by their FLAT index ('0,1')");
      if (first < (config.num_stacks + spc - 1) / spc && second < spc && first * spc + second < config.num_stacks)
        d = {static_cast<int>(first), spc > 1 ? static_cast<int>(second) : -1, config.stack_memory};
    }
    if (d.card == -2) continue;
    bool dup = false;
    for (auto& p : picked) dup = dup || (p.card == d.card && (p.stack == d.stack || p.stack == -1));
    if (!dup) picked.push_back(d);
  }
  std::sort(picked.begin(), picked.end(),
            [](const DeviceInfo& a, const DeviceInfo& b) { return std::tie(a.card, a.stack) < std::tie(b.card, b.stack); });
  return picked;
}

// The runtime's device enumeration: once per process, on first need.
void enumerate() {
  if (config.enumerated.load()) return;
  std::lock_guard<std::mutex> g(enumerate_mu);
  if (config.enumerated.load()) return;
  TORCH_CHECK(config.num_stacks > 0, "the XPU emulator is not configured");
  auto devices = enumerate_devices();
  TORCH_CHECK(devices.size() <= static_cast<size_t>(kMaxDevices), "the emulator supports up to ", kMaxDevices,
              " devices");
  config.devices = std::move(devices);
  config.num_devices = static_cast<int>(config.devices.size());
  make_default_generators(config.num_devices);
  config.enumerated = true;
}

int num_devices() {
  if (config.num_stacks == 0) return 0;  // before configure(): torch's accelerator probe
  enumerate();
  return config.num_devices;
}

int64_t total_memory(c10::DeviceIndex d) { return config.devices.at(d).total_memory; }

void check_not_bad_fork() {
  // torch internals: the same flag torch.xpu._is_in_bad_fork() reads.
  TORCH_CHECK(
      !torch::utils::is_device_in_bad_fork(kXPU),
      "Cannot re-initialize XPU in forked subprocess. To use XPU with "
      "multiprocessing, you must use the 'spawn' start method");
}

// c10::xpu::check_device_index, which every device-taking function of the XPU runtime calls (its message since
// pytorch/pytorch#144379, January 2025: every release the emulator models).
void check_index(c10::DeviceIndex d) {
  auto n = num_devices();
  TORCH_CHECK(d >= 0 && d < n, "The device index is out of range. It must be in [0, ", n, "), but got ",
              static_cast<int>(d), ".");
}

}  // namespace xpu_emu
