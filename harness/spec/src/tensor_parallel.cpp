// Tensor parallelism of a paged-attention layer by vLLM's rules (tensor_parallel.h).
#include "hybridtb/spec/tensor_parallel.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/spec/metadata_builders.h"
#include "hybridtb/spec/ssm_mode.h"

namespace hybridtb::spec {
namespace {

constexpr const char* kPrefix = "tensor parallel: ";

// Heads [begin, end) of axis `axis` of a host tensor, as a strided view of the same memory.
TensorView head_view(const TensorView& tensor, int axis, int64_t begin, int64_t end) {
  Shape shape = tensor.shape();
  shape[static_cast<size_t>(axis)] = end - begin;
  auto* data = static_cast<unsigned char*>(tensor.data()) + begin * tensor.stride(axis) * element_size(tensor.dtype());
  return TensorView(data, tensor.dtype(), shape, tensor.strides(), tensor.device());
}

// A contiguous copy of heads [begin, end) of `tensor`'s axis `axis` (empty stays empty). `name` and
// `heads` (the unsharded count) check the axis first.
Tensor cut_heads(const TensorView& tensor, const char* name, int axis, int64_t heads, int64_t begin, int64_t end) {
  if (tensor.empty()) return {};
  HYBRIDTB_CHECK(tensor.device() == Device::kHost, kPrefix, name, " must be a host tensor, got ", tensor.describe());
  HYBRIDTB_CHECK(tensor.rank() > axis && tensor.size(axis) == heads, kPrefix, name, " must have ", heads,
                 " heads in dimension ", axis, ", got ", tensor.describe());
  return clone_host(head_view(tensor, axis, begin, end));
}

// Rejects what this does not shard: rank files, linear layers and SSM branches other than mamba1.
void check_shardable(const AttentionConfig& config) {
  HYBRIDTB_CHECK(!config.is_tensor_parallel_rank(), kPrefix, "the layer is already rank ", config.tp_rank, " of ",
                 config.tp_size, " (/config tp_size); shard the unsharded layer");
  if (config.is_linear_layer()) {
    throw NotSupported(detail::concat(kPrefix, "the linear-attention layer (layer_kind '", to_string(config.layer_kind),
                                      "') is not sharded yet"));
  }
  if (config.has_ssm_branch() && config.ssm_mode != "zero" && config.ssm_mode != "mamba1") {
    throw NotSupported(detail::concat(kPrefix, "the SSM branch '", config.ssm_mode,
                                      "' is not sharded (sharded branches: mamba1, zero)"));
  }
}

// A contiguous copy of [begin, end) of `tensor`'s axis `axis` (any axis; head_view is axis-agnostic).
Tensor cut_axis(const TensorView& tensor, int axis, int64_t begin, int64_t end) {
  return clone_host(head_view(tensor, axis, begin, end));
}

// `a` and `b` (same dtype, same trailing shape) one after the other along axis 0.
Tensor concat_rows(const Tensor& a, const Tensor& b) {
  Shape shape = a.shape();
  shape[0] += b.size(0);
  Tensor joined = Tensor::host(a.dtype(), shape);
  auto* dst = static_cast<unsigned char*>(joined.data());
  std::memcpy(dst, a.data(), static_cast<size_t>(a.nbytes()));
  std::memcpy(dst + a.nbytes(), b.data(), static_cast<size_t>(b.nbytes()));
  return joined;
}

// The mamba1 channels a rank owns: [begin, end) of intermediate_size, vLLM's
// MergedColumnParallelLinear / ColumnParallelLinear split (intermediate_size % tp_size == 0).
struct ChannelRange {
  int64_t intermediate = 0;  // unsharded I
  int64_t begin = 0;
  int64_t end = 0;
};

ChannelRange mamba1_channels(const AttentionConfig& config, const TpShard& shard) {
  const auto it = config.ssm_params.find("intermediate_size");
  HYBRIDTB_CHECK(it != config.ssm_params.end(), kPrefix, "ssm_mode mamba1 needs /config/ssm intermediate_size");
  const int64_t I = it->second;
  HYBRIDTB_CHECK(I % shard.tp_size == 0, kPrefix, "/config/ssm intermediate_size ", I, " is not divisible by tp_size ",
                 shard.tp_size, " (mamba1's channels split evenly over the ranks)");
  const int64_t per_rank = I / shard.tp_size;
  return {I, shard.tp_rank * per_rank, (shard.tp_rank + 1) * per_rank};
}

// The axis of a mamba1 pool [num_slots, slot...] that runs over the channels: ssm_state [I, N];
// conv_state [I, K−1] (DS) or [K−1, I] (SD, the spec's transposed slot).
int mamba1_pool_channel_axis(const AttentionConfig& config, const std::string& name) {
  for (const ssm::TensorSpec& spec : ssm::ModeSpecRegistry::instance().find("mamba1").state_specs(ssm::mode_shape(config))) {
    if (spec.name == name) return spec.transposed ? 2 : 1;
  }
  throw Error(detail::concat(kPrefix, "ssm_mode mamba1 has no state pool '", name, "'"));
}

// Rank `shard`'s mamba1 pools: the channels it owns.
std::map<std::string, Tensor> cut_mamba1_pools(const AttentionConfig& config, const ChannelRange& channels,
                                               const std::map<std::string, Tensor>& pools) {
  std::map<std::string, Tensor> cut;
  for (const auto& [name, pool] : pools) {
    const int axis = mamba1_pool_channel_axis(config, name);
    HYBRIDTB_CHECK(pool.view().rank() > axis && pool.size(axis) == channels.intermediate, kPrefix, "state pool ", name,
                   " must have intermediate_size ", channels.intermediate, " channels in dimension ", axis, ", got ",
                   pool.view().describe());
    cut[name] = cut_axis(pool, axis, channels.begin, channels.end);
  }
  return cut;
}

// Rank `shard`'s mamba1 weights by vLLM's MambaMixer: in_proj (MergedColumnParallelLinear, the x
// rows and the z rows of its channels), conv1d, dt_proj, A_log and D by channel; x_proj and
// out_proj (RowParallelLinear) by input column; out_proj_bias on rank 0 alone (RowParallelLinear
// adds its bias once, on rank 0, before the all-reduce).
std::map<std::string, Tensor> cut_mamba1_weights(const ChannelRange& ch, const TpShard& shard,
                                                 const std::map<std::string, Tensor>& weights) {
  const int64_t I = ch.intermediate;
  std::map<std::string, Tensor> cut;
  for (const auto& [name, weight] : weights) {
    const TensorView w = weight.view();
    const auto channel_axis = [&](int axis) {
      HYBRIDTB_CHECK(w.rank() > axis && w.size(axis) == I, kPrefix, "weight ", name, " must have intermediate_size ", I,
                     " in dimension ", axis, ", got ", w.describe());
      return cut_axis(w, axis, ch.begin, ch.end);
    };
    if (name == "in_proj" || name == "in_proj_bias") {
      HYBRIDTB_CHECK(w.size(0) == 2 * I, kPrefix, "weight ", name, " must have 2 * intermediate_size = ", 2 * I,
                     " rows (x, then z), got ", w.describe());
      cut[name] = concat_rows(cut_axis(w, 0, ch.begin, ch.end), cut_axis(w, 0, I + ch.begin, I + ch.end));
    } else if (name == "x_proj" || name == "out_proj") {
      cut[name] = channel_axis(1);
    } else if (name == "out_proj_bias") {
      if (shard.tp_rank == 0) cut[name] = clone_host(w);
    } else if (name == "conv1d_weight" || name == "conv1d_bias" || name == "dt_proj" || name == "dt_proj_bias" ||
               name == "A_log" || name == "D") {
      cut[name] = channel_axis(0);
    } else {
      throw Error(detail::concat(kPrefix, "mamba1 weight '", name, "' has no tensor-parallel rule"));
    }
  }
  return cut;
}


// Where the parts of a join come from: tp shards of `config`, checked against the parts' count.
std::vector<TpShard> shards_of(const AttentionConfig& config, size_t parts, const char* name) {
  HYBRIDTB_CHECK(parts >= 1, kPrefix, "joining ", name, " needs at least one rank, got none");
  std::vector<TpShard> shards;
  const auto tp = static_cast<int64_t>(parts);
  for (int64_t r = 0; r < tp; ++r) shards.push_back(tp_shard(config, tp, r));
  return shards;
}

// [outer, heads, inner] parts into the unsharded tensor: each unsharded head from the first part
// that holds it (part r holds heads [begins[r], begins[r] + its size)); a head held by several parts
// must be byte-identical in all of them.
Tensor join_heads(const std::vector<TensorView>& parts, const std::vector<int64_t>& begins, int axis,
                  int64_t heads, const char* name) {
  const TensorView& first = parts.front();
  if (first.empty()) {
    for (size_t r = 0; r < parts.size(); ++r) {
      HYBRIDTB_CHECK(parts[r].empty(), kPrefix, name, " of rank ", r, " is present, but not that of rank 0");
    }
    return {};
  }
  Shape shape = first.shape();
  shape[static_cast<size_t>(axis)] = heads;
  const Tensor joined = Tensor::host(first.dtype(), shape);
  std::vector<int64_t> owner(static_cast<size_t>(heads), -1);
  for (size_t r = 0; r < parts.size(); ++r) {
    const TensorView& part = parts[r];
    HYBRIDTB_CHECK(!part.empty() && part.device() == Device::kHost && part.dtype() == first.dtype() &&
                       part.rank() == first.rank(),
                   kPrefix, name, " of rank ", r, " must be a host tensor like rank 0's (", first.describe(),
                   "), got ", part.describe());
    Shape expected = first.shape();
    expected[static_cast<size_t>(axis)] = part.size(axis);
    HYBRIDTB_CHECK(part.shape() == expected && begins[r] + part.size(axis) <= heads, kPrefix, name, " of rank ", r,
                   " must be ", shape_to_string(expected), " with heads ", begins[r], "…",
                   begins[r] + part.size(axis) - 1, " of ", heads, ", got ", part.describe());
    for (int64_t h = 0; h < part.size(axis); ++h) {
      const int64_t head = begins[r] + h;
      const TensorView source = head_view(part, axis, h, h + 1);
      const int64_t first_rank = owner[static_cast<size_t>(head)];
      if (first_rank >= 0) {
        const TensorView& other = parts[static_cast<size_t>(first_rank)];
        const int64_t other_h = head - begins[static_cast<size_t>(first_rank)];
        HYBRIDTB_CHECK(bitwise_equal(source, head_view(other, axis, other_h, other_h + 1)), kPrefix, name, " of rank ",
                       r, " differs from rank ", first_rank, " in replicated kv head ", head);
        continue;
      }
      owner[static_cast<size_t>(head)] = static_cast<int64_t>(r);
      // Copy the head into its place: [outer, 1, inner] rows of bytes.
      const Tensor contiguous = clone_host(source);
      int64_t outer = 1, inner = element_size(first.dtype());
      for (int i = 0; i < axis; ++i) outer *= shape[static_cast<size_t>(i)];
      for (size_t i = static_cast<size_t>(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
      const auto* src = static_cast<const unsigned char*>(contiguous.data());
      auto* dst = static_cast<unsigned char*>(joined.data());
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(dst + (o * heads + head) * inner, src + o * inner, static_cast<size_t>(inner));
      }
    }
  }
  for (int64_t head = 0; head < heads; ++head) {
    HYBRIDTB_CHECK(owner[static_cast<size_t>(head)] >= 0, kPrefix, name, ": no rank holds head ", head);
  }
  return joined;
}

Tensor join_query_heads_named(const AttentionConfig& config, const std::vector<TensorView>& parts, const char* name) {
  const std::vector<TpShard> shards = shards_of(config, parts.size(), name);
  std::vector<int64_t> begins;
  for (size_t r = 0; r < parts.size(); ++r) {
    begins.push_back(shards[r].q_head_begin);
    HYBRIDTB_CHECK(parts[r].empty() || (parts[r].rank() == 3 && parts[r].size(1) == shards[r].num_heads()), kPrefix,
                   name, " of rank ", r, " must be [T, ", shards[r].num_heads(), ", D], got ", parts[r].describe());
  }
  return join_heads(parts, begins, 1, config.num_heads, name);
}

Tensor join_kv_heads_named(const AttentionConfig& config, const std::vector<TensorView>& parts, int axis,
                           const char* name) {
  const std::vector<TpShard> shards = shards_of(config, parts.size(), name);
  std::vector<int64_t> begins;
  for (size_t r = 0; r < parts.size(); ++r) {
    begins.push_back(shards[r].kv_head_begin);
    HYBRIDTB_CHECK(parts[r].empty() || (parts[r].rank() > axis && parts[r].size(axis) == shards[r].num_kv_heads()),
                   kPrefix, name, " of rank ", r, " must have ", shards[r].num_kv_heads(), " kv heads in dimension ",
                   axis, ", got ", parts[r].describe());
  }
  return join_heads(parts, begins, axis, config.num_kv_heads, name);
}

// Pools [num_slots, ...] of the ranks (rank order) into the unsharded pools, by channel.
std::map<std::string, Tensor> join_mamba1_pools(const AttentionConfig& config,
                                                const std::vector<StepOutputs>& rank_outputs) {
  std::map<std::string, Tensor> joined;
  const auto tp = static_cast<int64_t>(rank_outputs.size());
  for (const auto& [name, first] : rank_outputs.front().ssm_state) {
    const int axis = mamba1_pool_channel_axis(config, name);
    std::vector<TensorView> parts;
    std::vector<int64_t> begins;
    for (int64_t r = 0; r < tp; ++r) {
      const auto it = rank_outputs[static_cast<size_t>(r)].ssm_state.find(name);
      HYBRIDTB_CHECK(it != rank_outputs[static_cast<size_t>(r)].ssm_state.end(), kPrefix, "rank ", r,
                     " has no state pool ", name, ", rank 0 has");
      parts.push_back(it->second.view());
      begins.push_back(mamba1_channels(config, tp_shard(config, tp, r)).begin);
    }
    const int64_t I = mamba1_channels(config, tp_shard(config, tp, 0)).intermediate;
    joined[name] = join_heads(parts, begins, axis, I, name.c_str());
  }
  return joined;
}

std::vector<TensorView> views_of(const std::vector<StepOutputs>& outputs, Tensor StepOutputs::* member) {
  std::vector<TensorView> views;
  for (const StepOutputs& out : outputs) views.push_back((out.*member).view());
  return views;
}

StepOutputs shard_outputs(const BatchFile& file, const AttentionConfig& rank_config, const StepOutputs& outputs,
                          const TpShard& shard) {
  const AttentionConfig& config = file.config;
  StepOutputs cut;
  if (!outputs.ssm_state.empty()) {
    HYBRIDTB_CHECK(config.ssm_mode == "mamba1", kPrefix, "outputs with state pools of ssm_mode '", config.ssm_mode,
                   "' are not sharded");
    cut.ssm_state = cut_mamba1_pools(config, mamba1_channels(config, shard), outputs.ssm_state);
  }
  cut.backend = outputs.backend;
  const int64_t hq = config.num_heads, hkv = config.num_kv_heads;
  cut.output = cut_heads(outputs.output, "output", 1, hq, shard.q_head_begin, shard.q_head_end);
  cut.attn_output = cut_heads(outputs.attn_output, "attn_output", 1, hq, shard.q_head_begin, shard.q_head_end);
  cut.ssm_output = cut_heads(outputs.ssm_output, "ssm_output", 1, hq, shard.q_head_begin, shard.q_head_end);
  cut.kv_cache = cut_heads(outputs.kv_cache, "kv_cache", 3, hkv, shard.kv_head_begin, shard.kv_head_end);
  cut.k_scale_cache = cut_heads(outputs.k_scale_cache, "k_scale_cache", 2, hkv, shard.kv_head_begin, shard.kv_head_end);
  cut.v_scale_cache = cut_heads(outputs.v_scale_cache, "v_scale_cache", 2, hkv, shard.kv_head_begin, shard.kv_head_end);
  // The rank's builder sees the rank's kv heads (seq_threshold_3d = 128 / Hkv): its own metadata.
  cut.has_metadata = outputs.has_metadata;
  if (cut.has_metadata) cut.metadata = build_hybrid_metadata(rank_config, file.builder, file.batch);
  return cut;
}

}  // namespace

TpShard tp_shard(const AttentionConfig& config, int64_t tp_size, int64_t tp_rank) {
  const int64_t hq = config.num_heads, hkv = config.num_kv_heads;
  HYBRIDTB_CHECK(tp_size >= 1, kPrefix, "tp_size must be at least 1, got ", tp_size);
  HYBRIDTB_CHECK(tp_rank >= 0 && tp_rank < tp_size, kPrefix, "tp_rank must be in [0, tp_size ", tp_size, "), got ",
                 tp_rank);
  HYBRIDTB_CHECK(hq >= 1 && hkv >= 1, kPrefix, "num_heads and num_kv_heads must be at least 1, got num_heads ", hq,
                 " and num_kv_heads ", hkv);
  HYBRIDTB_CHECK(hq % hkv == 0, kPrefix, "num_heads ", hq, " is not divisible by num_kv_heads ", hkv);
  HYBRIDTB_CHECK(hq % tp_size == 0, kPrefix, "num_heads ", hq, " is not divisible by tp_size ", tp_size);
  TpShard shard;
  shard.tp_size = tp_size;
  shard.tp_rank = tp_rank;
  const int64_t q_per_rank = hq / tp_size;
  shard.q_head_begin = tp_rank * q_per_rank;
  shard.q_head_end = (tp_rank + 1) * q_per_rank;
  if (hkv >= tp_size) {
    HYBRIDTB_CHECK(hkv % tp_size == 0, kPrefix, "num_kv_heads ", hkv, " is not divisible by tp_size ", tp_size);
    const int64_t kv_per_rank = hkv / tp_size;
    shard.kv_head_begin = tp_rank * kv_per_rank;
    shard.kv_head_end = (tp_rank + 1) * kv_per_rank;
  } else {
    HYBRIDTB_CHECK(tp_size % hkv == 0, kPrefix, "tp_size ", tp_size, " is not divisible by num_kv_heads ", hkv,
                   " (kv heads are replicated when num_kv_heads < tp_size)");
    shard.num_kv_head_replicas = tp_size / hkv;
    shard.kv_head_begin = tp_rank / shard.num_kv_head_replicas;
    shard.kv_head_end = shard.kv_head_begin + 1;
  }
  return shard;
}

AttentionConfig shard_config(const AttentionConfig& config, const TpShard& shard) {
  check_shardable(config);
  HYBRIDTB_CHECK(tp_shard(config, shard.tp_size, shard.tp_rank) == shard, kPrefix, "the shard of rank ", shard.tp_rank,
                 " of ", shard.tp_size, " does not belong to a layer of num_heads ", config.num_heads,
                 " and num_kv_heads ", config.num_kv_heads);
  AttentionConfig rank = config;
  rank.num_heads = shard.num_heads();
  rank.num_kv_heads = shard.num_kv_heads();
  const auto slice = [&](const std::optional<std::vector<float>>& values, const char* name) {
    if (!values) return values;
    HYBRIDTB_CHECK(static_cast<int64_t>(values->size()) == config.num_heads, kPrefix, name, " must have num_heads ",
                   config.num_heads, " values, got ", values->size());
    return std::optional<std::vector<float>>(std::in_place, values->begin() + shard.q_head_begin,
                                             values->begin() + shard.q_head_end);
  };
  rank.alibi_slopes = slice(config.alibi_slopes, "alibi_slopes");
  rank.sinks = slice(config.sinks, "sinks");
  if (config.ssm_mode == "mamba1") {
    const ChannelRange channels = mamba1_channels(config, shard);
    rank.ssm_params["intermediate_size"] = channels.end - channels.begin;
  }
  rank.tp_size = shard.tp_size;
  rank.tp_rank = shard.tp_rank;
  return rank;
}

BatchFile shard_batch_file(const BatchFile& file, const TpShard& shard) {
  const AttentionConfig& config = file.config;
  BatchFile rank;
  rank.config = shard_config(config, shard);  // first: rejects what is not sharded, naming it
  HYBRIDTB_CHECK(file.inputs.linear_inputs.empty(), kPrefix, "linear-layer inputs are not sharded");
  HYBRIDTB_CHECK(config.ssm_mode == "mamba1" || (file.inputs.ssm_state.empty() && file.inputs.weights.empty()),
                 kPrefix, "state pools or weights of ssm_mode '", config.ssm_mode, "' are not sharded");
  rank.schema_version = file.schema_version;
  rank.builder = file.builder;
  rank.batch = file.batch;
  const int64_t hq = config.num_heads, hkv = config.num_kv_heads;
  const BatchInputs& in = file.inputs;
  BatchInputs& out = rank.inputs;
  out.query = cut_heads(in.query, "query", 1, hq, shard.q_head_begin, shard.q_head_end);
  out.key = cut_heads(in.key, "key", 1, hkv, shard.kv_head_begin, shard.kv_head_end);
  out.value = cut_heads(in.value, "value", 1, hkv, shard.kv_head_begin, shard.kv_head_end);
  out.kv_cache = cut_heads(in.kv_cache, "kv_cache", 3, hkv, shard.kv_head_begin, shard.kv_head_end);
  out.k_scale_cache = cut_heads(in.k_scale_cache, "k_scale_cache", 2, hkv, shard.kv_head_begin, shard.kv_head_end);
  out.v_scale_cache = cut_heads(in.v_scale_cache, "v_scale_cache", 2, hkv, shard.kv_head_begin, shard.kv_head_end);
  out.k_scale = in.k_scale;
  out.v_scale = in.v_scale;
  out.output_scale = in.output_scale;
  out.q_scale = in.q_scale;
  if (config.ssm_mode == "mamba1") {
    const ChannelRange channels = mamba1_channels(config, shard);
    out.ssm_state = cut_mamba1_pools(config, channels, in.ssm_state);
    out.weights = cut_mamba1_weights(channels, shard, in.weights);
  }
  // Every rank's branch reads the whole hidden rows (vLLM replicates them over the ranks): the
  // unsharded query, viewed flat.
  if (rank.config.is_tensor_parallel_rank() && config.has_ssm_branch()) {
    HYBRIDTB_CHECK(!in.q_scale.has_value(), kPrefix, "an fp8 query with an SSM branch is not sharded");
    out.ssm_hidden = clone_host(TensorView(in.query.data(), in.query.dtype(), {in.query.size(0), config.ssm_hidden_size()}));
  }
  if (file.outputs) rank.outputs = shard_outputs(file, rank.config, *file.outputs, shard);
  if (file.expected) rank.expected = shard_outputs(file, rank.config, *file.expected, shard);
  rank.provenance = file.provenance;
  rank.provenance["tensor_parallel"] = detail::concat("rank ", shard.tp_rank, " of ", shard.tp_size);
  rank.warnings = file.warnings;
  return rank;
}

std::string tp_rank_file_path(const std::string& path, int64_t tp_size, int64_t tp_rank) {
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + ".tp" + std::to_string(tp_size) + "-rank" + std::to_string(tp_rank) +
                              p.extension().string()))
      .string();
}

