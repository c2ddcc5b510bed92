// Helpers for the per-layer tests (tests/per_layer): the small layers of one per-layer model (an
// attention layer and its gdn / mamba2 linear layers, sharing their attention attributes), layer
// files of one step, single-request steps cut from a longer input, and the linear cores called
// directly — the test's own path to the expected results, independent of the step runner.
// Run: ctest --test-dir <build> -L per_layer
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/batch_file.h"
#include "hybridtb/config.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/synthetic.h"
#include "hybridtb/tolerance.h"

namespace hybridtb::testing {

using reference::ssm::Matrix;
using NamedTensors = std::map<std::string, Tensor>;

// The model's full-attention layer: 4 query heads × 32, 2 KV heads, blocks of 16, float32, no
// window, no SSM branch; mamba_cache_mode as given (the step's Mamba metadata follows it).
AttentionConfig attention_layer(MambaCacheMode cache_mode = MambaCacheMode::kNone, int64_t mamba_block_size = 0);
// Its linear layer of `kind`, with the same attention attributes and cache settings:
//   gdn     Hk 2, Hv 4, dk 16, dv 8 (dk ≠ dv: a transposed state would not even fit), conv 4
//   mamba2  Hs 4, P 8, N 8, G 2, conv 4
AttentionConfig linear_layer(LayerKind kind, MambaCacheMode cache_mode = MambaCacheMode::kNone,
                             int64_t mamba_block_size = 0);
std::string kind_name(LayerKind kind);

// One layer's file of a step: make_synthetic_batch with a dedicated SSM block table, and for a
// layer that keeps state (a linear layer) random pools and weights drawn from `tensor_seed`. The
// same requests and options give every layer of the model the same batch.
BatchFile layer_file(const AttentionConfig& config, const std::vector<RequestSpec>& requests,
                     SyntheticOptions options, uint64_t tensor_seed = 11);
// The same with the builder's settings (e.g. CUDA-graph padding) and pools of `num_slots` slots (0: as
// many as the batch names; more let batches of one model share the pools).
BatchFile layer_file(const AttentionConfig& config, const BuilderConfig& builder, const std::vector<RequestSpec>& requests,
                     SyntheticOptions options, int64_t num_slots, uint64_t tensor_seed);

// A step of ONE request of a linear layer: context `context_len`, the given input rows (each
// [query_len, width], exact in config.dtype), state slot `slot` of `pools` (the state before the
// step), the layer's `weights`. Its batch is otherwise synthetic.
BatchFile request_step(const AttentionConfig& config, int64_t context_len, const std::map<std::string, Matrix>& rows,
                       int32_t slot, const NamedTensors& pools, const NamedTensors& weights);

// Rows [begin, end) of a token-major [T, width] tensor as float64.
Matrix rows_of(const Tensor& tokens, int64_t begin, int64_t end);
// Rows [begin, end) of every linear input of `file`.
std::map<std::string, Matrix> input_rows(const BatchFile& file, int64_t begin, int64_t end);

// The core of `config`'s kind, called directly (gdn_core / mamba2_core) on `rows`; `state` in place.
Matrix run_core(const AttentionConfig& config, const reference::ssm::Weights& weights, reference::ssm::State& state,
                const std::map<std::string, Matrix>& rows, bool decode);

// One slot of every pool as a mode State (exact doubles); storing rounds to each pool's dtype.
reference::ssm::State load_slot(const NamedTensors& pools, int64_t slot);
void store_slot(NamedTensors& pools, int64_t slot, const reference::ssm::State& state);
NamedTensors clone_all(const NamedTensors& tensors);

// run_step on a plain reference backend created for the file's own config.
StepOutputs run_on_reference(const BatchFile& file);

// kSsmModeFloat64 for `tokens` steps of `config`'s linear layer (m: the largest dimension of its
// inputs, pools and weights).
Tolerance linear_tolerance(const AttentionConfig& config, int64_t tokens);

}  // namespace hybridtb::testing
