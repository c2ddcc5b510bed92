// The SSM driver of the reference backend: runs config.ssm_mode over one varlen batch. It does
// everything batch-shaped so that a mode only advances one request over consecutive tokens
// (ssm_mode.h): it views query[:num_actual_tokens] as [T, H] hidden states, validates the step's
// tensors against the mode's specs, and hands the per-request work — splitting the tokens into
// decodes and prefill chunks with the Mamba metadata, picking each request's state slots
// (mamba_cache_mode none/align/all), loading and storing the pools, skipping padding, writing the
// block-boundary states of prefix caching — to the step runner (step_runner.h), which the
// linear-attention layers share; then checks the mode's output shape. Plain loops in float64; the
// rules are those of the vLLM semantics notes §3–§4, restated in reference/ssm/README.md. Checked by
// tests/ssm (every registered mode goes through the same suite).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "step_runner.h"

namespace hybridtb::reference::ssm {

void ssm_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                 const StepTensors& tensors, const TensorView& contribution, TensorParallelGroup* group) {
  const Mode& mode = ModeRegistry::instance().find(config.ssm_mode);
  validate_ssm_tensors(config, tensors.ssm_state, tensors.weights);
  const ModeShape shape = mode_shape(config);
  const TensorView& query = tensors.query;
  HYBRIDTB_CHECK(query.device() == Device::kHost && contribution.device() == Device::kHost,
                 "the reference SSM driver needs host tensors, got query ", query.describe(), " and contribution ",
                 contribution.describe());
  HYBRIDTB_CHECK(query.rank() == 3 && query.size(1) == config.num_heads && query.size(2) == config.head_size,
                 "/inputs/query must be [T, num_heads, head_size], got ", query.describe());
  HYBRIDTB_CHECK(contribution.shape() == query.shape() && is_floating(contribution.dtype()),
                 "the SSM contribution buffer ", contribution.describe(),
                 " must be a float tensor of the query's shape ", shape_to_string(query.shape()));
  const int64_t num_tokens = batch.num_actual_tokens;
  HYBRIDTB_CHECK(0 <= num_tokens && num_tokens <= query.size(0), "/batch/num_actual_tokens = ", num_tokens,
                 " does not fit the query's ", query.size(0), " rows");

  // A tensor-parallel rank reads every head's row and writes its own heads' columns.
  const bool rank_of_group = config.is_tensor_parallel_rank();
  if (rank_of_group) {
    const TensorView& hidden = tensors.ssm_hidden;
    HYBRIDTB_CHECK(!hidden.empty() && hidden.device() == Device::kHost && hidden.rank() == 2 &&
                       hidden.size(0) == query.size(0) && hidden.size(1) == shape.hidden_size,
                   hidden.empty() ? "missing /inputs/ssm_hidden" : "/inputs/ssm_hidden has the wrong shape",
                   " (a tensor-parallel rank's SSM input: [T, tp_size * num_heads * head_size] = [", query.size(0), ", ",
                   shape.hidden_size, "] on the host), got ", hidden.empty() ? std::string("nothing") : hidden.describe());
  }
  const Matrix hidden = load_token_rows(rank_of_group ? tensors.ssm_hidden : query, num_tokens);  // [tokens, H]
  Matrix out = Matrix::Zero(num_tokens, shape.hidden_size);

  if (!mode.forward_whole_step(metadata, hidden, out)) {
    TensorParallelGroup* sharded = rank_of_group ? &rank_group_of(config, group) : nullptr;
    const Weights weights = load_weights(mode.weight_specs(shape), tensors.weights);
    const std::vector<Pool> pools = collect_pools(mode.state_specs(shape), tensors.ssm_state);
    // One piece: mode.advance over its hidden rows, with the seed's shape check on what it returns.
    const AdvanceRows advance = [&](State& state, int64_t begin, int64_t end, bool decode) {
      const Matrix x = hidden.middleRows(begin, end - begin);
      Matrix y = Matrix::Zero(x.rows(), x.cols());
      if (sharded != nullptr) {
        mode.advance_rank(shape, *sharded, weights, state, x, y, decode);
      } else {
        mode.advance(shape, weights, state, x, y, decode);
      }
      HYBRIDTB_CHECK(y.rows() == x.rows() && y.cols() == x.cols(), "ssm_mode ", mode.name(),
                     " returned a contribution of shape [", y.rows(), ", ", y.cols(), "] for [", x.rows(), ", ",
                     x.cols(), "] hidden states");
      out.middleRows(begin, end - begin) = y;
    };
    run_requests(config, metadata, batch, pools, num_tokens, "ssm_mode " + mode.name(), advance);
    // The all-reduce after the output projection: the ranks' partial contributions summed.
    if (sharded != nullptr && num_tokens > 0) {
      sharded->all_reduce_sum(TensorView(out.data(), DType::kFloat64, {out.rows(), out.cols()}));
    }
  }

  HYBRIDTB_CHECK(out.rows() == num_tokens && out.cols() == shape.hidden_size, "ssm_mode ", mode.name(),
                 " returned a contribution of shape [", out.rows(), ", ", out.cols(), "] for [", num_tokens, ", ",
                 shape.hidden_size, "] hidden states");
  if (rank_of_group) {
    const int64_t row = config.num_heads * config.head_size;
    out = Matrix(out.middleCols(config.tp_rank * row, row));
  }
  store_token_rows(contribution, out);
}

}  // namespace hybridtb::reference::ssm
