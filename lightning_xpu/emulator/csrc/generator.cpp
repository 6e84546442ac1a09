// The emulated XPU's random number generators: torch's XPUGeneratorImpl state layout, CPU engines derived from it.

#include "emulator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>

namespace xpu_emu {

// ---------------------------------------------------------------- generators
// A seed + offset generator with the state layout and semantics of torch's XPUGeneratorImpl (Philox on hardware):
// get_state() is 16 bytes (uint64 seed, uint64 offset), set_state() takes 16 bytes (or 8: seed only, offset 0),
// setting the seed resets the offset to 0, offsets are multiples of 4, and every random operator reserves
// (seed, offset) under the generator's lock and advances the offset. The fallback runs the CPU kernel with a fresh
// CPU generator derived from that (seed, offset) pair: the same pair gives the same numbers, but not Intel's numbers.
// The class is declared in emulator.h (the fallback draws through it).

constexpr uint64_t kPhiloxRound = 4;
constexpr size_t kSeedSize = sizeof(uint64_t), kOffsetSize = sizeof(uint64_t);

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

void EmuGenerator::set_offset(uint64_t o) {
  TORCH_CHECK(o % kPhiloxRound == 0, "offset must be a multiple of 4");
  state->offset = o;
}
uint64_t EmuGenerator::seed() {
  auto random = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(random);
  return random;
}
c10::intrusive_ptr<c10::TensorImpl> EmuGenerator::get_state() const {
  auto t = at::detail::empty_cpu({static_cast<int64_t>(kSeedSize + kOffsetSize)}, c10::ScalarType::Byte,
                                 std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  std::memcpy(t.data_ptr<uint8_t>(), &state->seed, kSeedSize);
  std::memcpy(t.data_ptr<uint8_t>() + kSeedSize, &state->offset, kOffsetSize);
  return t.getIntrusivePtr();
}
void EmuGenerator::set_state(const c10::TensorImpl& s) {
  at::detail::check_rng_state(s);
  auto n = s.numel();
  TORCH_CHECK(n == static_cast<int64_t>(kSeedSize) || n == static_cast<int64_t>(kSeedSize + kOffsetSize),
              "RNG state is wrong size");
  const auto* bytes = s.data_dtype_initialized<uint8_t>();
  uint64_t seed = 0, offset = 0;
  std::memcpy(&seed, bytes, kSeedSize);
  if (n > static_cast<int64_t>(kSeedSize)) std::memcpy(&offset, bytes + kSeedSize, kOffsetSize);
  set_current_seed(seed);
  set_offset(offset);
}
void EmuGenerator::graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& other) {
  auto* g = dynamic_cast<EmuGenerator*>(other.get());
  TORCH_CHECK(g, "Expected a XPU Generator");
  state = g->state;
}
c10::intrusive_ptr<c10::GeneratorImpl> EmuGenerator::graphsafe_get_state() const {
  return c10::make_intrusive<EmuGenerator>(device().index(), state);
}
at::Generator EmuGenerator::engine() const {
  return at::detail::createCPUGenerator(splitmix64(state->seed ^ splitmix64(state->offset)));
}
void EmuGenerator::advance(uint64_t increment) {
  state->offset += (increment + kPhiloxRound - 1) / kPhiloxRound * kPhiloxRound;
}
EmuGenerator* EmuGenerator::clone_impl() const {
  return new EmuGenerator(device().index(), c10::make_intrusive<EmuGeneratorState>(state->seed, state->offset));
}

std::vector<at::Generator>& default_generators = *new std::vector<at::Generator>();

const at::Generator& default_generator(c10::DeviceIndex d) {
  d = resolve(d);
  check_index(d);
  return default_generators.at(d);
}

void make_default_generators(int n) {
  for (int i = static_cast<int>(default_generators.size()); i < n; ++i) {
    default_generators.push_back(at::make_generator<EmuGenerator>(i));
    default_generators.back().seed();  // a default generator starts from a random seed, as getDefaultXPUGenerator's
  }
}

}  // namespace xpu_emu