Tensor join_query_heads(const AttentionConfig& config, const std::vector<TensorView>& rank_outputs) {
  return join_query_heads_named(config, rank_outputs, "output");
}

Tensor join_kv_caches(const AttentionConfig& config, const std::vector<TensorView>& rank_caches) {
  return join_kv_heads_named(config, rank_caches, 3, "kv_cache");
}

Tensor join_kv_scale_caches(const AttentionConfig& config, const std::vector<TensorView>& rank_scale_caches) {
  return join_kv_heads_named(config, rank_scale_caches, 2, "scale cache");
}

StepOutputs join_step_outputs(const AttentionConfig& config, const std::vector<StepOutputs>& rank_outputs) {
  check_shardable(config);
  HYBRIDTB_CHECK(!rank_outputs.empty(), kPrefix, "joining step outputs needs at least one rank, got none");
  const StepOutputs& first = rank_outputs.front();
  for (size_t r = 0; r < rank_outputs.size(); ++r) {
    HYBRIDTB_CHECK(rank_outputs[r].ssm_state.empty() || config.ssm_mode == "mamba1", kPrefix, "outputs of rank ", r,
                   " hold state pools of ssm_mode '", config.ssm_mode, "', which are not sharded");
    HYBRIDTB_CHECK(rank_outputs[r].has_metadata == first.has_metadata &&
                       (!first.has_metadata || rank_outputs[r].metadata == first.metadata),
                   kPrefix, "the metadata of rank ", r, " differs from rank 0's (every rank has the same heads)");
  }
  StepOutputs joined;
  joined.backend = first.backend;
  joined.output = join_query_heads_named(config, views_of(rank_outputs, &StepOutputs::output), "output");
  joined.attn_output = join_query_heads_named(config, views_of(rank_outputs, &StepOutputs::attn_output), "attn_output");
  joined.ssm_output = join_query_heads_named(config, views_of(rank_outputs, &StepOutputs::ssm_output), "ssm_output");
  joined.kv_cache = join_kv_heads_named(config, views_of(rank_outputs, &StepOutputs::kv_cache), 3, "kv_cache");
  joined.k_scale_cache =
      join_kv_heads_named(config, views_of(rank_outputs, &StepOutputs::k_scale_cache), 2, "k_scale_cache");
  joined.v_scale_cache =
      join_kv_heads_named(config, views_of(rank_outputs, &StepOutputs::v_scale_cache), 2, "v_scale_cache");
  if (!first.ssm_state.empty()) joined.ssm_state = join_mamba1_pools(config, rank_outputs);
  joined.metadata = first.metadata;
  joined.has_metadata = first.has_metadata;
  return joined;
}

}  // namespace hybridtb::spec
