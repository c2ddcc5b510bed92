// ssm_mode "zero": contributes zeros and keeps no state or weights — the seed adapter's default
// (VLLM_HYBRID_SSM_MODE unset, "disabled"), so a hybrid layer's output is its attention output.
// It runs whole steps, so it works with every batch the builders accept (speculative decodes
// included). Checked by tests/ssm/simple_modes_test.cpp.
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::reference::ssm {
namespace {

class ZeroMode final : public Mode {
 public:
  std::string name() const override { return "zero"; }

  void advance(const Weights& /*weights*/, State& /*state*/, const Matrix& x, Matrix& y,
               bool /*decode*/) const override {
    y.setZero(x.rows(), x.cols());
  }

  // The driver zero-fills the contribution; there is nothing to add.
  bool forward_whole_step(const MambaAttentionMetadata& /*metadata*/, const Matrix& /*hidden*/,
                          Matrix& /*contribution*/) const override {
    return true;
  }
};

}  // namespace

std::unique_ptr<Mode> make_zero_mode() { return std::make_unique<ZeroMode>(); }

}  // namespace hybridtb::reference::ssm
