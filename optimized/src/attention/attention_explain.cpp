// The cuda backend's plan of a step as text (`hybridtb run --explain`): the host planner alone
// (attention_work_plan.h), with no kernel run and no device memory touched; a GPU, if present, only
// gives its SM count.
#include <cuda_runtime_api.h>

#include <limits>
#include <sstream>

#include "attention/attention_caps.h"
#include "attention/attention_plan.h"
#include "attention/attention_work_plan.h"
#include "hybridtb/backend.h"

namespace hybridtb::cuda {

namespace {

// The split sizes depend on the SM count, the prefill variant on the compute capability: this
// machine's GPU's, else an H100 SXM's.
constexpr int kAssumedSms = 132;

struct DeviceFacts {
  int sms = kAssumedSms;
  bool hopper = true;  // compute capability 9.0
  std::string source = "assumed, an H100 SXM: no CUDA device here";
};

DeviceFacts device_facts() {
  DeviceFacts facts;
  int count = 0;
  int sms = 0;
  int major = 0;
  int minor = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0 &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess && sms > 0 &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess) {
    facts.sms = sms;
    facts.hopper = major == 9 && minor == 0;
    facts.source = "this machine's GPU 0";
    return facts;
  }
  cudaGetLastError();  // clear the sticky "no device" error
  return facts;
}

}  // namespace

std::string explain_attention_step(const BackendSettings& settings, const BatchDescription& batch,
                                   const HybridMetadata& metadata) {
  const AttentionConfig& c = settings.attention;
  std::ostringstream out;
  if (c.is_linear_layer()) {
    out << "layer_kind " << to_string(c.layer_kind)
        << ": no attention to plan (the linear-attention core takes every row the same way)\n";
    return out.str();
  }
  const DeviceFacts device = device_facts();
  AttentionPlanInput in;
  in.config = &c;
  in.batch = &batch;
  in.num_sms = device.sms;
  in.hopper_wgmma = device.hopper && prefill_wgmma_built();
  in.routes = route_layer(c, AttentionPathOverrides{}, TensorLayoutFacts{});
  in.engine = &metadata.attention;
  check_attention_batch(c, batch, nullptr);
  if (c.attn_type != AttnType::kEncoderOnly) referenced_blocks(c, batch, std::numeric_limits<int64_t>::max());
  const AttentionPlan plan = plan_attention(in);
  out << "SMs: " << in.num_sms << ", compute capability " << (device.hopper ? "9.0" : "other than 9.0") << " ("
      << device.source << ")\n"
      << "tensors: contiguous and 16-byte aligned, as the backend allocates them\n"
      << describe_plan(plan, c);
  return out.str();
}

}  // namespace hybridtb::cuda
