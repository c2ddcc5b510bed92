// ssm_mode "ema": an exponential moving average of each request's hidden states with a learned
// per-channel decay — the example mode of reference/ssm/README.md ("Adding a mode"). Per token,
//   h ← a ⊙ h + (1 − a) ⊙ x,   contribution = h,
// with h the request's state (zeros without initial state). Weight `a` [H], drawn uniform in
// [0.5, 0.99); state pool `state` float32 [num_slots, H]. Checked by tests/ssm.
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::reference::ssm {
namespace {

class EmaMode final : public Mode {
 public:
  std::string name() const override { return "ema"; }

  void advance(const Weights& weights, State& state, const Matrix& x, Matrix& y, bool /*decode*/) const override {
    const Eigen::RowVectorXd a = weights.at("a").row(0);  // a 1-d weight arrives as one row
    Eigen::RowVectorXd h = state.at("state").transpose();
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      h = a.cwiseProduct(h) + (1.0 - a.array()).matrix().cwiseProduct(x.row(t));
      y.row(t) = h;
    }
    state.at("state") = h.transpose();
  }
};

}  // namespace

std::unique_ptr<Mode> make_ema_mode() { return std::make_unique<EmaMode>(); }

}  // namespace hybridtb::reference::ssm
