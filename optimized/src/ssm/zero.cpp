// GPU ssm_mode "zero" (reference/ssm/zero.cpp): contributes zeros, no state; whole steps. In a
// fixed decode step every row but the CUDA-graph padding rows (flag kRowPadding) gets zeros.
#include <memory>
#include <string>

#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {

class ZeroGpuMode final : public GpuMode {
 public:
  std::string name() const override { return "zero"; }
  bool whole_step() const override { return true; }
  void forward(const GpuStep& step) const override {
    launch_zero_rows(step.contribution, step.hidden_size, 0, step.num_tokens, step.fixed ? step.active : nullptr,
                     ZeroRows::kAllButPadding, step.context->stream());
  }
};

}  // namespace

std::unique_ptr<GpuMode> make_zero_gpu_mode() { return std::make_unique<ZeroGpuMode>(); }

}  // namespace hybridtb::cuda::ssm
