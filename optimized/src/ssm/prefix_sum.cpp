// GPU ssm_mode "prefix_sum" (reference/ssm/prefix_sum.cpp): per request, contribution[t] = the
// saved sum + Σ of its hidden states up to t; the slot (and, mode all, each block-boundary slot)
// receives the running sum. A segmented scan per request, parallel over tokens (the affine column
// scan of ssm_kernels.h with gain 1), float32 accumulation. A fixed decode step is one wave of all
// R requests of at most one token each (empty entries skipped): grid from H and R only.
#include <memory>
#include <string>

#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {

class PrefixSumGpuMode final : public GpuMode {
 public:
  std::string name() const override { return "prefix_sum"; }
  void forward(const GpuStep& step) const override {
    for (const GpuWave& wave : step.waves) {
      AffineScanParams p;
      p.kind = AffineKind::kSum;
      p.hidden = step.hidden;
      p.contribution = step.contribution;
      p.width = step.hidden_size;
      p.wave = wave.device;
      p.pool = step.pools.at("state");
      p.boundary_slot = step.boundary_slot;
      launch_affine_scan(p, step.context->stream());
    }
  }
};

}  // namespace

std::unique_ptr<GpuMode> make_prefix_sum_gpu_mode() { return std::make_unique<PrefixSumGpuMode>(); }

}  // namespace hybridtb::cuda::ssm
