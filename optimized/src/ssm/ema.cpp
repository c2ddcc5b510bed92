// GPU ssm_mode "ema" (reference/ssm/ema.cpp, the guide's example): per request and channel,
// h ← a·h + (1 − a)·x per token, contribution h, state h. The affine column scan of
// ssm_kernels.h (lanes scan sub-chunks, compose (Π a, local h) in order, rescan), float32. A fixed
// decode step is one wave of all R requests of at most one token each (empty entries skipped).
#include <memory>
#include <string>

#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {

class EmaGpuMode final : public GpuMode {
 public:
  std::string name() const override { return "ema"; }
  void forward(const GpuStep& step) const override {
    for (const GpuWave& wave : step.waves) {
      AffineScanParams p;
      p.kind = AffineKind::kEma;
      p.hidden = step.hidden;
      p.contribution = step.contribution;
      p.width = step.hidden_size;
      p.wave = wave.device;
      p.pool = step.pools.at("state");
      p.boundary_slot = step.boundary_slot;
      p.decay = step.weight_ref("a");
      launch_affine_scan(p, step.context->stream());
    }
  }
};

}  // namespace

std::unique_ptr<GpuMode> make_ema_gpu_mode() { return std::make_unique<EmaGpuMode>(); }

}  // namespace hybridtb::cuda::ssm
