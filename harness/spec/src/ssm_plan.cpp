// The per-request plan of an SSM step (ssm_plan.h).
#include "hybridtb/spec/ssm_plan.h"

#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"

namespace hybridtb::spec::ssm {
namespace {

// Bounds-checked read of an index array, naming the metadata field on failure.
int64_t entry(const IntArray& array, const std::string& field, int64_t i) {
  HYBRIDTB_CHECK(array.rank() == 1 && 0 <= i && i < array.numel(), "mamba/", field, " has no entry ", i, ": ",
                 array.describe());
  return array[i];
}

Slot slot_at(const IntArray& array, const std::string& field, int64_t row, int64_t col) {
  HYBRIDTB_CHECK(array.rank() == 2 && 0 <= row && row < array.size(0) && 0 <= col && col < array.size(1), "mamba/",
                 field, " has no entry [", row, "][", col, "]: ", array.describe());
  return Slot{array.at(row, col), detail::concat("mamba/", field, "[", row, "][", col, "]")};
}

template <typename T>
const T& required(const std::optional<T>& value, const char* field, const char* why) {
  HYBRIDTB_CHECK(value.has_value(), "mamba/", field, " is missing (", why, ")");
  return *value;
}

// Mode all: the state-block entries of request r's last computed and last scheduled tokens.
struct LastBlocks {
  int64_t computed;
  int64_t scheduled;
};
LastBlocks last_blocks(const MambaAttentionMetadata& metadata, int64_t r) {
  const char* why = "mamba_cache_mode all";
  return {entry(required(metadata.block_idx_last_computed_token, "block_idx_last_computed_token", why),
                "block_idx_last_computed_token", r),
          entry(required(metadata.block_idx_last_scheduled_token, "block_idx_last_scheduled_token", why),
                "block_idx_last_scheduled_token", r)};
}

}  // namespace

void check_plannable_step(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                          const BatchDescription& batch, const std::string& who) {
  if (config.num_speculative_tokens > 0) {
    throw NotSupported(detail::concat(who, " with /config/num_speculative_tokens ", config.num_speculative_tokens,
                                      ": speculative decoding with an SSM is not modelled yet (a decode would advance "
                                      "several tokens and write per-token states)"));
  }
  HYBRIDTB_CHECK(
      metadata.num_reqs == batch.num_reqs() && metadata.num_decodes + metadata.num_prefills == batch.num_reqs(),
      "the Mamba metadata (", metadata.num_decodes, " decodes + ", metadata.num_prefills, " prefills, num_reqs ",
      metadata.num_reqs, ") does not describe the batch's ", batch.num_reqs(), " requests");
}

RequestPlan plan_decode(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                        const BatchDescription& batch, int64_t r) {
  RequestPlan plan;
  plan.request = r;
  plan.decode = true;
  plan.begin = batch.query_start_loc[r];
  plan.end = batch.query_start_loc[r + 1];
  plan.first_position = batch.context_len(r);
  const IntArray& rows = metadata.state_indices_tensor_d;
  Slot read;
  if (config.mamba_cache_mode == MambaCacheMode::kAll) {
    const LastBlocks last = last_blocks(metadata, r);
    read = slot_at(rows, "state_indices_tensor_d", r, last.computed);
    plan.final_write = slot_at(rows, "state_indices_tensor_d", r, last.scheduled);
  } else {
    read = slot_at(rows, "state_indices_tensor_d", r, 0);
    plan.final_write = read;
  }
  // KNOWINGLY DIFFERS from older vLLM: a request with no computed tokens that is scheduled one token
  // is split as a decode there, and the decode kernel then reads whatever its slot holds (stale
  // state of a finished request). vLLM fixed that (PR #32118: such a request starts from zeros); so
  // do we, which also keeps "chunked prefill at any split == one-shot prefill" true.
  if (batch.context_len(r) > 0) plan.read = read;
  return plan;
}

RequestPlan plan_prefill(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                         const BatchDescription& batch, int64_t i) {
  RequestPlan plan;
  const int64_t r = metadata.num_decodes + i;
  plan.request = r;
  const IntArray& query_start_loc_p =
      required(metadata.query_start_loc_p, "query_start_loc_p", "the batch has prefills");
  plan.begin = entry(query_start_loc_p, "query_start_loc_p", i) + metadata.num_decode_tokens;
  plan.end = entry(query_start_loc_p, "query_start_loc_p", i + 1) + metadata.num_decode_tokens;
  plan.first_position = batch.context_len(r);
  const bool has_initial_state =
      entry(required(metadata.has_initial_states_p, "has_initial_states_p", "the batch has prefills"),
            "has_initial_states_p", i) != 0;
  const IntArray& indices =
      required(metadata.state_indices_tensor_p, "state_indices_tensor_p", "the batch has prefills");
  if (config.mamba_cache_mode != MambaCacheMode::kAll) {
    plan.final_write =
        Slot{entry(indices, "state_indices_tensor_p", i), detail::concat("mamba/state_indices_tensor_p[", i, "]")};
    if (has_initial_state) plan.read = plan.final_write;
    return plan;
  }
  // Mode all: row i of the prefill table; the state blocks of positions [k·B, (k+1)·B) are entries k.
  const int64_t block = config.mamba_block_size;
  const LastBlocks last = last_blocks(metadata, r);
  if (has_initial_state) plan.read = slot_at(indices, "state_indices_tensor_p", i, last.computed);
  for (int64_t p = plan.first_position; p < plan.first_position + (plan.end - plan.begin); ++p) {
    if ((p + 1) % block == 0) {
      plan.boundary_writes.emplace_back(p, slot_at(indices, "state_indices_tensor_p", i, (p + 1) / block - 1));
    }
  }
  plan.final_write = slot_at(indices, "state_indices_tensor_p", i, last.scheduled);
  return plan;
}

std::vector<const Slot*> slots_of(const RequestPlan& plan) {
  std::vector<const Slot*> slots;
  if (plan.read) slots.push_back(&*plan.read);
  for (const auto& write : plan.boundary_writes) slots.push_back(&write.second);
  slots.push_back(&plan.final_write);
  return slots;
}

bool skips_request(const AttentionConfig& config, const RequestPlan& plan) {
  const EngineRules& rules = engine_rules(config);
  for (const Slot* slot : slots_of(plan)) {
    if (rules.skips_state_index(slot->index)) return true;
  }
  return false;
}

}  // namespace hybridtb::spec::ssm
