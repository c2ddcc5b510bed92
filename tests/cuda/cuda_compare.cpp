// Comparison helpers of tests/cuda (see cuda_compare.h).
#include "cuda_compare.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <sstream>
#include <tuple>
#include <utility>

#include "hybridtb/dtype.h"
#include "hybridtb/error.h"
#include "hybridtb/metadata.h"

namespace hybridtb::testing {

void load_step(Backend& backend, const LayerBuffers& layer, const BatchFile& file) {
  const BatchInputs& in = file.inputs;
  const BatchInputs& device = layer.device;
  for (const auto& [name, input] : in.linear_inputs) backend.copy(device.linear_inputs.at(name), input);
  for (const auto& [to, from] : {std::pair{&device.query, &in.query}, std::pair{&device.key, &in.key},
                                 std::pair{&device.value, &in.value}, std::pair{&device.kv_cache, &in.kv_cache},
                                 std::pair{&device.k_scale_cache, &in.k_scale_cache},
                                 std::pair{&device.v_scale_cache, &in.v_scale_cache}}) {
    if (!from->empty()) backend.copy(*to, *from);
  }
  for (const auto& [name, pool] : in.ssm_state) backend.copy(device.ssm_state.at(name), pool);
  for (const Tensor* t : {&layer.output, &layer.attn_output, &layer.ssm_output}) {
    if (t->empty()) continue;
    Tensor host = Tensor::host(t->dtype(), t->shape());
    fill_host(host, kOutputPoison);
    backend.copy(*t, host);
  }
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(status);
  if (count == 0) return "no CUDA device: cudaGetDeviceCount returned 0";
  return "";
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(status));
}

CapturedGraph::~CapturedGraph() {
  if (exec != nullptr) cudaGraphExecDestroy(exec);  // NOLINT: best effort
  if (graph != nullptr) cudaGraphDestroy(graph);    // NOLINT
}

// The parity row of the one tolerance table for a float32-arithmetic kernel's attention output.
Tolerance cuda_attention_tolerance(const BatchFile& step) {
  ParityKey key;
  key.quantity = Quantity::kAttnOutput;
  key.model_dtype = step.config.dtype;
  key.kv_cache_dtype = step.config.kv_cache_dtype;
  key.candidate_dtype = step.config.dtype;
  key.compute_dtype = DType::kFloat32;
  key.fp8_output = step.inputs.output_scale.has_value() && step.config.attn_type == AttnType::kDecoder;
  key.reduction_length = step.batch.max_seq_len() + 1;
  key.inner_length = step.config.head_size;
  return parity_tolerance(key);
}

