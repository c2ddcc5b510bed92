// SSM modes of the reference backend: the float64 math of one mode, the registry that finds that
// math by name, and the driver that runs a mode over a whole varlen batch. What a mode *is* — its
// parameters, defaults and tensor specs — is its descriptor in hybridtb/spec/ssm_mode.h; a
// reference mode is registered against the descriptor of the same name.
//
// A mode only does the math of ONE request: it advances that request's state over consecutive
// tokens and returns the contribution of each token. Everything batch-shaped — which tokens are
// decodes or prefill chunks, which pool slot holds a request's state (mamba_cache_mode none/all/
// align), whether a prefill starts from its saved state, padding (slot < 0), writing states at
// block boundaries for prefix caching — lives in the driver (reference/ssm/ssm_driver.cpp), so a
// new mode is one descriptor file plus one file of math, each with one registration line (see
// reference/ssm/README.md).
#pragma once

#include <Eigen/Core>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/engine_rules.h"
#include "hybridtb/metadata.h"
#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/tensor.h"
#include "hybridtb/tensor_parallel_group.h"

namespace hybridtb::reference::ssm {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The descriptor side, shared with the CUDA backend and the tools (hybridtb/spec/ssm_mode.h).
using spec::ssm::check_step_tensors;
using spec::ssm::conv_state_spec;
using spec::ssm::make_random_ssm_tensors;
using spec::ssm::mode_shape;
using spec::ssm::ModeShape;
using spec::ssm::ModeSpec;
using spec::ssm::RandomSsmTensors;
using spec::ssm::TensorSpec;
using spec::ssm::validate_ssm_tensors;

// Float64 working copies, by name. Weights keep their shape flattened to 2-d ([rows, cols];
// 1-d weights are [1, n]); a request's state holds one slot of each pool, flattened row-major.
using Weights = std::map<std::string, Matrix>;
using State = std::map<std::string, Eigen::VectorXd>;

class Mode {
 public:
  virtual ~Mode() = default;
  virtual std::string name() const = 0;
  // The descriptor registered under name() (ModeSpecRegistry), and its answers.
  const ModeSpec& spec() const;
  std::string description() const { return spec().description(); }
  std::vector<std::string> parameters() const { return spec().parameters(); }
  std::map<std::string, int64_t> default_parameters(const ModeShape& shape) const {
    return spec().default_parameters(shape);
  }
  std::vector<TensorSpec> state_specs(const ModeShape& shape) const { return spec().state_specs(shape); }
  std::vector<TensorSpec> weight_specs(const ModeShape& shape) const { return spec().weight_specs(shape); }

  // Advances one request over consecutive tokens. `x` is [L, H]: the tokens' hidden states;
  // `y` is resized by the caller to [L, H] and receives their contributions. `state` holds the
  // request's state before the first token (all zeros when the request has no initial state)
  // and must hold the state after the last token on return. `decode` is true when the call is one
  // decode token (modes may use a dedicated single-step update; it must agree with the scan).
  virtual void advance(const Weights& weights, State& state, const Matrix& x, Matrix& y, bool decode) const = 0;
  // What the driver calls: advance with the layer's shape at hand, for modes that read a setting of
  // the config at run time (gdn and mamba2: the gated norm's eps). The default ignores the shape.
  virtual void advance(const ModeShape& /*shape*/, const Weights& weights, State& state, const Matrix& x, Matrix& y,
                       bool decode) const {
    advance(weights, state, x, y, decode);
  }

  // A rank of a tensor-parallel group (config.tp_size > 1: the rank's shard of the layer, as
  // hybridtb/spec/tensor_parallel.h cuts it; `shape` is the rank's, with the full hidden size).
  // A mode that shards overrides this: it advances the request with the rank's weights and state,
  // meets the other ranks at its all-reduce points through `group`, and returns in `y` the rank's
  // partial contribution [L, H], which the driver sums over the ranks once the step is done (the
  // all-reduce after the output projection). The default refuses: the mode has no sharded form.
  virtual void advance_rank(const ModeShape& shape, TensorParallelGroup& group, const Weights& weights, State& state,
                            const Matrix& x, Matrix& y, bool decode) const;

  // Modes whose rule is not per request (prefix_sum_flat) override this and return true after
  // writing the whole step themselves. `hidden` is [num_actual_tokens, H]; `contribution` is
  // [num_actual_tokens, H], zero-filled on entry. On a tensor-parallel rank such a mode computes the
  // whole contribution from the replicated hidden rows on every rank (no all-reduce).
  virtual bool forward_whole_step(const MambaAttentionMetadata& /*metadata*/, const Matrix& /*hidden*/,
                                  Matrix& /*contribution*/) const {
    return false;
  }
};

// Modes by name. Registration is explicit, one line per mode, in reference/ssm/modes.cpp.
class ModeRegistry {
 public:
  static ModeRegistry& instance();  // filled with the built-in modes on first use
  // Throws Error on a duplicate name, or a name without a descriptor in ModeSpecRegistry.
  void add(std::unique_ptr<Mode> mode);
  // Throws Error listing the known modes if `name` is unknown.
  const Mode& find(const std::string& name) const;
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::unique_ptr<Mode>> modes_;
};

// Called once by ModeRegistry::instance(); defined in reference/ssm/modes.cpp.
void register_builtin_modes(ModeRegistry& registry);

// Runs config.ssm_mode over the batch (host tensors): writes rows [0, num_actual_tokens) of
// `contribution` ([T, Hq, D], any float dtype) and updates tensors.ssm_state in place.
// A tensor-parallel rank (config.tp_size > 1) reads tensors.ssm_hidden, the whole hidden rows, and
// writes its heads' columns of the contribution; a per-request mode then needs `group` (the rank's
// handle of its group; Error naming the rank without it).
void ssm_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                 const StepTensors& tensors, const TensorView& contribution, TensorParallelGroup* group = nullptr);

// The weights alone, for a mode and a shape (spec::ssm::make_random_weights of its descriptor).
std::map<std::string, Tensor> make_random_weights(const Mode& mode, const ModeShape& shape, uint64_t seed);

}  // namespace hybridtb::reference::ssm
