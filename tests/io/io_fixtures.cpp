// Fixtures for the tests in tests/io (see io_fixtures.h): bit-pattern tensors, a hand-built valid
// batch, field-by-field comparison and in-place edits of written files.
#include "io_fixtures.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "hybridtb/error.h"

namespace hybridtb::testing {

std::vector<uint16_t> bfloat16_specials() {
  return {
      0x0000, 0x8000,  // +0, -0
      0x0001, 0x8001,  // smallest subnormals
      0x007F,          // largest subnormal
      0x0080,          // smallest normal
      0x7F7F, 0xFF7F,  // ±max finite
      0x7F80, 0xFF80,  // ±inf
      0x7FC0, 0x7FC1,  // quiet NaN, quiet NaN with payload
      0x7F81, 0xFFA5,  // signalling NaN, negative NaN with payload
      0x3F80, 0xC049,  // 1.0, -3.140625
  };
}

std::vector<uint16_t> float16_specials() {
  return {
      0x0000, 0x8000,  // ±0
      0x0001, 0x8001,  // smallest subnormals
      0x03FF,          // largest subnormal
      0x0400,          // smallest normal
      0x7BFF, 0xFBFF,  // ±65504
      0x7C00, 0xFC00,  // ±inf
      0x7E00, 0x7C01,  // quiet NaN, signalling NaN
      0xFE37,          // negative NaN with payload
      0x3C00, 0xC248,  // 1.0, -3.140625
  };
}

std::vector<uint32_t> float32_specials() {
  return {
      0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
      0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7FC00001u, 0x7F800123u, 0xFFFFFFFFu, 0x3F800000u,
  };
}

std::vector<uint64_t> float64_specials() {
  return {
      0x0000000000000000ull, 0x8000000000000000ull, 0x0000000000000001ull, 0x800FFFFFFFFFFFFFull,
      0x0010000000000000ull, 0x7FEFFFFFFFFFFFFFull, 0xFFEFFFFFFFFFFFFFull, 0x7FF0000000000000ull,
      0xFFF0000000000000ull, 0x7FF8000000000000ull, 0x7FF8000000000123ull, 0x7FF0000000000001ull,
      0x3FF0000000000000ull, 0x3FB999999999999Aull,  // 1.0, 0.1
  };
}

namespace {

uint64_t next_random(uint64_t& state) {  // splitmix64: deterministic, covers all bit patterns
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

template <typename Bits>
void fill_bits(void* data, int64_t count, const std::vector<Bits>& specials, uint64_t seed) {
  auto* out = static_cast<Bits*>(data);
  uint64_t state = seed;
  for (int64_t i = 0; i < count; ++i) {
    const auto index = static_cast<size_t>(i);
    out[i] = index < specials.size() ? specials[index] : static_cast<Bits>(next_random(state));
  }
}

std::vector<uint8_t> all_bytes() {
  std::vector<uint8_t> bytes(256);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  return bytes;
}

}  // namespace

Tensor patterned_tensor(DType dtype, const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::host(dtype, shape);
  const int64_t n = t.numel();
  switch (dtype) {
    case DType::kFloat64: fill_bits(t.data(), n, float64_specials(), seed); break;
    case DType::kFloat32: fill_bits(t.data(), n, float32_specials(), seed); break;
    case DType::kFloat16: fill_bits(t.data(), n, float16_specials(), seed); break;
    case DType::kBFloat16: fill_bits(t.data(), n, bfloat16_specials(), seed); break;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kInt8: fill_bits(t.data(), n, all_bytes(), seed); break;
    case DType::kInt32:
      fill_bits<uint32_t>(t.data(), n, {0x80000000u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0u}, seed);
      break;
    case DType::kInt64:
      fill_bits<uint64_t>(t.data(), n, {0x8000000000000000ull, 0x7FFFFFFFFFFFFFFFull, ~0ull, 0ull}, seed);
      break;
    case DType::kBool: {
      auto* out = t.data_as<uint8_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>((i * 7 + static_cast<int64_t>(seed)) % 3 == 0);
      break;
    }
  }
  return t;
}

AttentionConfig full_config(DType dtype, KvCacheDtype kv, AttnType attn) {
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_size = 32;
  c.block_size = 16;
  c.scale = 0.17677669529663687;  // 1/sqrt(32), a float64 that float32 cannot hold exactly
  c.sliding_window = 128;
  c.logits_soft_cap = 30.25;
  c.use_alibi_sqrt = true;
  c.dtype = dtype;
  c.kv_cache_dtype = kv;
  c.attn_type = attn;
  c.ssm_mode = attn == AttnType::kEncoderOnly ? "none" : "prefix_sum";  // encoder layers have no SSM branch
  c.mamba_cache_mode = MambaCacheMode::kAlign;
  c.mamba_block_size = 64;
  c.num_speculative_tokens = 2;
  c.alibi_slopes = std::vector<float>{0.5f, 0.25f, 0.125f, 1.0f / 3.0f};
  c.sinks = std::vector<float>{-1.5f, 0.0f, 2.75f, 1e-30f};
  return c;
}

BuilderConfig full_builder() {
  BuilderConfig b;
  b.cudagraph_mode = CudaGraphMode::kFullAndPiecewise;
  b.cudagraph_capture_sizes = {1, 2, 4, 8, 512};
  b.max_num_seqs = 128;
  return b;
}

BatchFile small_batch_file(const AttentionConfig& config, bool with_optionals) {
  BatchFile file;
  file.config = config;
  file.builder = full_builder();
  BatchDescription& b = file.batch;
  // Requests: r0 context 20 + 3 tokens, r1 a decode at position 5, r2 a fresh 2-token prefill,
  // r3 a padding request. Token row 6 is CUDA-graph padding.
  b.query_start_loc = IntArray::vector({0, 3, 4, 6, 6});
  b.num_actual_tokens = 6;
  const bool decoder = config.attn_type == AttnType::kDecoder;
  if (decoder) {
    b.seq_lens = IntArray::vector({23, 6, 2, 0});
    b.block_table = IntArray({4, 3}, {3, 1, 0, 2, 0, 0, 5, 0, 0, 0, 0, 0});
    b.slot_mapping = {1 * 16 + 4, 1 * 16 + 5, 1 * 16 + 6, 2 * 16 + 5, 5 * 16 + 0, 5 * 16 + 1, -1};
  } else {
    b.seq_lens = IntArray::vector({3, 1, 2, 0});
    b.block_table = IntArray::matrix(4, 0);
    b.slot_mapping = {-1, -1, -1, -1, -1, -1, -1};
  }
  if (with_optionals) {
    b.mm_prefix_range = IntArray({4, 2, 2}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 4, 0, 0, 0, 0});
    b.ssm_block_table = IntArray({4, 2}, {7, 8, 9, 0, 10, 11, 0, 0});
    b.num_accepted_tokens = IntArray::vector({1, 2, 1, 0});
  }