namespace {

// Rows [0, num_actual_tokens) of `actual` against `expected` ([T, Hq, D]); max error and the worst
// element decoded to (token, head, dim); NaN mismatches counted.
::testing::AssertionResult close_rows(const char* what, const Tensor& actual, const Tensor& expected, int64_t rows,
                                      const Tolerance& tolerance) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << what << ": shape " << shape_to_string(actual.shape()) << " vs "
                                         << shape_to_string(expected.shape());
  }
  const int64_t h = actual.size(1);
  const int64_t d = actual.size(2);
  int64_t failures = 0;
  int64_t nan_mismatch = 0;
  double max_abs = 0.0;
  double worst_excess = -1.0;
  int64_t worst = -1;
  for (int64_t i = 0; i < rows * h * d; ++i) {
    const double a = load_as_double(actual.data(), actual.dtype(), i);
    const double e = load_as_double(expected.data(), expected.dtype(), i);
    if (std::isnan(a) != std::isnan(e)) ++nan_mismatch;
    if (!std::isnan(a) && !std::isnan(e)) max_abs = std::max(max_abs, std::fabs(a - e));
    if (!tolerance.allows(a, e)) {
      ++failures;
      const double excess = std::fabs(a - e) - (tolerance.atol + tolerance.rtol * std::fabs(e));
      if (std::isnan(excess) || excess > worst_excess) {
        worst_excess = std::isnan(excess) ? 1e300 : excess;
        worst = i;
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess() << what << ": max |err| " << max_abs;
  std::ostringstream out;
  out << what << ": " << failures << " of " << rows * h * d << " elements outside atol " << tolerance.atol
      << " rtol " << tolerance.rtol << " (" << tolerance.rationale << "); NaN mismatches " << nan_mismatch
      << "; max |err| " << max_abs << "; worst at (token " << worst / (h * d) << ", head " << (worst / d) % h
      << ", dim " << worst % d << "): " << load_as_double(actual.data(), actual.dtype(), worst) << " vs "
      << load_as_double(expected.data(), expected.dtype(), worst);
  return ::testing::AssertionFailure() << out.str();
}

::testing::AssertionResult padding_untouched(const char* what, const Tensor& actual, int64_t begin) {
  for (int64_t i = begin * actual.size(1) * actual.size(2); i < actual.numel(); ++i) {
    if (!std::isnan(load_as_double(actual.data(), actual.dtype(), i))) {
      return ::testing::AssertionFailure() << what << ": padding element " << i << " was written";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_bytes(const char* what, const Tensor& a, const Tensor& b) {
  if (a.empty() && b.empty()) return ::testing::AssertionSuccess();
  if (a.empty() != b.empty() || !bitwise_equal(a, b)) {
    int64_t first = -1;
    if (!a.empty() && !b.empty() && a.nbytes() == b.nbytes()) {
      const auto* x = static_cast<const unsigned char*>(a.data());
      const auto* y = static_cast<const unsigned char*>(b.data());
      for (int64_t i = 0; i < a.nbytes(); ++i) {
        if (x[i] != y[i]) {
          first = i / element_size(a.dtype());
          break;
        }
      }
    }
    return ::testing::AssertionFailure() << what << " differs from the reference's (first element " << first << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

::testing::AssertionResult cuda_matches_reference(const BatchFile& step, const StepOutputs& cuda,
                                                  const StepOutputs& reference) {
  const std::vector<std::string> diffs = metadata_differences(cuda.metadata, reference.metadata);
  if (!diffs.empty()) return ::testing::AssertionFailure() << "metadata differs: " << diffs.front();
  const int64_t rows = step.batch.num_actual_tokens;
  const Tolerance tolerance = cuda_attention_tolerance(step);
  for (const auto& result :
       {close_rows("attn_output", cuda.attn_output, reference.attn_output, rows, tolerance),
        close_rows("output", cuda.output, reference.output, rows, tolerance),
        padding_untouched("attn_output", cuda.attn_output, rows), padding_untouched("output", cuda.output, rows),
        same_bytes("kv_cache after the write", cuda.kv_cache, reference.kv_cache),
        same_bytes("k_scale_cache after the write", cuda.k_scale_cache, reference.k_scale_cache),
        same_bytes("v_scale_cache after the write", cuda.v_scale_cache, reference.v_scale_cache)}) {
    if (!result) return result;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult outputs_padding_untouched(const StepOutputs& out, const BatchFile& step) {
  const int64_t rows = step.batch.num_actual_tokens;
  for (const auto& [what, t] : {std::pair{"output", &out.output}, std::pair{"attn_output", &out.attn_output},
                                std::pair{"ssm_output", &out.ssm_output}}) {
    if (t->empty()) continue;
    ::testing::AssertionResult result = padding_untouched(what, *t, rows);
    if (!result) return result;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult cuda_run_matches_reference(const BatchFile& step, const BackendSettings& settings) {
  auto reference = create_backend("reference", settings);
  auto cuda = create_backend("cuda", settings);
  const StepOutputs expected = run_step(*reference, step);
  const StepOutputs actual = run_step(*cuda, step);
  return cuda_matches_reference(step, actual, expected);
}

::testing::AssertionResult cuda_run_matches_reference_reproducibly(const BatchFile& step,
                                                                   const BackendSettings& settings) {
  auto reference = create_backend("reference", settings);
  auto cuda = create_backend("cuda", settings);
  const StepOutputs expected = run_step(*reference, step);
  const StepOutputs actual = run_step(*cuda, step);
  if (::testing::AssertionResult matches = cuda_matches_reference(step, actual, expected); !matches) return matches;
  const StepOutputs again = run_step(*cuda, step);
  for (const auto& [what, first, second] : {std::tuple{"output", &actual.output, &again.output},
                                            std::tuple{"attn_output", &actual.attn_output, &again.attn_output},
                                            std::tuple{"kv_cache", &actual.kv_cache, &again.kv_cache}}) {
    if (!bitwise_equal(*first, *second)) return ::testing::AssertionFailure() << what << " differs between two runs";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace hybridtb::testing
