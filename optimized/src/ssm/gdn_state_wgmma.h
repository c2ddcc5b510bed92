// The state pass of the GDN prefill on Hopper's warpgroup MMAs (gdn_state_wgmma.cu: sm_90a code,
// built when 90 is among the CUDA architectures, HYBRIDTB_GDN_WGMMA): the 16-bit-operand kind only.
// gdn_prefill.cu launches it where GdnParams::state_wgmma is set (a compute capability 9.0 device:
// the caller decides once per device) and its mma.sync state pass otherwise; both read and write
// the same buffers, but for the layout of the W and k̂ tiles (gdn_sw128_byte here).
#pragma once

#include <cuda_runtime.h>

#include "ssm/gdn_kernels.h"

namespace hybridtb::cuda::ssm {

// The state pass of the wave's prefills with product operands p.product_operands (kFloat16 or
// kBFloat16), after the intra kernel. Device: compute capability 9.0.
void launch_gdn_state_wgmma(const GdnParams& p, cudaStream_t stream);

}  // namespace hybridtb::cuda::ssm
