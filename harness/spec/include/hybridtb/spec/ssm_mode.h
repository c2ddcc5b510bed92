// SSM mode descriptors: what a mode is, independently of how a backend computes it — its name, its
// integer parameters and their defaults, the tensors it needs (weights, one slot of each state
// pool) with their shapes and random initialisation — the registry that finds descriptors by name,
// and the checks of a step's SSM tensors against them. Both backends register their math against
// these descriptors by name (the reference's float64 modes: reference/ssm/; the CUDA backend's GPU
// modes: optimized/src/ssm/), and `hybridtb gen`, `info` and `backends` read them here.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/config.h"
#include "hybridtb/engine_rules.h"
#include "hybridtb/tensor.h"

namespace hybridtb::spec::ssm {

// The sizes a mode's tensors depend on.
struct ModeShape {
  int64_t hidden_size = 0;               // H = num_heads · head_size (the query row, viewed flat); a
                                         // tensor-parallel rank's: tp_size · num_heads · head_size
  std::map<std::string, int64_t> params;  // /config/ssm attributes (AttentionConfig::ssm_params)
  int64_t num_heads = 0;                  // Hq and D of the query, for modes whose state keeps the
  int64_t head_size = 0;                  // head structure (prefix_sum: [num_heads, head_size])
  // How conv-state pools are stored (the engine rules of /config engine_version; DS without one).
  ConvStateLayout conv_state_layout = ConvStateLayout::kDS;
  // The gated norm's eps of gdn / mamba2 (gated_norm_eps: /config norm_eps or the family default).
  double gdn_norm_eps = 1e-6;
  double mamba2_norm_eps = 1e-5;
  // Falcon-H1's mamba_rms_norm (/config mamba_rms_norm): false makes mamba2's gated norm a plain
  // gate y·silu(z) without normalisation, and the mode has no norm_weight (vLLM registers none).
  bool mamba2_rms_norm = true;
  // The named parameter; throws Error naming "/config/ssm <name>" if absent or not positive.
  int64_t param(const std::string& name) const;
};
// The shape of config's layer: H = config.ssm_hidden_size(), its ssm_params, Hq and D.
ModeShape mode_shape(const AttentionConfig& config);

// One named tensor of a mode: a weight (shape = the whole tensor) or one slot of a state pool
// (the pool in the file is [num_slots, shape...]).
struct TensorSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;  // what generators write; readers accept any floating dtype
  bool optional = false;
  std::string meaning;            // one line for docs and error messages, e.g. "x rows first, then z rows"
  // How generators draw random values: uniform in [init_low, init_high) when init_low < init_high,
  // otherwise normal(0, init_std). Chosen per tensor so random models stay numerically sane
  // (e.g. mamba1's A_log, dt bias and projection scales).
  double init_std = 1.0;
  double init_low = 0.0;
  double init_high = 0.0;
  // A 2-d slot stored as the transpose of the layout the mode works in: the conv state in the "SD"
  // layout ([K−1, channels] in the file, [channels, K−1] in the mode's state). The drivers transpose
  // on load and store; generators draw the mode's layout and transpose, so both layouts hold the
  // same logical values for one seed.
  bool transposed = false;
};

// The conv-state slot spec of a mode with `channels` conv channels and `past` = K−1 kept inputs, in
// the shape's conv_state_layout: [channels, past] (DS), or [past, channels] with transposed (SD).
TensorSpec conv_state_spec(const ModeShape& shape, int64_t channels, int64_t past, std::string meaning);

// The descriptor of one SSM mode.
class ModeSpec {
 public:
  virtual ~ModeSpec() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  // Names of the integer hyper-parameters read from /config/ssm.
  virtual std::vector<std::string> parameters() const { return {}; }
  // Conventional values of those parameters (the model family's defaults) for a layer of this
  // shape, given the parameters already set (`shape.params`); `hybridtb gen` fills in the ones a
  // preset or --set did not give.
  virtual std::map<std::string, int64_t> default_parameters(const ModeShape& /*shape*/) const { return {}; }
  // One slot of each state pool (empty for a stateless mode).
  virtual std::vector<TensorSpec> state_specs(const ModeShape& shape) const = 0;
  virtual std::vector<TensorSpec> weight_specs(const ModeShape& shape) const = 0;
};

// Descriptors by name. The built-in ones are registered in harness/spec/src/ssm_modes/modes.cpp,
// one line each.
class ModeSpecRegistry {
 public:
  static ModeSpecRegistry& instance();  // filled with the built-in descriptors on first use
  void add(std::unique_ptr<ModeSpec> mode);  // throws Error on a duplicate name or "none"
  // Throws Error listing the known modes if `name` is unknown.
  const ModeSpec& find(const std::string& name) const;
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::unique_ptr<ModeSpec>> modes_;
};

// Called once by ModeSpecRegistry::instance(); defined in harness/spec/src/ssm_modes/modes.cpp.
void register_builtin_mode_specs(ModeSpecRegistry& registry);

// Checks a step's state pools and weights against specs, and /config/ssm against `parameters`
// (each present and positive, no unknown one): every required weight and pool present with its
// spec's shape (pools: [num_slots, slot shape...], one num_slots for all), floating dtypes, no
// unknown name. `by` names the owner in errors ("ssm_mode mamba1", "layer_kind gdn").
void check_step_tensors(const ModeShape& shape, const std::vector<std::string>& parameters,
                        const std::vector<TensorSpec>& weight_specs, const std::vector<TensorSpec>& state_specs,
                        const std::map<std::string, TensorView>& ssm_state,
                        const std::map<std::string, TensorView>& weights, const std::string& by);

// Checks the SSM tensors of a step against the mode's specs: every required weight and pool
// present with the right shape (pools: [num_slots, slot shape...], the same num_slots for all)
// and a floating dtype; every parameter present. Throws Error naming the item, e.g.
// "missing weight /weights/x_proj (required by ssm_mode mamba1: [dt_rank + 2·state_size, intermediate_size])".
void validate_ssm_tensors(const AttentionConfig& config, const std::map<std::string, TensorView>& ssm_state,
                          const std::map<std::string, TensorView>& weights);

// Seeded random weights and state pools for a mode, drawn as each TensorSpec says (used by tests
// and the batch generator). Pools are [num_slots, ...]; optional weights are included. For a
// linear-attention layer (config.layer_kind gdn/mamba2): the pools and the core's weights of
// linear_layer_specs.h, with the values the mode draws for those names.
struct RandomSsmTensors {
  std::map<std::string, Tensor> ssm_state;
  std::map<std::string, Tensor> weights;
};
RandomSsmTensors make_random_ssm_tensors(const AttentionConfig& config, int64_t num_slots, uint64_t seed);
// The weights alone, for a mode and a shape (tests of one mode that have no AttentionConfig); the
// same values make_random_ssm_tensors draws for that shape and seed.
std::map<std::string, Tensor> make_random_weights(const ModeSpec& mode, const ModeShape& shape, uint64_t seed);

}  // namespace hybridtb::spec::ssm
