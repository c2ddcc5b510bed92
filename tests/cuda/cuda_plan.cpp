// The attention planner's split of a step (see cuda_plan.h).
#include "cuda_plan.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "attention/attention_caps.h"
#include "common/device_memory.h"
#include "cuda_compare.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"

namespace hybridtb::testing {

cuda::AttentionPlanSummary plan_of(const BatchFile& step, const cuda::AttentionPathOverrides& overrides) {
  const AttentionConfig& c = step.config;
  const int64_t t = step.batch.num_tokens();
  const int64_t hq = c.num_heads;
  const int64_t hkv = c.num_kv_heads;
  const int64_t d = c.head_size;
  cuda::DeviceMemory memory;
  const auto bytes = [](DType dtype, int64_t n) { return static_cast<size_t>(n) * element_size(dtype); };
  auto q = memory.allocate(bytes(c.dtype, t * hq * d));
  auto o = memory.allocate(bytes(c.dtype, t * hq * d));
  StepTensors tensors;
  tensors.query = TensorView(q.get(), c.dtype, {t, hq, d}, Device::kCuda);
  const TensorView output(o.get(), c.dtype, {t, hq, d}, Device::kCuda);
  std::shared_ptr<void> k, v, cache, ks, vs;
  if (c.attn_type == AttnType::kEncoderOnly) {
    k = memory.allocate(bytes(c.dtype, t * hkv * d));
    v = memory.allocate(bytes(c.dtype, t * hkv * d));
    tensors.key = TensorView(k.get(), c.dtype, {t, hkv, d}, Device::kCuda);
    tensors.value = TensorView(v.get(), c.dtype, {t, hkv, d}, Device::kCuda);
  } else {
    const DType storage = kv_storage_dtype(c.kv_cache_dtype, c.dtype);
    const int64_t nb = step.inputs.kv_cache.size(0);
    cache = memory.allocate(bytes(storage, nb * 2 * c.block_size * hkv * d));
    tensors.kv_cache = TensorView(cache.get(), storage, {nb, 2, c.block_size, hkv, d}, Device::kCuda);
    if (is_per_token_head(c.kv_cache_dtype)) {
      ks = memory.allocate(bytes(DType::kFloat32, nb * c.block_size * hkv));
      vs = memory.allocate(bytes(DType::kFloat32, nb * c.block_size * hkv));
      tensors.k_scale_cache = TensorView(ks.get(), DType::kFloat32, {nb, c.block_size, hkv}, Device::kCuda);
      tensors.v_scale_cache = TensorView(vs.get(), DType::kFloat32, {nb, c.block_size, hkv}, Device::kCuda);
    }
  }
  tensors.k_scale = step.inputs.k_scale;
  tensors.v_scale = step.inputs.v_scale;
  if (step.inputs.output_scale) tensors.output_scale = step.inputs.output_scale;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) sms = 1;
  cuda::AttentionRunner runner(c, memory, sms, overrides);
  runner.prepare(step.batch, tensors, output, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw Error("plan_of: cudaDeviceSynchronize failed");
  return runner.summary();
}

std::string wgmma_prefill_unavailable() {
  if (!cuda::prefill_wgmma_built()) return "this build has no sm_90a code (the wgmma prefill variant)";
  int major = 0;
  int minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), "cudaDeviceGetAttribute");
  if (major != 9 || minor != 0) {
    return "the wgmma prefill variant needs a compute capability 9.0 device, this one is " + std::to_string(major) +
           "." + std::to_string(minor);
  }
  return "";
}

}  // namespace hybridtb::testing
