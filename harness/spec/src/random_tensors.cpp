// make_random_ssm_tensors: seeded random weights and state pools for a mode, drawn as each
// TensorSpec asks (uniform in [init_low, init_high) or normal(0, init_std)), stored in the spec's
// dtype. Each tensor has its own generator, seeded from (seed, weight/pool, name), so adding a
// tensor to a mode does not change the others. Used by the tests and the batch generator. A
// linear-attention layer gets its mode's pools and its core's weights only.
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/spec/linear_layer_specs.h"
#include "hybridtb/spec/ssm_mode.h"

namespace hybridtb::spec::ssm {
namespace {

enum class Kind : uint32_t { kWeight = 0, kPool = 1 };

// FNV-1a, 64 bit: a stable hash of the tensor name (std::hash is not stable across libraries).
uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

Tensor random_tensor(const TensorSpec& spec, const Shape& shape, uint64_t seed, Kind kind) {
  const uint64_t name_hash = fnv1a(spec.name);
  std::seed_seq seeds{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(kind),
                      static_cast<uint32_t>(name_hash), static_cast<uint32_t>(name_hash >> 32)};
  std::mt19937_64 rng(seeds);
  Tensor tensor = Tensor::host(spec.dtype, shape);
  if (spec.init_low < spec.init_high) {
    std::uniform_real_distribution<double> uniform(spec.init_low, spec.init_high);
    for (int64_t i = 0; i < tensor.numel(); ++i) store_from_double(tensor.data(), spec.dtype, i, uniform(rng));
  } else {
    std::normal_distribution<double> normal(0.0, spec.init_std);
    for (int64_t i = 0; i < tensor.numel(); ++i) store_from_double(tensor.data(), spec.dtype, i, normal(rng));
  }
  return tensor;
}

}  // namespace

std::map<std::string, Tensor> make_random_weights(const ModeSpec& mode, const ModeShape& shape, uint64_t seed) {
  std::map<std::string, Tensor> weights;
  for (const TensorSpec& spec : mode.weight_specs(shape)) {
    weights[spec.name] = random_tensor(spec, spec.shape, seed, Kind::kWeight);
  }
  return weights;
}

RandomSsmTensors make_random_ssm_tensors(const AttentionConfig& config, int64_t num_slots, uint64_t seed) {
  const ModeSpec& mode = ModeSpecRegistry::instance().find(config.ssm_mode);
  HYBRIDTB_CHECK(num_slots >= 1, "make_random_ssm_tensors: num_slots must be >= 1, got ", num_slots);
  const ModeShape shape = mode_shape(config);
  for (const std::string& name : mode.parameters()) shape.param(name);  // a missing parameter fails here, named
  RandomSsmTensors out;
  std::vector<TensorSpec> state_specs;
  if (config.is_linear_layer()) {
    // The core's weights only, with the values the mode would draw for them (one generator per name).
    const LinearLayerTensorSpecs specs = linear_layer_tensor_specs(config);
    for (const TensorSpec& spec : specs.weights) out.weights[spec.name] = random_tensor(spec, spec.shape, seed, Kind::kWeight);
    state_specs = specs.state;
  } else {
    out.weights = make_random_weights(mode, shape, seed);
    state_specs = mode.state_specs(shape);
  }
  for (const TensorSpec& spec : state_specs) {
    if (spec.transposed) {
      // Drawn in the mode's layout [slots, cols, rows], then stored transposed [slots, rows, cols]:
      // the same logical state as the untransposed layout for this seed.
      const int64_t rows = spec.shape.at(0), cols = spec.shape.at(1);
      const Tensor drawn = random_tensor(spec, {num_slots, cols, rows}, seed, Kind::kPool);
      Tensor stored = Tensor::host(spec.dtype, {num_slots, rows, cols});
      for (int64_t s = 0; s < num_slots; ++s) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const double value = load_as_double(drawn.data(), spec.dtype, (s * cols + c) * rows + r);
            store_from_double(stored.data(), spec.dtype, (s * rows + r) * cols + c, value);
          }
        }
      }
      out.ssm_state[spec.name] = std::move(stored);
      continue;
    }
    Shape pool{num_slots};
    pool.insert(pool.end(), spec.shape.begin(), spec.shape.end());
    out.ssm_state[spec.name] = random_tensor(spec, pool, seed, Kind::kPool);
  }
  return out;
}

}  // namespace hybridtb::spec::ssm
