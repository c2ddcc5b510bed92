// ssm_mode "prefix_sum": a per-request running sum of the hidden states — the sensible version of
// the seed's prefix_sum (prefix_sum_flat.cpp). For a request whose state before the step is s,
//   contribution[t] = s + Σ of the request's hidden states of this step up to and including t,
// and its slot is written with the new sum. Requests without initial state start from zero;
// chunked prefill and decodes continue it. State pool `state` float32 [num_slots, num_heads,
// head_size] (the query's head layout). Checked by tests/ssm/simple_modes_test.cpp.
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::reference::ssm {
namespace {

class PrefixSumMode final : public Mode {
 public:
  std::string name() const override { return "prefix_sum"; }

  void advance(const Weights& /*weights*/, State& state, const Matrix& x, Matrix& y, bool /*decode*/) const override {
    Eigen::VectorXd& sum = state.at("state");  // [num_heads · head_size], head-major like a hidden row
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      sum += x.row(t).transpose();
      y.row(t) = sum.transpose();
    }
  }
};

}  // namespace

std::unique_ptr<Mode> make_prefix_sum_mode() { return std::make_unique<PrefixSumMode>(); }

}  // namespace hybridtb::reference::ssm
