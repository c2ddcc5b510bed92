// The cases of tests/cuda. A case is a name and the fields of one synthetic batch: the layer (its
// attention, its SSM branch), the requests and what the synthetic generator and the metadata
// builder are told. make_config, make_builder and make_step turn a case into the AttentionConfig,
// the BuilderConfig and the batch file a test runs; PrintTo and CaseName print it by its name. What
// a test file checks of a case beyond the batch (the kernel path its rows take, the epilogues they
// reach, …) goes with it in a CheckedCase.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "hybridtb/batch_file.h"
#include "hybridtb/config.h"
#include "hybridtb/dtype.h"
#include "hybridtb/synthetic.h"

namespace hybridtb::testing {

// ALiBi slopes 2^(−8(h+1)/H) per query head h, applied linearly or as −slope·sqrt(p − k).
enum class Alibi { kNone, kLinear, kSqrt };

struct CudaCase {
  std::string name;
  // The SSM branch ("none": a plain attention layer); mamba_block_size 16 unless cache is kNone.
  std::string ssm_mode = "none";
  MambaCacheMode cache = MambaCacheMode::kNone;
  std::map<std::string, int64_t> ssm_params;  // empty: every parameter of the mode 4
  DType pool_dtype = DType::kFloat32;         // the state pools' dtype (drawn as float32)
  // The attention layer; the softmax scale is 1/sqrt(head_size).
  int64_t num_heads = 8;
  int64_t num_kv_heads = 2;
  int64_t head_size = 128;
  int64_t block_size = 16;
  DType dtype = DType::kBFloat16;
  std::vector<RequestSpec> requests;
  KvCacheDtype kv = KvCacheDtype::kAuto;
  int64_t window = 0;
  double soft_cap = 0.0;
  Alibi alibi = Alibi::kNone;
  bool sinks = false;  // sink logit of query head h: −1 + sink_step·(h mod sink_period)
  float sink_step = 0.5f;
  int64_t sink_period = 5;
  bool encoder = false;  // encoder_only attention
  std::string engine_version;
  // The synthetic batch (SyntheticOptions) and the builder.
  std::optional<float> output_scale;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  int64_t padding_tokens = 0;
  int64_t padding_requests = 0;
  bool decode_graph = false;  // FULL_DECODE_ONLY with capture sizes 1, 2, 4, 8
  int64_t spare_blocks = 3;
  bool compact = false;
  bool alias_blocks = false;
  int64_t shared_prefix_tokens = 0;
  bool ssm_block_table = false;
  uint64_t seed = 1;
  std::optional<uint64_t> tensor_seed;  // the SSM pools' and weights' seed (unset: seed + 100)
};

// The 1-byte KV cache dtypes with the names the cases take for them.
struct NamedKvDtype {
  KvCacheDtype kv;
  const char* name;
};
inline constexpr NamedKvDtype kByteKvDtypes[] = {{KvCacheDtype::kFp8E4M3, "Fp8E4m3"},
                                                 {KvCacheDtype::kFp8E5M2, "Fp8E5m2"},
                                                 {KvCacheDtype::kInt8PerTokenHead, "Int8Pth"},
                                                 {KvCacheDtype::kFp8PerTokenHead, "Fp8Pth"}};

// mamba1 with I 64, N 16, K 4, R 8 (the vector state path of the GPU scan).
inline const std::map<std::string, int64_t> kMamba1Big = {
    {"intermediate_size", 64}, {"state_size", 16}, {"conv_kernel", 4}, {"dt_rank", 8}};

AttentionConfig make_config(const CudaCase& c);
BuilderConfig make_builder(const CudaCase& c);
// The case's synthetic batch; with an SSM branch also its state pools (`num_slots` slots; 0: the
// batch's need + 2 spare slots no request names) and weights, random from the tensor seed.
BatchFile make_step(const CudaCase& c, int64_t num_slots = 0);

// A bfloat16 model's query heads far outside float16's range, for the 1-byte caches' float16
// products (a query row or head rescaled by its own power of two): head h of every token ×2^17
// where h % 4 == 0 (its elements up to about 2^19, far above float16's 65504; its base-2 logits up
// to about 2^22, the range float16's P allows), ×2^-40 where h % 4 == 1 (below float16's normal
// range), the others as drawn.
void scale_query_heads_beyond_float16(BatchFile& step);

// gtest prints a parameter with this (instead of its bytes).
void PrintTo(const CudaCase& c, std::ostream* out);

// A case and what one test file checks of it beyond the batch.
template <typename Expect>
struct CheckedCase {
  CudaCase batch;
  Expect expect;
};
template <typename Expect>
void PrintTo(const CheckedCase<Expect>& c, std::ostream* out) {
  PrintTo(c.batch, out);
}

// INSTANTIATE_TEST_SUITE_P's name generator: the case's name.
struct CaseName {
  std::string operator()(const ::testing::TestParamInfo<CudaCase>& info) const { return info.param.name; }
  template <typename Expect>
  std::string operator()(const ::testing::TestParamInfo<CheckedCase<Expect>>& info) const {
    return info.param.batch.name;
  }
};

}  // namespace hybridtb::testing
