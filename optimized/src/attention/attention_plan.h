// The attention planner/runner: checks one call's inputs, splits the batch into decode-path and
// tensor-core prefill and generic-path work (plain host integers, like vLLM's metadata), uploads it in one copy and
// launches the kernels. Host-only. prepare() and launch() are separate so that benchmarks can time
// the kernels alone (launch() may be repeated; it reads only what prepare() uploaded).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/attention_params.h"
#include "common/device_memory.h"
#include "hybridtb/batch.h"
#include "hybridtb/config.h"

namespace hybridtb::cuda {

struct AttentionPlanSummary {
  int64_t decode_rows = 0;     // rows on the decode fast path
  int64_t decode_ctas = 0;     // their CTAs along the key axis (× kv heads × head passes in the grid)
  int64_t split_rows = 0;      // decode rows split across CTAs (finished by the combine kernel)
  int64_t decode_mma_rows = 0;  // of decode_rows: on the tensor-core decode kernel (the rest: SIMT)
  int64_t decode_mma_ctas = 0;  // of decode_ctas: the tensor-core kernel's
  std::string decode_fallback;  // why decode rows took the SIMT decode kernel ("" if none did)
  int64_t prefill_rows = 0;    // query rows (tokens) on the tensor-core prefill path
  int64_t prefill_items = 0;   // CTAs of the prefill kernel
  std::string prefill_fallback;  // why non-decode rows took the generic path ("" if none did)
  int64_t generic_items = 0;   // CTAs of the generic kernel
  int64_t generic_rows = 0;    // query rows on the generic path
  std::string describe() const;
};

ElementKind element_kind(DType dtype);

class AttentionRunner {
 public:
  AttentionRunner(const AttentionConfig& config, DeviceMemory& memory, int num_sms);

  void prepare(const BatchDescription& batch, const StepTensors& tensors, const TensorView& output,
               cudaStream_t stream);
  void launch(cudaStream_t stream) const;
  const AttentionPlanSummary& summary() const { return summary_; }

  // Tunables (benchmarks may override): decode keys per split are chosen so that the decode grid
  // has about `decode_ctas_per_sm` CTAs per SM, within [min, max] keys.
  int64_t decode_ctas_per_sm = 16;
  int64_t decode_min_split_keys = 256;
  int64_t decode_max_split_keys = 8192;
  // The tensor-core decode kernel's split policy (its CTAs stream faster: fewer per SM resident).
  int64_t decode_mma_ctas_per_sm = 8;
  int64_t decode_mma_min_split_keys = 256;
  bool disable_decode_mma = false;  // tests/benchmarks: decode rows on the SIMT decode kernel
  bool force_generic = false;  // tests: run every row on the generic kernel
  bool disable_prefill = false;  // benchmarks/tests: keep non-decode rows on the generic kernel
  int prefill_variant = -1;      // benchmarks: tile variant of the prefill kernel (-1: the default for D)

 private:
  AttentionConfig config_;
  DeviceMemory& memory_;
  int num_sms_;
  Workspace meta_;
  Workspace partials_;
  std::shared_ptr<void> alibi_;
  std::shared_ptr<void> sinks_;
  std::vector<unsigned char> staging_;
  AttentionParams params_{};
  int64_t num_generic_ = 0;
  int64_t num_prefill_ = 0;
  int prefill_variant_used_ = 0;
  int64_t num_decode_ = 0;
  int64_t num_decode_mma_ = 0;
  const DecodeItem* decode_mma_items_ = nullptr;
  int64_t num_combine_ = 0;
  int heads_per_pass_ = 1;
  int block_shift_ = -1;
  AttentionPlanSummary summary_;
};

}  // namespace hybridtb::cuda
