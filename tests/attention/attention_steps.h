// Test helpers for tests/attention: building steps (synthetic, hand-made, sliced and remapped
// ones), running the reference KV write + attention on copies, and comparing outputs row by row
// with tolerances from the one table (hybridtb/tolerance.h).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "hybridtb/batch_file.h"
#include "hybridtb/synthetic.h"
#include "hybridtb/tolerance.h"

namespace hybridtb::testing {

// Written into every output element before a run; rows the reference must not touch keep it.
inline constexpr double kSentinel = -12345.0;

// A config with scale 1/sqrt(D) and every optional feature off.
AttentionConfig attention_config(int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                                 DType dtype = DType::kBFloat16);

BatchFile synthetic_step(const AttentionConfig& config, const std::vector<RequestSpec>& requests,
                         const SyntheticOptions& options = {});

// Deep copy of every tensor of a step (Tensor copies share buffers).
BatchInputs clone_inputs(const BatchInputs& inputs);

// KV write then attention, both in place on `inputs` (its cache buffers are updated). The output
// [T, Hq, D] of `output_dtype` starts filled with kSentinel.
Tensor run_reference_in_place(const AttentionConfig& config, const BatchDescription& batch, const BatchInputs& inputs,
                              DType output_dtype = DType::kFloat64);

struct ReferenceRun {
  Tensor output;       // [T, Hq, D]
  BatchInputs inputs;  // copies of the step's inputs, cache after the KV write
};
// As above on copies: the step itself is left unchanged.
ReferenceRun run_reference(const BatchFile& step, DType output_dtype = DType::kFloat64);

// Rows [0, num_actual_tokens) of `run.output` against the naive formula evaluated on the cache
// after the write; tolerance kAttentionFloat64 with n = seq_len + 1 (keys and a sink), D = head size.
::testing::AssertionResult matches_naive(const BatchFile& step, const ReferenceRun& run);

// Rows [a_row, a_row + rows) of `a` against rows [b_row, b_row + rows) of `b` (both [T, Hq, D]).
::testing::AssertionResult rows_close(const Tensor& a, int64_t a_row, const Tensor& b, int64_t b_row, int64_t rows,
                                      const Tolerance& tolerance);
::testing::AssertionResult rows_bitwise_equal(const Tensor& a, int64_t a_row, const Tensor& b, int64_t b_row,
                                              int64_t rows);
// Every element of rows [row_begin, T) still holds kSentinel, bit for bit.
::testing::AssertionResult rows_untouched(const Tensor& output, int64_t row_begin);

// Request r alone, rows [row_begin, row_end) of its query: a chunk with context_len + row_begin
// tokens already cached and seq_len context_len + row_end. Tensors are copies; same cache layout.
BatchFile sub_step(const BatchFile& step, int64_t r, int64_t row_begin, int64_t row_end);

// The step with physical block b moved to permutation[b] (block table, slot mapping and cache).
BatchFile remap_blocks(const BatchFile& step, const std::vector<int32_t>& permutation);

// A hand-made single-request decoder step: float32, all-zero tensors, blocks 1, 2, … in order,
// slot mapping for the query rows. Fill it with set_row / set_cache_row.
BatchFile manual_step(const AttentionConfig& config, int64_t context_len, int64_t query_len);
// Row `t`, head `h` of a [T, H, D] tensor ← values (the rest of the row stays as it is).
void set_row(const Tensor& tensor, int64_t t, int64_t h, const std::vector<double>& values);
// The cached key (half 0) or value (half 1) at absolute position `position` of request 0.
void set_cache_row(const BatchFile& step, int half, int64_t position, int64_t kv_head, const std::vector<double>& values);
// Element (t, h, c) of a [T, H, D] tensor as double.
double element(const Tensor& tensor, int64_t t, int64_t h, int64_t c);

}  // namespace hybridtb::testing
