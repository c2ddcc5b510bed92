// The chunk states of the mamba2 prefill on Hopper's warpgroup MMAs (mamba2_state_wgmma.cu: sm_90a
// code, built when 90 is among the CUDA architectures, HYBRIDTB_MAMBA2_WGMMA): the 16-bit-operand
// kind only. mamba2_kernels.cu launches it where Mamba2Params::chunk_wgmma is set (a compute
// capability 9.0 device: the caller decides once per device) and its mma.sync chunk states
// otherwise; both read and write the same buffers.
#pragma once

#include <cuda_runtime.h>

#include "ssm/mamba2_kernels.h"

namespace hybridtb::cuda::ssm {

// Each chunk's own state sum (chunk_states) with product operands p.product_operands (kFloat16 or
// kBFloat16), after chunk_cumsum. Device: compute capability 9.0.
void launch_mamba2_chunk_state_wgmma(const Mamba2Params& p, cudaStream_t stream);

// The chunk states and the state passing in one launch (chunk_state_pass_wgmma_kernel): the states
// entering each chunk into chunk_states16, the boundary and final states into the pool, bitwise
// what launch_mamba2_chunk_state_wgmma and the state passing write there, without chunk_states.
// Device: compute capability 9.0; p as mamba2_fused_state_pass takes it.
void launch_mamba2_state_pass_wgmma(const Mamba2Params& p, cudaStream_t stream);

}  // namespace hybridtb::cuda::ssm
