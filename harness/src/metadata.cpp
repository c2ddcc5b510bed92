// Field-by-field access to builder metadata: one visitor lists every field once, and flatten,
// unflatten and the difference report are all written in terms of it.
#include "hybridtb/metadata.h"

#include <algorithm>
#include <map>
#include <set>

#include "hybridtb/error.h"

namespace hybridtb {

namespace {

// Calls f(name, field) for every field; `M` may be const or mutable so one listing serves both
// reading and writing. Optional sub-structs are visited through `optional_group`.
template <typename Meta, typename F>
void visit_attention(Meta& m, F&& f) {
  f("attention/num_actual_tokens", m.num_actual_tokens);
  f("attention/max_query_len", m.max_query_len);
  f("attention/max_seq_len", m.max_seq_len);
  f("attention/seq_threshold_3d", m.seq_threshold_3d);
  f("attention/num_par_softmax_segments", m.num_par_softmax_segments);
  f("attention/head_size_padded", m.head_size_padded);
  f("attention/use_3d_path", m.use_3d_path);
}

template <typename Conv, typename F>
void visit_conv1d(Conv& c, F&& f) {
  f("mamba/causal_conv1d/block_m", c.block_m);
  f("mamba/causal_conv1d/nums", c.nums);
  f("mamba/causal_conv1d/tot", c.tot);
  f("mamba/causal_conv1d/mlist", c.mlist);
  f("mamba/causal_conv1d/offsetlist", c.offsetlist);
  f("mamba/causal_conv1d/batch_ptr", c.batch_ptr);
  f("mamba/causal_conv1d/token_chunk_offset_ptr", c.token_chunk_offset_ptr);
}

template <typename Meta, typename F>
void visit_mamba(Meta& m, F&& f) {
  f("mamba/num_prefills", m.num_prefills);
  f("mamba/num_prefill_tokens", m.num_prefill_tokens);
  f("mamba/num_decodes", m.num_decodes);
  f("mamba/num_decode_tokens", m.num_decode_tokens);
  f("mamba/num_reqs", m.num_reqs);
  f("mamba/query_start_loc_p", m.query_start_loc_p);
  f("mamba/has_initial_states_p", m.has_initial_states_p);
  f("mamba/state_indices_tensor_p", m.state_indices_tensor_p);
  f("mamba/state_indices_tensor_d", m.state_indices_tensor_d);
  f("mamba/num_accepted_tokens", m.num_accepted_tokens);
  f("mamba/query_start_loc_d", m.query_start_loc_d);
  f("mamba/block_idx_last_scheduled_token", m.block_idx_last_scheduled_token);
  f("mamba/block_idx_first_scheduled_token_p", m.block_idx_first_scheduled_token_p);
  f("mamba/block_idx_last_computed_token", m.block_idx_last_computed_token);
  f("mamba/num_computed_tokens_p", m.num_computed_tokens_p);
  f("mamba/seq_lens", m.seq_lens);
  f("mamba/cudagraph_padded", m.cudagraph_padded);
}

constexpr const char* kConvPrefix = "mamba/causal_conv1d/";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

std::vector<MetadataField> flatten(const HybridMetadata& metadata) {
  std::vector<MetadataField> fields;
  auto add = [&](const char* name, const auto& value) {
    using V = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<V, std::optional<IntArray>>) {
      if (value) fields.push_back({name, *value});
    } else {
      fields.push_back({name, value});
    }
  };
  visit_attention(metadata.attention, add);
  if (metadata.mamba) {
    visit_mamba(*metadata.mamba, add);
    if (metadata.mamba->causal_conv1d) visit_conv1d(*metadata.mamba->causal_conv1d, add);
  }
  return fields;
}

static std::set<std::string> known_field_names() {
  std::set<std::string> names;
  auto record = [&](const char* name, const auto&) { names.insert(name); };
  HybridMetadata scratch;
  MambaAttentionMetadata mamba;
  mamba.causal_conv1d.emplace();
  visit_attention(scratch.attention, record);
  visit_mamba(mamba, record);
  visit_conv1d(*mamba.causal_conv1d, record);
  return names;
}

HybridMetadata unflatten(const std::vector<MetadataField>& fields) {
  static const std::set<std::string> known = known_field_names();
  std::map<std::string, const MetadataField*> by_name;
  for (const auto& field : fields) {
    HYBRIDTB_CHECK(known.count(field.name) == 1, "unknown metadata field ", field.name);
    HYBRIDTB_CHECK(by_name.emplace(field.name, &field).second, "metadata field ", field.name, " appears twice");
  }
  auto take = [&](const char* name, auto& target) {
    using V = std::decay_t<decltype(target)>;
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      if constexpr (std::is_same_v<V, std::optional<IntArray>>) {
        target.reset();
        return;
      } else {
        throw Error(detail::concat("metadata field ", name, " is missing"));
      }
    }
    const auto& value = it->second->value;
    if constexpr (std::is_same_v<V, int64_t>) {
      HYBRIDTB_CHECK(std::holds_alternative<int64_t>(value), "metadata field ", name, " must be a scalar");
      target = std::get<int64_t>(value);
    } else {
      HYBRIDTB_CHECK(std::holds_alternative<IntArray>(value), "metadata field ", name, " must be an array");
      target = std::get<IntArray>(value);
    }
  };
  HybridMetadata metadata;
  visit_attention(metadata.attention, take);
  const auto has_prefix = [&](const char* prefix) {
    return std::any_of(fields.begin(), fields.end(), [&](const MetadataField& f) { return starts_with(f.name, prefix); });
  };
  if (has_prefix("mamba/")) {
    MambaAttentionMetadata& mamba = metadata.mamba.emplace();
    visit_mamba(mamba, take);
    if (has_prefix(kConvPrefix)) {
      mamba.causal_conv1d.emplace();
      visit_conv1d(*mamba.causal_conv1d, take);
    }
  }
  return metadata;
}

std::vector<std::string> metadata_differences(const HybridMetadata& a, const HybridMetadata& b) {
  std::map<std::string, std::variant<int64_t, IntArray>> fa, fb;
  for (auto& f : flatten(a)) fa.emplace(f.name, std::move(f.value));
  for (auto& f : flatten(b)) fb.emplace(f.name, std::move(f.value));
  auto describe = [](const std::variant<int64_t, IntArray>& v) {
    return std::holds_alternative<int64_t>(v) ? std::to_string(std::get<int64_t>(v)) : std::get<IntArray>(v).describe();
  };
  std::vector<std::string> differences;
  for (const auto& [name, value] : fa) {
    const auto it = fb.find(name);
    if (it == fb.end()) {
      differences.push_back(name + ": " + describe(value) + " vs absent");
    } else if (value != it->second) {
      differences.push_back(name + ": " + describe(value) + " vs " + describe(it->second));
    }
  }
  for (const auto& [name, value] : fb) {
    if (fa.find(name) == fa.end()) differences.push_back(name + ": absent vs " + describe(value));
  }
  return differences;
}

bool operator==(const HybridMetadata& a, const HybridMetadata& b) { return metadata_differences(a, b).empty(); }

}  // namespace hybridtb
