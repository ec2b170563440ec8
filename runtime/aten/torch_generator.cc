// The tpu random generator: a (seed, offset) pair per device. Random ops receive it as a
// runtime 2 x u64 parameter and draw counter-based bits from it inside their module
// (stablehlo.rng_bit_generator), so a seed reproduces a stream and nothing is compiled per call.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>

#include <mutex>
#include <random>

#include "aten/torch_tpu.h"

namespace torchtpu {
namespace {

class TpuGenerator final : public c10::GeneratorImpl {
 public:
  explicit TpuGenerator(c10::DeviceIndex device, uint64_t seed = 67280421310721ULL)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  uint64_t seed() override {
    std::random_device rd;
    set_current_seed((static_cast<uint64_t>(rd()) << 32) | rd());
    return seed_;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  // State as a uint8 tensor of 16 bytes: seed, offset.
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({16}, at::kByte, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    auto* data = static_cast<uint64_t*>(state.data_ptr());
    data[0] = seed_;
    data[1] = offset_;
    return state.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype() == at::kByte,
                "torchtpu: a tpu generator state is a uint8 tensor of 16 elements");
    const auto* data = static_cast<const uint64_t*>(state.data());
    seed_ = data[0];
    offset_ = data[1];
  }

  // Reserves `words` counter values and returns the (seed, offset) a module should start from.
  std::pair<uint64_t, uint64_t> advance(uint64_t words) {
    const uint64_t start = offset_;
    offset_ += words;
    return {seed_, start};
  }

 private:
  TpuGenerator* clone_impl() const override {
    auto* copy = new TpuGenerator(device().index(), seed_);
    copy->offset_ = offset_;
    return copy;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
};

std::mutex g_generators_mutex;

std::vector<at::Generator>& default_generators() {
  static std::vector<at::Generator> generators;
  return generators;
}

}  // namespace

const at::Generator& default_tpu_generator(int device) {
  std::lock_guard<std::mutex> lock(g_generators_mutex);
  auto& generators = default_generators();
  while (static_cast<int>(generators.size()) <= device) {
    generators.push_back(at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(generators.size())));
  }
  return generators[device];
}

at::Generator new_tpu_generator(int device) {
  return at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(device < 0 ? current_device() : device));
}

std::pair<uint64_t, uint64_t> reserve_random(const std::optional<at::Generator>& generator, int device,
                                             uint64_t words) {
  at::Generator gen = generator.has_value() && generator->defined() ? *generator : default_tpu_generator(device);
  TORCH_CHECK(gen.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'tpu' device type for generator but found '", gen.device().type(), "'");
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<TpuGenerator>(gen)->advance(words);
}

std::pair<uint64_t, uint64_t> generator_state(int device) {
  at::Generator gen = default_tpu_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return {gen.current_seed(), gen.get_offset()};
}

void set_generator_state(int device, uint64_t seed, uint64_t offset) {
  at::Generator gen = default_tpu_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
  gen.set_offset(offset);
}

uint64_t reseed_randomly(int device) {
  at::Generator gen = default_tpu_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.seed();
}

}  // namespace torchtpu
