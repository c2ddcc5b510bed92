// The per-request plan of an SSM step: for each decode and prefill request, its token rows, the
// state slot it starts from (or zeros), the block-boundary slots it writes (mamba_cache_mode all)
// and the slot of its final state — vLLM's rules (vllm-semantics notes §3–§4, reference/ssm/
// README.md) read off the Mamba metadata. Plain host integers, shared by the reference driver
// (reference/ssm/ssm_driver.cpp) and the CUDA backend's driver (optimized/src/ssm/ssm_driver.cpp),
// so both backends interpret the metadata through one piece of code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/metadata.h"

namespace hybridtb::spec::ssm {

// One entry of a state-index array, named for error messages ("mamba/state_indices_tensor_d[3][0]").
struct Slot {
  int64_t index = 0;
  std::string field;
};

// What the driver does for one request of the step.
struct RequestPlan {
  int64_t request = 0;
  int64_t begin = 0;  // token rows [begin, end) of the step
  int64_t end = 0;
  int64_t first_position = 0;  // absolute position of row `begin` (the request's context_len)
  bool decode = false;
  std::optional<Slot> read;  // the initial state; absent: start from zeros
  // Mode all: (absolute position p, slot) — after the token at p, with (p + 1) % block == 0.
  std::vector<std::pair<int64_t, Slot>> boundary_writes;
  Slot final_write;
};

// Checks that a step can be planned request by request, before any plan: `who` (e.g. "ssm_mode
// mamba1") without speculative decoding (NotSupported: a decode would advance several tokens and
// write per-token states), and Mamba metadata whose decodes + prefills are the batch's requests
// (Error otherwise).
void check_plannable_step(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                          const BatchDescription& batch, const std::string& who);

// Request r (< num_decodes) of the step. Throws Error naming the metadata field on a missing or
// out-of-range entry.
RequestPlan plan_decode(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                        const BatchDescription& batch, int64_t r);
// Prefill i (request num_decodes + i) of the step.
RequestPlan plan_prefill(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                         const BatchDescription& batch, int64_t i);
// Every slot a plan touches (read, boundary writes, final write).
std::vector<const Slot*> slots_of(const RequestPlan& plan);
// True when the engine's kernels skip the request: one of its slots is a padding index under the
// config's engine rules (engine_rules.h: index < 0, or index <= 0 from vLLM 0.33 on, where padding
// requests get NULL_BLOCK_ID 0). A skipped request reads and writes no state and contributes zeros.
// Both backends decide with this one function.
bool skips_request(const AttentionConfig& config, const RequestPlan& plan);

}  // namespace hybridtb::spec::ssm
