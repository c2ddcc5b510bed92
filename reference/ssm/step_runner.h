// Private to reference/ssm: the batch-shaped half of an SSM step, shared by the parallel SSM branch
// (ssm_driver.cpp: a mode's advance over hidden-state rows) and the linear-attention layers
// (linear_layer.cpp: a mode's core over the layer's input rows). It plans every request with
// ssm_plan.h (token rows, the slot read, block-boundary and final writes), checks every slot before
// any state is touched, skips padding (skips_request: the engine rules' padding index) and requests
// without tokens, and runs each
// request: loads its state slots exactly into float64, calls the per-piece function, stores the
// boundary and final states rounded to each pool's dtype. What a piece computes is the caller's.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/metadata.h"
#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::reference::ssm {

// One state pool of the step: a view [num_slots, slot shape...] and the size of one slot.
struct Pool {
  std::string name;
  TensorView view;
  Eigen::Index slot_size = 0;
  // A transposed slot (TensorSpec::transposed): stored [rows, cols], worked on as [cols, rows].
  bool transposed = false;
  int64_t rows = 0;
  int64_t cols = 0;
};

// The pools of `specs` (one slot each) found in `ssm_state`; absent optional pools are left out.
// Throws Error naming /inputs/ssm/<name> for a pool not in host memory.
std::vector<Pool> collect_pools(const std::vector<TensorSpec>& specs, const std::map<std::string, TensorView>& ssm_state);

// The weights of `specs` found in `weights`, exactly in float64 (1-d [n] → [1, n]; k-d → [size(0), rest]).
Weights load_weights(const std::vector<TensorSpec>& specs, const std::map<std::string, TensorView>& weights);

// Rows [0, rows) of a token-major tensor [T, ...] as a [rows, product of the rest] float64 matrix.
Matrix load_token_rows(const TensorView& tokens, int64_t rows);
// Stores `rows` into rows [0, rows.rows()) of a token-major tensor, rounding to its dtype once.
void store_token_rows(const TensorView& tokens, const Matrix& rows);

// Advances the request's `state` over token rows [begin, end) of the step; `decode` for a decode
// token (one call per token), false for a prefill piece (the chunk, cut after block boundaries).
using AdvanceRows = std::function<void(State& state, int64_t begin, int64_t end, bool decode)>;

// Runs every request of the step (decodes first, then prefills) on `pools` with `advance`.
// `who` names the caller in errors ("ssm_mode mamba1", "layer_kind gdn"). Throws NotSupported for
// speculative decoding (a decode would advance several tokens and write a state per token), and
// Error, before any state is changed, for metadata that does not describe the batch, token rows
// outside [0, num_tokens) or a slot outside the pools.
void run_requests(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                  const std::vector<Pool>& pools, int64_t num_tokens, const std::string& who,
                  const AdvanceRows& advance);

}  // namespace hybridtb::reference::ssm
