// GPU ssm_mode "prefix_sum_flat" (reference/ssm/prefix_sum_flat.cpp, the seed prototype's rule):
// contribution[t] = Σ_{j ≤ t} hidden[j] over the flattened token axis for t < num_decode_tokens,
// zero for the later rows; no state; whole steps. The cumsum is the affine column scan
// (ssm_kernels.h) over one pseudo-request [0, n), parallel over tokens, float32 accumulation. In a
// fixed decode step n is the padded row count T and the row flags pick the stores (kRowActive:
// the sum, kRowSkipped: zeros, kRowPadding: nothing; padding rows are trailing, so they never feed
// an earlier row's sum).
#include <algorithm>
#include <memory>
#include <string>

#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {

class PrefixSumFlatGpuMode final : public GpuMode {
 public:
  std::string name() const override { return "prefix_sum_flat"; }
  bool whole_step() const override { return true; }
  void forward(const GpuStep& step) const override {
    const int64_t n = step.fixed ? step.num_tokens : std::clamp<int64_t>(step.num_decode_tokens, 0, step.num_tokens);
    AffineScanParams p;
    p.kind = AffineKind::kSum;
    p.hidden = step.hidden;
    p.contribution = step.contribution;
    p.width = step.hidden_size;
    p.single_begin = 0;
    p.single_end = static_cast<int32_t>(n);
    p.row_flags = step.fixed ? step.active : nullptr;
    launch_affine_scan(p, step.context->stream());
    if (step.fixed) {
      launch_zero_rows(step.contribution, step.hidden_size, 0, step.num_tokens, step.active, ZeroRows::kSkipped,
                       step.context->stream());
    } else {
      launch_zero_rows(step.contribution, step.hidden_size, n, step.num_tokens, nullptr, ZeroRows::kSkipped,
                       step.context->stream());
    }
  }
};

}  // namespace

std::unique_ptr<GpuMode> make_prefix_sum_flat_gpu_mode() { return std::make_unique<PrefixSumFlatGpuMode>(); }

}  // namespace hybridtb::cuda::ssm
