// Test helpers for tests/attention (see attention_steps.h).
#include "attention_steps.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "hybridtb/reference/paged_attention.h"
#include "naive_attention.h"

namespace hybridtb::testing {

AttentionConfig attention_config(int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                                 DType dtype) {
  AttentionConfig config;
  config.num_heads = num_heads;
  config.num_kv_heads = num_kv_heads;
  config.head_size = head_size;
  config.block_size = block_size;
  config.scale = 1.0 / std::sqrt(static_cast<double>(head_size));
  config.dtype = dtype;
  return config;
}

BatchFile synthetic_step(const AttentionConfig& config, const std::vector<RequestSpec>& requests,
                         const SyntheticOptions& options) {
  return make_synthetic_batch(config, BuilderConfig{}, requests, options);
}

namespace {
Tensor clone_if_present(const Tensor& t) { return t.empty() ? Tensor() : clone_host(t); }
}  // namespace

BatchInputs clone_inputs(const BatchInputs& inputs) {
  BatchInputs copy = inputs;
  copy.query = clone_if_present(inputs.query);
  copy.key = clone_if_present(inputs.key);
  copy.value = clone_if_present(inputs.value);
  copy.kv_cache = clone_if_present(inputs.kv_cache);
  copy.k_scale_cache = clone_if_present(inputs.k_scale_cache);
  copy.v_scale_cache = clone_if_present(inputs.v_scale_cache);
  return copy;
}

Tensor run_reference_in_place(const AttentionConfig& config, const BatchDescription& batch, const BatchInputs& inputs,
                              DType output_dtype) {
  Tensor output = Tensor::host(output_dtype, {batch.num_tokens(), config.num_heads, config.head_size});
  fill_host(output, kSentinel);
  const StepTensors tensors = inputs.views();
  reference::write_kv_cache(config, batch, tensors);
  reference::paged_attention(config, batch, tensors, output);
  return output;
}

ReferenceRun run_reference(const BatchFile& step, DType output_dtype) {
  ReferenceRun run;
  run.inputs = clone_inputs(step.inputs);
  run.output = run_reference_in_place(step.config, step.batch, run.inputs, output_dtype);
  return run;
}

double element(const Tensor& tensor, int64_t t, int64_t h, int64_t c) {
  return load_as_double(tensor.data(), tensor.dtype(), tensor.view().offset({t, h, c}));
}

::testing::AssertionResult matches_naive(const BatchFile& step, const ReferenceRun& run) {
  const AttentionConfig& config = step.config;
  const StepTensors tensors = run.inputs.views();
  const NaiveLayer layer = naive_layer(config, tensors);
  int64_t failures = 0;
  std::ostringstream report;
  for (int64_t r = 0; r < step.batch.num_reqs(); ++r) {
    const NaiveRequest request = naive_request(config, step.batch, tensors, r);
    if (request.query_len == 0) continue;
    const std::vector<double> expected = naive_attention(layer, request);
    const Tolerance tolerance =
        tolerance_for(ToleranceCase::kAttentionFloat64, step.batch.seq_len(r) + 1, config.head_size);
    const int64_t start = step.batch.query_start_loc[r];
    for (int64_t i = 0; i < request.query_len; ++i) {
      for (int64_t h = 0; h < config.num_heads; ++h) {
        for (int64_t c = 0; c < config.head_size; ++c) {
          const double want = expected[static_cast<size_t>((i * config.num_heads + h) * config.head_size + c)];
          const double got = element(run.output, start + i, h, c);
          if (tolerance.allows(got, want)) continue;
          if (failures++ < 5) {
            report << "\n  request " << r << " row " << i << " head " << h << " dim " << c << ": reference " << got
                   << ", naive " << want << " (|diff| " << std::fabs(got - want) << ")";
          }
        }
      }
    }
    if (r == 0) report << "\n  tolerance (request 0): " << tolerance.rationale;
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failures << " elements differ from the naive formula" << report.str();
}

::testing::AssertionResult rows_close(const Tensor& a, int64_t a_row, const Tensor& b, int64_t b_row, int64_t rows,
                                      const Tolerance& tolerance) {
  int64_t failures = 0;
  std::ostringstream report;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t h = 0; h < a.size(1); ++h) {
      for (int64_t c = 0; c < a.size(2); ++c) {
        const double x = element(a, a_row + i, h, c);
        const double y = element(b, b_row + i, h, c);
        if (tolerance.allows(x, y)) continue;
        if (failures++ < 5) {
          report << "\n  row " << a_row + i << " vs " << b_row + i << " head " << h << " dim " << c << ": " << x
                 << " vs " << y;
        }
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failures << " elements differ beyond " << tolerance.rationale << report.str();
}

::testing::AssertionResult rows_bitwise_equal(const Tensor& a, int64_t a_row, const Tensor& b, int64_t b_row,
                                              int64_t rows) {
  if (a.dtype() != b.dtype()) return ::testing::AssertionFailure() << "dtypes differ";
  const int64_t row_bytes = a.size(1) * a.size(2) * element_size(a.dtype());
  for (int64_t i = 0; i < rows; ++i) {
    const auto* x = static_cast<const unsigned char*>(a.data()) + (a_row + i) * row_bytes;
    const auto* y = static_cast<const unsigned char*>(b.data()) + (b_row + i) * row_bytes;
    if (std::memcmp(x, y, static_cast<size_t>(row_bytes)) != 0) {
      return ::testing::AssertionFailure() << "row " << a_row + i << " differs bitwise from row " << b_row + i;
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult rows_untouched(const Tensor& output, int64_t row_begin) {
  Tensor sentinel = Tensor::host(output.dtype(), {1});
  fill_host(sentinel, kSentinel);
  const int64_t size = element_size(output.dtype());
  const int64_t first = row_begin * output.size(1) * output.size(2);
  for (int64_t i = first; i < output.numel(); ++i) {
    if (std::memcmp(static_cast<const unsigned char*>(output.data()) + i * size, sentinel.data(),
                    static_cast<size_t>(size)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << " (row " << i / (output.size(1) * output.size(2))
                                           << ") was written";
    }
  }
  return ::testing::AssertionSuccess();
}

namespace {
// Rows [begin, end) of a [T, ...] tensor, copied.
Tensor copy_rows(const Tensor& tensor, int64_t begin, int64_t end) {
  return clone_host(tensor.view().slice_rows(begin, end));
}
}  // namespace

BatchFile sub_step(const BatchFile& step, int64_t r, int64_t row_begin, int64_t row_end) {
  const BatchDescription& batch = step.batch;
  const int64_t start = batch.query_start_loc[r];
  const int64_t context_len = batch.context_len(r);
  BatchFile chunk;
  chunk.config = step.config;
  chunk.builder = step.builder;
  BatchDescription& b = chunk.batch;
  b.query_start_loc = IntArray::vector({0, static_cast<int32_t>(row_end - row_begin)});
  b.seq_lens = IntArray::vector({static_cast<int32_t>(context_len + row_end)});
  b.block_table = batch.block_table.rows(r, r + 1);
  b.slot_mapping.assign(batch.slot_mapping.begin() + start + row_begin, batch.slot_mapping.begin() + start + row_end);
  b.num_actual_tokens = row_end - row_begin;
  if (batch.mm_prefix_range) {
    const IntArray& mm = *batch.mm_prefix_range;
    const auto width = static_cast<size_t>(mm.size(1) * 2);
    std::vector<int32_t> values(mm.values.begin() + static_cast<std::ptrdiff_t>(r * width),
                                mm.values.begin() + static_cast<std::ptrdiff_t>((r + 1) * width));
    b.mm_prefix_range = IntArray({1, mm.size(1), 2}, values);
  }
  chunk.inputs = clone_inputs(step.inputs);
  chunk.inputs.query = copy_rows(step.inputs.query, start + row_begin, start + row_end);
  chunk.inputs.key = copy_rows(step.inputs.key, start + row_begin, start + row_end);
  chunk.inputs.value = copy_rows(step.inputs.value, start + row_begin, start + row_end);
  return chunk;
}

BatchFile remap_blocks(const BatchFile& step, const std::vector<int32_t>& permutation) {
  BatchFile moved = step;
  moved.inputs = clone_inputs(step.inputs);
  const int64_t block_size = step.config.block_size;
  for (int32_t& block : moved.batch.block_table.values) block = permutation[static_cast<size_t>(block)];
  for (int64_t& slot : moved.batch.slot_mapping) {
    if (slot >= 0) slot = permutation[static_cast<size_t>(slot / block_size)] * block_size + slot % block_size;
  }
  auto move_blocks = [&](const Tensor& from, const Tensor& to) {
    if (from.empty()) return;
    const int64_t block_bytes = from.nbytes() / from.size(0);
    for (int64_t b = 0; b < from.size(0); ++b) {
      std::memcpy(static_cast<unsigned char*>(to.data()) + permutation[static_cast<size_t>(b)] * block_bytes,
                  static_cast<const unsigned char*>(from.data()) + b * block_bytes, static_cast<size_t>(block_bytes));
    }
  };
  move_blocks(step.inputs.kv_cache, moved.inputs.kv_cache);
  move_blocks(step.inputs.k_scale_cache, moved.inputs.k_scale_cache);
  move_blocks(step.inputs.v_scale_cache, moved.inputs.v_scale_cache);
  return moved;
}

BatchFile manual_step(const AttentionConfig& config, int64_t context_len, int64_t query_len) {
  BatchFile step;
  step.config = config;
  step.config.dtype = DType::kFloat32;
  const int64_t seq_len = context_len + query_len;
  const int64_t blocks = (seq_len + config.block_size - 1) / config.block_size;
  BatchDescription& b = step.batch;
  b.query_start_loc = IntArray::vector({0, static_cast<int32_t>(query_len)});
  b.seq_lens = IntArray::vector({static_cast<int32_t>(seq_len)});
  b.block_table = IntArray::matrix(1, blocks);
  for (int64_t i = 0; i < blocks; ++i) b.block_table.at(0, i) = static_cast<int32_t>(i + 1);
  for (int64_t i = 0; i < query_len; ++i) {
    const int64_t position = context_len + i;
    b.slot_mapping.push_back((position / config.block_size + 1) * config.block_size + position % config.block_size);
  }
  b.num_actual_tokens = query_len;
  BatchInputs& in = step.inputs;
  const int64_t hq = config.num_heads, hkv = config.num_kv_heads, d = config.head_size;
  in.query = Tensor::host(DType::kFloat32, {query_len, hq, d});
  in.key = Tensor::host(DType::kFloat32, {query_len, hkv, d});
  in.value = Tensor::host(DType::kFloat32, {query_len, hkv, d});
  in.kv_cache = Tensor::host(kv_storage_dtype(config.kv_cache_dtype, DType::kFloat32),
                             {blocks + 1, 2, config.block_size, hkv, d});
  return step;
}

void set_row(const Tensor& tensor, int64_t t, int64_t h, const std::vector<double>& values) {
  for (size_t c = 0; c < values.size(); ++c) {
    store_from_double(tensor.data(), tensor.dtype(), tensor.view().offset({t, h, static_cast<int64_t>(c)}), values[c]);
  }
}

void set_cache_row(const BatchFile& step, int half, int64_t position, int64_t kv_head,
                   const std::vector<double>& values) {
  const TensorView& cache = step.inputs.kv_cache.view();
  const int64_t block = step.batch.block_table.at(0, position / step.config.block_size);
  for (size_t c = 0; c < values.size(); ++c) {
    const int64_t offset =
        cache.offset({block, half, position % step.config.block_size, kv_head, static_cast<int64_t>(c)});
    store_from_double(cache.data(), cache.dtype(), offset, values[c]);
  }
}

}  // namespace hybridtb::testing
