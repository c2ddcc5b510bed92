// hybridtb_compare REF.h5 GPU.h5: compares the /outputs of two `hybridtb run` results of the same
// batch (reference first) with the CUDA rows of the tolerance table (hybridtb/tolerance.h):
// output and attn_output elementwise over rows [0, num_actual_tokens), padding rows of GPU.h5
// still NaN, KV cache and scale caches byte for byte, metadata field by field. Prints one line per
// check; exit status 0 = all pass, 1 = a check failed, 2 = usage error.
// Used by harness/scripts/gpu-check.sh on datasets/examples/*.h5.
#include <cmath>
#include <iostream>
#include <string>

#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/tolerance.h"

namespace {

using namespace hybridtb;

Tolerance tolerance(const BatchFile& file) {
  const int64_t n = file.batch.max_seq_len() + 1;
  const int64_t d = file.config.head_size;
  if (file.inputs.output_scale && file.config.attn_type == AttnType::kDecoder) {
    return tolerance_for(ToleranceCase::kCudaAttentionFp8Output, n, d);
  }
  switch (file.config.dtype) {
    case DType::kFloat32:
      return tolerance_for(ToleranceCase::kCudaAttentionFloat32, n, d);
    case DType::kFloat16:
      return tolerance_for(ToleranceCase::kCudaAttentionFloat16, n, d);
    default:
      return tolerance_for(ToleranceCase::kCudaAttentionBFloat16, n, d);
  }
}

bool compare_rows(const char* what, const Tensor& gpu, const Tensor& ref, int64_t rows, const Tolerance& tol) {
  if (gpu.shape() != ref.shape()) {
    std::cout << "FAIL " << what << ": shape " << shape_to_string(gpu.shape()) << " vs " << shape_to_string(ref.shape())
              << "\n";
    return false;
  }
  const int64_t per_row = gpu.numel() / std::max<int64_t>(1, gpu.size(0));
  int64_t failures = 0;
  int64_t padding_written = 0;
  double max_abs = 0.0;
  for (int64_t i = 0; i < gpu.numel(); ++i) {
    const double a = load_as_double(gpu.data(), gpu.dtype(), i);
    if (i >= rows * per_row) {
      if (!std::isnan(a)) ++padding_written;
      continue;
    }
    const double e = load_as_double(ref.data(), ref.dtype(), i);
    if (!std::isnan(a) && !std::isnan(e)) max_abs = std::max(max_abs, std::fabs(a - e));
    if (!tol.allows(a, e)) ++failures;
  }
  const bool ok = failures == 0 && padding_written == 0;
  std::cout << (ok ? "ok   " : "FAIL ") << what << ": max |err| " << max_abs << ", " << failures
            << " outside tolerance, " << padding_written << " padding elements written\n";
  return ok;
}

bool compare_bytes(const char* what, const Tensor& gpu, const Tensor& ref) {
  const bool ok = (gpu.empty() && ref.empty()) || (!gpu.empty() && !ref.empty() && bitwise_equal(gpu, ref));
  std::cout << (ok ? "ok   " : "FAIL ") << what << (ok ? ": bytes equal\n" : ": bytes differ\n");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: hybridtb_compare REF.h5 GPU.h5\n";
    return 2;
  }
  try {
    const BatchFile ref = read_batch_file(argv[1]);
    const BatchFile gpu = read_batch_file(argv[2]);
    HYBRIDTB_CHECK(ref.outputs && gpu.outputs, "both files need /outputs (run `hybridtb run` first)");
    const Tolerance tol = tolerance(ref);
    std::cout << "tolerance: atol " << tol.atol << " rtol " << tol.rtol << " (" << tol.rationale << ")\n";
    const int64_t rows = ref.batch.num_actual_tokens;
    bool ok = true;
    ok &= compare_rows("attn_output", gpu.outputs->attn_output, ref.outputs->attn_output, rows, tol);
    ok &= compare_rows("output", gpu.outputs->output, ref.outputs->output, rows, tol);
    ok &= compare_bytes("kv_cache", gpu.outputs->kv_cache, ref.outputs->kv_cache);
    ok &= compare_bytes("k_scale_cache", gpu.outputs->k_scale_cache, ref.outputs->k_scale_cache);
    ok &= compare_bytes("v_scale_cache", gpu.outputs->v_scale_cache, ref.outputs->v_scale_cache);
    const auto diffs = metadata_differences(gpu.outputs->metadata, ref.outputs->metadata);
    std::cout << (diffs.empty() ? "ok   metadata: equal\n" : "FAIL metadata: " + diffs.front() + "\n");
    ok &= diffs.empty();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "hybridtb_compare: " << e.what() << "\n";
    return 1;
  }
}
