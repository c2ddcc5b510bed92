// The cases of tests/cuda (see cuda_cases.h).
#include "cuda_cases.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::testing {

AttentionConfig make_config(const CudaCase& c) {
  AttentionConfig config;
  config.num_heads = c.num_heads;
  config.num_kv_heads = c.num_kv_heads;
  config.head_size = c.head_size;
  config.block_size = c.block_size;
  config.scale = 1.0 / std::sqrt(static_cast<double>(c.head_size));
  config.dtype = c.dtype;
  config.kv_cache_dtype = c.kv;
  config.sliding_window = c.window;
  config.logits_soft_cap = c.soft_cap;
  config.attn_type = c.encoder ? AttnType::kEncoderOnly : AttnType::kDecoder;
  if (c.alibi != Alibi::kNone) {
    std::vector<float> slopes;
    for (int64_t h = 0; h < c.num_heads; ++h) {
      slopes.push_back(std::pow(2.0f, -8.0f * static_cast<float>(h + 1) / static_cast<float>(c.num_heads)));
    }
    config.alibi_slopes = slopes;
    config.use_alibi_sqrt = c.alibi == Alibi::kSqrt;
  }
  if (c.sinks) {
    std::vector<float> sinks;
    for (int64_t h = 0; h < c.num_heads; ++h) {
      sinks.push_back(-1.0f + c.sink_step * static_cast<float>(h % c.sink_period));
    }
    config.sinks = sinks;
  }
  config.engine_version = c.engine_version;
  config.ssm_mode = c.ssm_mode;
  if (config.has_ssm_branch()) {
    config.mamba_cache_mode = c.cache;
    config.mamba_block_size = c.cache == MambaCacheMode::kNone ? 0 : 16;
    if (c.ssm_params.empty()) {
      const reference::ssm::Mode& mode = reference::ssm::ModeRegistry::instance().find(c.ssm_mode);
      for (const std::string& p : mode.parameters()) config.ssm_params[p] = 4;
    } else {
      config.ssm_params = c.ssm_params;
    }
  }
  return config;
}

BuilderConfig make_builder(const CudaCase& c) {
  BuilderConfig builder;
  if (c.decode_graph) {
    builder.cudagraph_mode = CudaGraphMode::kFullDecodeOnly;
    builder.cudagraph_capture_sizes = {1, 2, 4, 8};
  }
  return builder;
}

BatchFile make_step(const CudaCase& c, int64_t num_slots) {
  SyntheticOptions options;
  options.seed = c.seed;
  options.spare_blocks = c.spare_blocks;
  options.padding_tokens = c.padding_tokens;
  options.padding_requests = c.padding_requests;
  options.k_scale = c.k_scale;
  options.v_scale = c.v_scale;
  options.output_scale = c.output_scale;
  options.ssm_block_table = c.ssm_block_table;
  options.compact = c.compact;
  options.shared_prefix_tokens = c.shared_prefix_tokens;
  options.alias_blocks = c.alias_blocks;
  BatchFile file = make_synthetic_batch(make_config(c), make_builder(c), c.requests, options);
  if (file.config.has_ssm_branch()) {
    if (num_slots == 0) num_slots = ssm_slots_needed(file.batch) + 2;
    const uint64_t tensor_seed = c.tensor_seed.value_or(c.seed + 100);
    auto tensors = reference::ssm::make_random_ssm_tensors(file.config, num_slots, tensor_seed);
    std::map<std::string, Tensor> pools;
    for (const auto& [name, pool] : tensors.ssm_state) pools.emplace(name, convert_host(pool, c.pool_dtype));
    file.inputs.ssm_state = std::move(pools);
    file.inputs.weights = std::move(tensors.weights);
  }
  return file;
}

void scale_query_heads_beyond_float16(BatchFile& step) {
  Tensor& q = step.inputs.query;  // [tokens][heads][head size]
  const int64_t tokens = q.shape()[0];
  const int64_t heads = q.shape()[1];
  const int64_t d = q.shape()[2];
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const double factor = h % 4 == 0 ? 0x1p17 : (h % 4 == 1 ? 0x1p-40 : 1.0);
      for (int64_t i = 0; i < d; ++i) {
        const int64_t at = (t * heads + h) * d + i;
        store_from_double(q.data(), q.dtype(), at, load_as_double(q.data(), q.dtype(), at) * factor);
      }
    }
  }
}

void PrintTo(const CudaCase& c, std::ostream* out) { *out << c.name; }

}  // namespace hybridtb::testing
