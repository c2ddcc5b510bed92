// Tensor parallelism of a hybrid layer, by vLLM's rules: the attention heads split across tp_size
// ranks (QKVParallelLinear, Attention with num_heads / tp_size heads per rank), and a mamba1 branch's
// channels (MambaMixer); datasets/SCHEMA.md §5.2.2 states the rules a rank file follows.
//
// Rank r owns query heads [r·Hq/tp, (r+1)·Hq/tp) (Hq % tp == 0). KV heads: with Hkv ≥ tp, rank r
// owns kv heads [r·Hkv/tp, (r+1)·Hkv/tp) (Hkv % tp == 0); with Hkv < tp they are replicated
// (QKVParallelLinear's num_kv_head_replicas = tp / Hkv, tp % Hkv == 0): each rank holds exactly one
// kv head, r / (tp / Hkv), the one its query heads read. The per-rank layer is the same layer with
// Hq/tp query heads and max(1, Hkv/tp) kv heads, ALiBi slopes and sinks sliced per query head, a KV
// cache of the same blocks holding only the rank's kv heads, and the rank's rows of query, key and
// value. Attention needs no communication: the unsharded output is the ranks' outputs concatenated
// along the head axis (vLLM's all-reduce follows o_proj, which is not modelled here).
//
// mamba1 (intermediate_size % tp_size == 0): rank r owns channels [r·I/tp, (r+1)·I/tp). in_proj
// (MergedColumnParallelLinear) keeps the x and the z rows of them; conv1d_weight/bias, dt_proj/bias,
// A_log and D their rows; x_proj and out_proj (RowParallelLinear) their input columns; out_proj_bias
// stays on rank 0 alone (a row-parallel bias is added once); the pools (conv_state in either layout,
// ssm_state) their channels. The rank's branch reads the whole hidden rows (inputs.ssm_hidden: the
// unsharded query, viewed flat, which vLLM replicates on every rank) and needs its group at the two
// all-reduces (reference/.../ssm_mode.h, Mode::advance_rank): x_proj's product and the contribution
// after out_proj. The rank adds its heads' columns of the summed contribution to its attention.
//
// Branch "zero" shards trivially. Other SSM modes, linear-attention layers and layers that are
// already a rank (/config tp_size > 1) are reported as NotSupported / Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridtb/batch_file.h"
#include "hybridtb/config.h"
#include "hybridtb/tensor.h"

namespace hybridtb::spec {

// What one rank of a tensor-parallel group owns of a layer. Head ranges are of the unsharded layer.
struct TpShard {
  int64_t tp_size = 1;
  int64_t tp_rank = 0;
  int64_t q_head_begin = 0;  // query heads [q_head_begin, q_head_end)
  int64_t q_head_end = 0;
  int64_t kv_head_begin = 0;  // kv heads [kv_head_begin, kv_head_end): one head when replicated
  int64_t kv_head_end = 0;
  int64_t num_kv_head_replicas = 1;  // ranks holding each kv head: tp / Hkv when Hkv < tp, else 1

  int64_t num_heads() const { return q_head_end - q_head_begin; }
  int64_t num_kv_heads() const { return kv_head_end - kv_head_begin; }
  bool kv_replicated() const { return num_kv_head_replicas > 1; }
  bool operator==(const TpShard&) const = default;
};

// Rank `tp_rank`'s shard of a layer with config.num_heads query and config.num_kv_heads kv heads.
// Throws Error naming the field and the constraint: tp_size < 1, tp_rank outside [0, tp_size),
// num_heads or num_kv_heads < 1, num_heads % num_kv_heads, num_heads % tp_size, and
// num_kv_heads % tp_size (Hkv ≥ tp) or tp_size % num_kv_heads (Hkv < tp).
TpShard tp_shard(const AttentionConfig& config, int64_t tp_size, int64_t tp_rank);

// The rank's layer: num_heads and num_kv_heads of the shard, alibi_slopes and sinks sliced to its
// query heads, mamba1's intermediate_size / tp_size, tp_size and tp_rank set, everything else as in
// `config`. NotSupported for a layer this does not shard (above).
AttentionConfig shard_config(const AttentionConfig& config, const TpShard& shard);

// The rank's step: its config (shard_config), the same builder settings and batch description, and
// copies of its heads of query [T, Hq, D], key and value [T, Hkv, D], kv_cache [NB, 2, BS, Hkv, D]
// and, when present, k/v_scale_cache [NB, BS, Hkv]; the per-tensor scales as they are. The file's
// outputs and expected, when present, are cut the same way (output, attn_output, ssm_output by
// query head, the caches by kv head) and carry the rank's metadata from the shared builders (where
// they carried metadata): vLLM builds it per rank, and its 3D threshold (128 / num_kv_heads)
// depends on the rank's kv heads. A mamba1 branch's weights, pools (inputs and results) and
// ssm_hidden are cut as above. Provenance gains `tensor_parallel` ("rank R of TP"). NotSupported for
// an SSM branch this does not shard (naming the mode) or a linear layer; Error if a tensor's head or
// channel axis does not match the config.
BatchFile shard_batch_file(const BatchFile& file, const TpShard& shard);

// Where rank `tp_rank` of `tp_size`'s file of the step at `path` lies (`gen --tp` writes them there,
// `hybridtb tp --rank-files` reads them): step.h5 -> step.tp4-rank2.h5, in the same folder.
std::string tp_rank_file_path(const std::string& path, int64_t tp_size, int64_t tp_rank);

// The unsharded [T, Hq, D] from the ranks' [T, Hq/tp, D] (output, attn_output or ssm_output of each
// rank, in rank order; tp = rank_outputs.size()): concatenation along the head axis. Throws Error
// unless every part has the rank's head count and the same dtype, T and D.
Tensor join_query_heads(const AttentionConfig& config, const std::vector<TensorView>& rank_outputs);

// The unsharded KV cache [NB, 2, BS, Hkv, D] from the ranks' caches (rank order), each kv head from
// the first rank that owns it. A replicated kv head must be byte-identical on every rank holding it:
// Error naming both ranks and the head otherwise. join_kv_scale_caches does the same for
// k_scale_cache or v_scale_cache [NB, BS, Hkv] (empty parts: an empty result).
Tensor join_kv_caches(const AttentionConfig& config, const std::vector<TensorView>& rank_caches);
Tensor join_kv_scale_caches(const AttentionConfig& config, const std::vector<TensorView>& rank_scale_caches);

// The unsharded outputs of a step from the ranks' (rank order): output, attn_output, ssm_output by
// query head, the KV and scale caches by kv head (as above), backend and metadata of rank 0. Every
// rank must have the same metadata (they have the same head counts); it is the ranks' metadata,
// which differs from the unsharded layer's in seq_threshold_3d (and so perhaps use_3d_path) when
// the rank has fewer kv heads. State pools (mamba1): by channel.
StepOutputs join_step_outputs(const AttentionConfig& config, const std::vector<StepOutputs>& rank_outputs);

}  // namespace hybridtb::spec