  BatchInputs& in = file.inputs;
  const int64_t T = kSmallTokens, Hq = config.num_heads, Hkv = config.num_kv_heads, D = config.head_size;
  in.query = patterned_tensor(config.dtype, {T, Hq, D}, 1);
  in.key = patterned_tensor(config.dtype, {T, Hkv, D}, 2);
  in.value = patterned_tensor(config.dtype, {T, Hkv, D}, 3);
  if (decoder) {
    in.kv_cache = patterned_tensor(kv_storage_dtype(config.kv_cache_dtype, config.dtype),
                                   {kSmallBlocks, 2, config.block_size, Hkv, D}, 4);
  }
  if (is_per_token_head(config.kv_cache_dtype)) {
    in.k_scale_cache = patterned_tensor(DType::kFloat32, {kSmallBlocks, config.block_size, Hkv}, 5);
    in.v_scale_cache = patterned_tensor(DType::kFloat32, {kSmallBlocks, config.block_size, Hkv}, 6);
  }
  in.k_scale = 0.1f;  // not a power of two: a float32 → float64 → float32 trip must be exact
  in.v_scale = 3.0e-3f;
  if (with_optionals) {
    in.output_scale = 0.0625f;
    file.provenance = {{"producer", "hybridtb io tests"}, {"seed", "1234"}, {"notes", "ünïcödé ✓"}};
  }
  return file;
}

HybridMetadata full_metadata() {
  HybridMetadata m;
  m.attention = {6, 3, 23, 32, 16, 32, 1};
  MambaAttentionMetadata& s = m.mamba.emplace();
  s.num_prefills = 2;
  s.num_prefill_tokens = 5;
  s.num_decodes = 1;
  s.num_decode_tokens = 1;
  s.num_reqs = 3;
  s.query_start_loc_p = IntArray::vector({0, 3, 5});
  s.has_initial_states_p = IntArray::vector({1, 0});
  s.state_indices_tensor_p = IntArray({2, 3}, {3, 1, 0, 5, 0, 0});
  s.state_indices_tensor_d = IntArray({1, 3}, {2, -1, -1});
  s.num_accepted_tokens = IntArray::vector({2});
  s.query_start_loc_d = IntArray::vector({0, 1});
  s.block_idx_last_scheduled_token = IntArray::vector({1, 0, 0});
  s.block_idx_first_scheduled_token_p = IntArray::vector({1, 0});
  s.block_idx_last_computed_token = IntArray::vector({1, 0, -1});
  s.num_computed_tokens_p = IntArray::vector({20, 0});
  s.seq_lens = IntArray::vector({23, 6, 2});
  CausalConv1dMetadata conv;
  conv.block_m = 8;
  conv.nums = IntArray::vector({1, 1});
  conv.tot = 2;
  conv.mlist = IntArray::vector({0, 1});
  conv.offsetlist = IntArray::vector({0, 0});
  std::vector<int32_t> padded(2048, kPadSlotId);
  padded[0] = 0;
  padded[1] = 1;
  conv.batch_ptr = IntArray::vector(padded);
  padded[1] = 0;
  conv.token_chunk_offset_ptr = IntArray::vector(padded);
  s.causal_conv1d = conv;
  s.cudagraph_padded = 1;
  return m;
}

StepOutputs sample_outputs(const BatchFile& file, DType dtype, const std::string& backend, uint64_t seed) {
  const AttentionConfig& c = file.config;
  StepOutputs out;
  out.backend = backend;
  out.output = patterned_tensor(dtype, {kSmallTokens, c.num_heads, c.head_size}, seed);
  out.attn_output = patterned_tensor(dtype, {kSmallTokens, c.num_heads, c.head_size}, seed + 1);
  if (!file.inputs.kv_cache.empty()) {
    out.kv_cache = patterned_tensor(file.inputs.kv_cache.dtype(), file.inputs.kv_cache.shape(), seed + 2);
  }
  if (is_per_token_head(c.kv_cache_dtype)) {
    out.k_scale_cache = patterned_tensor(DType::kFloat32, file.inputs.k_scale_cache.shape(), seed + 3);
    out.v_scale_cache = patterned_tensor(DType::kFloat32, file.inputs.v_scale_cache.shape(), seed + 4);
  }
  out.metadata = full_metadata();
  return out;
}

void add_ssm_inputs(BatchFile& file, DType dtype, uint64_t seed) {
  AttentionConfig& c = file.config;
  const int64_t I = 8, N = 4, K = 4, R = 2, H = c.num_heads * c.head_size;
  c.ssm_mode = "mamba1";
  c.ssm_params = {{"intermediate_size", I}, {"state_size", N}, {"conv_kernel", K}, {"dt_rank", R}};
  BatchInputs& in = file.inputs;
  in.ssm_state["conv_state"] = patterned_tensor(dtype, {kSsmSlots, I, K - 1}, seed);
  in.ssm_state["ssm_state"] = patterned_tensor(dtype, {kSsmSlots, I, N}, seed + 1);
  const std::vector<std::pair<std::string, Shape>> weights{
      {"in_proj", {2 * I, H}},      {"in_proj_bias", {2 * I}}, {"conv1d_weight", {I, K}},
      {"conv1d_bias", {I}},         {"x_proj", {R + 2 * N, I}}, {"dt_proj", {I, R}},
      {"dt_proj_bias", {I}},        {"A_log", {I, N}},          {"D", {I}},
      {"out_proj", {H, I}},         {"out_proj_bias", {H}},     {"extra_rank3", {2, 3, 5}},
  };
  uint64_t next = seed + 2;
  for (const auto& [name, shape] : weights) in.weights[name] = patterned_tensor(dtype, shape, next++);
}

void add_ssm_outputs(StepOutputs& out, const BatchFile& file, DType dtype, uint64_t seed) {
  const AttentionConfig& c = file.config;
  out.ssm_output = patterned_tensor(dtype, {kSmallTokens, c.num_heads, c.head_size}, seed);
  uint64_t next = seed + 1;
  for (const auto& [name, pool] : file.inputs.ssm_state) out.ssm_state[name] = patterned_tensor(dtype, pool.shape(), next++);
}

void expect_same_tensor(const Tensor& expected, const Tensor& actual, const std::string& what) {
  ASSERT_EQ(expected.empty(), actual.empty()) << what << ": presence differs";
  if (expected.empty()) return;
  EXPECT_EQ(expected.dtype(), actual.dtype()) << what;
  EXPECT_EQ(expected.shape(), actual.shape()) << what;
  if (expected.dtype() == actual.dtype() && expected.shape() == actual.shape()) {
    EXPECT_TRUE(bitwise_equal(expected, actual)) << what << ": bytes differ";
  }
}

namespace {

template <typename T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

void expect_same_tensors(const std::map<std::string, Tensor>& e, const std::map<std::string, Tensor>& a,
                         const std::string& what) {
  std::vector<std::string> expected_names, actual_names;
  for (const auto& [name, tensor] : e) expected_names.push_back(name);
  for (const auto& [name, tensor] : a) actual_names.push_back(name);
  EXPECT_EQ(expected_names, actual_names) << what << ": names differ";
  for (const auto& [name, tensor] : e) {
    const auto found = a.find(name);
    if (found != a.end()) expect_same_tensor(tensor, found->second, what + "/" + name);
  }
}

bool same_floats(const std::optional<std::vector<float>>& a, const std::optional<std::vector<float>>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  return a->size() == b->size() && std::memcmp(a->data(), b->data(), a->size() * sizeof(float)) == 0;
}

void expect_same_outputs(const std::optional<StepOutputs>& e, const std::optional<StepOutputs>& a,
                         const std::string& what) {
  ASSERT_EQ(e.has_value(), a.has_value()) << what;
  if (!e) return;
  EXPECT_EQ(e->backend, a->backend) << what;
  expect_same_tensor(e->output, a->output, what + "/output");
  expect_same_tensor(e->attn_output, a->attn_output, what + "/attn_output");
  expect_same_tensor(e->kv_cache, a->kv_cache, what + "/kv_cache");
  expect_same_tensor(e->k_scale_cache, a->k_scale_cache, what + "/k_scale_cache");
  expect_same_tensor(e->v_scale_cache, a->v_scale_cache, what + "/v_scale_cache");
  expect_same_tensor(e->ssm_output, a->ssm_output, what + "/ssm_output");
  expect_same_tensors(e->ssm_state, a->ssm_state, what + "/ssm");
  const std::vector<std::string> differences = metadata_differences(e->metadata, a->metadata);
  EXPECT_TRUE(differences.empty()) << what << "/metadata differs, first: " << differences.front();
}

}  // namespace

void expect_same_batch_file(const BatchFile& e, const BatchFile& a) {
  EXPECT_EQ(a.schema_version, kWrittenSchemaVersion);
  EXPECT_EQ(e.provenance, a.provenance);
  const AttentionConfig &ec = e.config, &ac = a.config;
  EXPECT_EQ(ec.num_heads, ac.num_heads);
  EXPECT_EQ(ec.num_kv_heads, ac.num_kv_heads);
  EXPECT_EQ(ec.head_size, ac.head_size);
  EXPECT_EQ(ec.block_size, ac.block_size);
  EXPECT_TRUE(same_bits(ec.scale, ac.scale)) << ec.scale << " vs " << ac.scale;
  EXPECT_EQ(ec.sliding_window, ac.sliding_window);
  EXPECT_TRUE(same_bits(ec.logits_soft_cap, ac.logits_soft_cap));
  EXPECT_EQ(ec.use_alibi_sqrt, ac.use_alibi_sqrt);
  EXPECT_EQ(ec.dtype, ac.dtype);
  EXPECT_EQ(ec.kv_cache_dtype, ac.kv_cache_dtype);
  EXPECT_EQ(ec.attn_type, ac.attn_type);
  EXPECT_EQ(ec.ssm_mode, ac.ssm_mode);
  EXPECT_EQ(ec.ssm_params, ac.ssm_params);
  EXPECT_EQ(ec.mamba_cache_mode, ac.mamba_cache_mode);
  EXPECT_EQ(ec.mamba_block_size, ac.mamba_block_size);
  EXPECT_EQ(ec.num_speculative_tokens, ac.num_speculative_tokens);
  EXPECT_TRUE(same_floats(ec.alibi_slopes, ac.alibi_slopes)) << "alibi_slopes";
  EXPECT_TRUE(same_floats(ec.sinks, ac.sinks)) << "sinks";

  EXPECT_EQ(e.builder.cudagraph_mode, a.builder.cudagraph_mode);
  EXPECT_EQ(e.builder.cudagraph_capture_sizes, a.builder.cudagraph_capture_sizes);
  EXPECT_EQ(e.builder.max_num_seqs, a.builder.max_num_seqs);

  const BatchDescription &eb = e.batch, &ab = a.batch;
  EXPECT_EQ(eb.query_start_loc, ab.query_start_loc);
  EXPECT_EQ(eb.seq_lens, ab.seq_lens);
  EXPECT_EQ(eb.block_table, ab.block_table) << eb.block_table.describe() << " vs " << ab.block_table.describe();
  EXPECT_EQ(eb.slot_mapping, ab.slot_mapping);
  EXPECT_EQ(eb.num_actual_tokens, ab.num_actual_tokens);
  EXPECT_EQ(eb.mm_prefix_range, ab.mm_prefix_range);
  EXPECT_EQ(eb.ssm_block_table, ab.ssm_block_table);
  EXPECT_EQ(eb.num_accepted_tokens, ab.num_accepted_tokens);

  const BatchInputs &ei = e.inputs, &ai = a.inputs;
  expect_same_tensor(ei.query, ai.query, "/inputs/query");
  expect_same_tensor(ei.key, ai.key, "/inputs/key");
  expect_same_tensor(ei.value, ai.value, "/inputs/value");
  expect_same_tensor(ei.kv_cache, ai.kv_cache, "/inputs/kv_cache");
  expect_same_tensor(ei.k_scale_cache, ai.k_scale_cache, "/inputs/k_scale_cache");
  expect_same_tensor(ei.v_scale_cache, ai.v_scale_cache, "/inputs/v_scale_cache");
  EXPECT_TRUE(same_bits(ei.k_scale, ai.k_scale)) << "k_scale";
  EXPECT_TRUE(same_bits(ei.v_scale, ai.v_scale)) << "v_scale";
  EXPECT_EQ(ei.output_scale.has_value(), ai.output_scale.has_value());
  if (ei.output_scale && ai.output_scale) {
    EXPECT_TRUE(same_bits(*ei.output_scale, *ai.output_scale));
  }
  expect_same_tensors(ei.ssm_state, ai.ssm_state, "/inputs/ssm");
  expect_same_tensors(ei.weights, ai.weights, "/weights");

  expect_same_outputs(e.outputs, a.outputs, "/outputs");
  expect_same_outputs(e.expected, a.expected, "/expected");
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-hybridtb exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a hybridtb::Error, nothing was thrown";
  return "";
}

void edit_file(const std::filesystem::path& path, const std::function<void(const h5::Group& root)>& edit) {
  const h5::ErrorSilencer silence;
  h5::File file = h5::File::open_read_write(path.string());
  {
    const h5::Group root = file.root();
    edit(root);
  }
  file.close();
}

h5::Group group_at(const h5::Group& root, const std::string& path) {
  if (path.empty() || path == "/") return root.open_group(".");
  std::optional<h5::Group> group;
  size_t begin = 1;
  while (begin <= path.size()) {
    const size_t end = std::min(path.find('/', begin), path.size());
    const h5::Group& parent = group ? *group : root;
    group = parent.open_group(path.substr(begin, end - begin));
    begin = end + 1;
  }
  return std::move(*group);
}

void replace_dataset(const h5::Group& root, const std::string& path, hid_t type, const Shape& shape, const void* data) {
  const size_t slash = path.rfind('/');
  const h5::Group parent = group_at(root, path.substr(0, slash));
  const std::string name = path.substr(slash + 1);
  if (parent.child_kind(name) != h5::ObjectKind::kMissing) parent.remove_child(name);
  const h5::Dataset dataset = parent.create_dataset(name, type, shape);
  int64_t count = 1;
  for (const int64_t dim : shape) count *= dim;
  if (count > 0) dataset.write_raw(type, data);
}

void write_fixed_string_attribute(const h5::Object& object, const std::string& name, const std::string& value,
                                  bool space_padded) {
  const size_t size = value.size() + 3;  // padded on purpose
  const h5::Type type = h5::Type::copy_of(H5T_C_S1);
  H5Tset_size(type.id(), size);
  H5Tset_strpad(type.id(), space_padded ? H5T_STR_SPACEPAD : H5T_STR_NULLPAD);
  std::string buffer = value;
  buffer.resize(size, space_padded ? ' ' : '\0');
  write_typed_attribute(object, name, type.id(), buffer.data());
}

void write_typed_attribute(const h5::Object& object, const std::string& name, hid_t type, const void* value) {
  if (object.has_attribute(name)) object.remove_attribute(name);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attribute = H5Acreate2(object.id(), name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(attribute, 0) << "cannot create attribute " << name;
  EXPECT_GE(H5Awrite(attribute, type, value), 0);
  H5Aclose(attribute);
  H5Sclose(space);
}

std::vector<std::string> directory_listing(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace hybridtb::testing
