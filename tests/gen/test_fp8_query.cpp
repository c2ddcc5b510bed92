// The fp8 query of schema 1.3 (/inputs/query in float8_e4m3fn / float8_e5m2 plus /inputs/q_scale):
// vLLM 0.33's Triton backend passes q_descale only with a per-tensor fp8 KV cache and folds it into
// the score scale (scale · q_scale · k_scale), i.e. the real query is stored · q_scale. Checked
// metamorphically: a batch whose query is stored in fp8 with a power-of-two q_scale gives, on the
// reference, the same bits as the same batch whose bfloat16 query holds the dequantised values
// (exactly representable), attention and SSM branch alike. Also the validation errors and the file
// round trip (written as schema 1.3).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/presets.h"
#include "hybridtb/step.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

using ::testing::HasSubstr;

StepOutputs replay(const BatchFile& file) {
  auto backend = create_backend("reference", BackendSettings{file.config, file.builder});
  return run_step(*backend, file);
}

BatchFile fp8_kv_batch(const std::string& kv) {
  const Layer layer = make_layer("hymba-small", {"engine_version=0.33.0", "num_heads=4", "num_kv_heads=1",
                                                 "head_size=32", "sliding_window=32", "ssm_mode=mamba1",
                                                 "ssm.intermediate_size=64", "ssm.dt_rank=4", "ssm.state_size=8",
                                                 "kv_cache_dtype=" + kv});
  return generate_batch(layer, parse_mix("d2@40+c1x8@16+p1x8"), {.seed = 6});
}

// The query quantised to `dtype` with q_scale 0.5 (stored = round(q / 0.5)); `real` receives the
// same batch with the dequantised query in the model dtype.
BatchFile with_fp8_query(const BatchFile& file, DType dtype, BatchFile& real) {
  BatchFile quantised = file;
  real = file;
  const Tensor& q = file.inputs.query;
  quantised.inputs.query = Tensor::host(dtype, q.shape());
  real.inputs.query = Tensor::host(q.dtype(), q.shape());
  for (int64_t i = 0; i < q.numel(); ++i) {
    store_from_double(quantised.inputs.query.data(), dtype, i, load_as_double(q.data(), q.dtype(), i) / 0.5);
    const double value = load_as_double(quantised.inputs.query.data(), dtype, i) * 0.5;
    store_from_double(real.inputs.query.data(), q.dtype(), i, value);
    EXPECT_EQ(load_as_double(real.inputs.query.data(), q.dtype(), i), value) << "not exact at " << i;
  }
  quantised.inputs.q_scale = 0.5f;
  return quantised;
}

TEST(Fp8Query, TheReferenceSeesStoredTimesQScaleExactly) {
  for (const auto& [kv, dtype] : {std::pair<std::string, DType>{"fp8_e4m3", DType::kFloat8E4M3},
                                  {"fp8_e5m2", DType::kFloat8E5M2}}) {
    SCOPED_TRACE(kv);
    const BatchFile file = fp8_kv_batch(kv);
    BatchFile real;
    const BatchFile quantised = with_fp8_query(file, dtype, real);
    validate(quantised.config, quantised.batch, quantised.inputs);
    const StepOutputs a = replay(quantised), b = replay(real);
    EXPECT_EQ(first_bit_difference(a, b), "");
  }
}

TEST(Fp8Query, ValidationNamesTheFieldAndTheConstraint) {
  const BatchFile file = fp8_kv_batch("fp8");
  BatchFile real;
  BatchFile quantised = with_fp8_query(file, DType::kFloat8E4M3, real);
  BatchFile no_scale = quantised;
  no_scale.inputs.q_scale.reset();
  try {
    validate(no_scale.config, no_scale.batch, no_scale.inputs);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/inputs/q_scale is missing"));
  }
  BatchFile stray_scale = file;
  stray_scale.inputs.q_scale = 0.5f;
  try {
    validate(stray_scale.config, stray_scale.batch, stray_scale.inputs);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/inputs/q_scale is present"));
    EXPECT_THAT(e.what(), HasSubstr("bfloat16"));
  }
  BatchFile auto_kv = fp8_kv_batch("auto");
  BatchFile unused;
  BatchFile auto_quantised = with_fp8_query(auto_kv, DType::kFloat8E4M3, unused);
  try {
    validate(auto_quantised.config, auto_quantised.batch, auto_quantised.inputs);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/config kv_cache_dtype is auto"));
    EXPECT_THAT(e.what(), HasSubstr("per-tensor fp8 KV cache"));
  }
  BatchFile bad_scale = quantised;
  bad_scale.inputs.q_scale = 0.0f;
  EXPECT_THROW(validate(bad_scale.config, bad_scale.batch, bad_scale.inputs), Error);
}

TEST(Fp8Query, RoundTripsThroughAFileAsSchema13) {
  const BatchFile file = fp8_kv_batch("fp8_e4m3");
  BatchFile real;
  const BatchFile quantised = with_fp8_query(file, DType::kFloat8E4M3, real);
  const std::string path = (testing::scratch_dir() / "fp8_query.h5").string();
  write_batch_file(path, quantised);
  const BatchFile back = read_batch_file(path);
  EXPECT_EQ(back.schema_version, "1.3");
  EXPECT_EQ(back.inputs.query.dtype(), DType::kFloat8E4M3);
  ASSERT_TRUE(back.inputs.q_scale.has_value());
  EXPECT_EQ(*back.inputs.q_scale, 0.5f);
  EXPECT_TRUE(bitwise_equal(back.inputs.query, quantised.inputs.query));
  EXPECT_EQ(back.config.engine_version, "vllm 0.33.0");
}

}  // namespace
}  // namespace hybridtb
