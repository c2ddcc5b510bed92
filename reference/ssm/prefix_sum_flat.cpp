// ssm_mode "prefix_sum_flat": the seed prototype's prefix-sum rule (HybridSSMAdapter with
// VLLM_HYBRID_SSM_MODE=prefix_sum, vLLM semantics notes §5.2), kept to replay batches captured
// from that prototype. Its backend always calls the adapter's *decode* branch, which computes
//   contribution[t] = Σ_{j ≤ t} hidden[j]   for t < num_decode_tokens (the Mamba metadata's count),
//   contribution[t] = 0                     for every later token,
// one cumsum over the flattened token axis. Quirks, all kept on purpose:
//   - it ignores request boundaries: a request's rows include every earlier request's tokens;
//   - prefill tokens (they follow the decodes) get 0, since n = num_decode_tokens;
//   - it keeps no state: nothing carries over between steps;
//   - KNOWINGLY DIFFERS in precision only: the prototype's cumsum ran in the tensor dtype (bf16
//     accumulation); ours is float64 from the exact inputs (ground truth), rounded once on store.
// Checked by tests/ssm/simple_modes_test.cpp.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::reference::ssm {
namespace {

class PrefixSumFlatMode final : public Mode {
 public:
  std::string name() const override { return "prefix_sum_flat"; }

  // Never called: the rule is not per request (forward_whole_step below does the step).
  void advance(const Weights& /*weights*/, State& /*state*/, const Matrix& /*x*/, Matrix& /*y*/,
               bool /*decode*/) const override {
    throw Error("ssm_mode prefix_sum_flat runs whole steps; Mode::advance is not defined for it");
  }

  bool forward_whole_step(const MambaAttentionMetadata& metadata, const Matrix& hidden,
                          Matrix& contribution) const override {
    const int64_t n = std::min<int64_t>(metadata.num_decode_tokens, hidden.rows());
    Eigen::RowVectorXd sum = Eigen::RowVectorXd::Zero(hidden.cols());
    for (int64_t t = 0; t < n; ++t) {
      sum += hidden.row(t);
      contribution.row(t) = sum;
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<Mode> make_prefix_sum_flat_mode() { return std::make_unique<PrefixSumFlatMode>(); }

}  // namespace hybridtb::reference::ssm
