// The GPU Gated DeltaNet (ssm_mode gdn, reference/ssm/gdn.cpp + gdn_core.h): the core launcher a
// per-layer hybrid backend calls on its own (launch_gdn_core: conv + SiLU, L2-normalised q and k,
// gates, the gated delta rule; defined in gdn.cpp) and the kernels under it: the per-token
// preparation, the bandwidth-bound single-token decode update and the gated RMSNorm of the mode
// (gdn_kernels.cu), the chunked WY prefill (chunk 64, gdn_prefill.cu). C++17, no CUDA headers beyond
// the runtime's API; every launcher checks its launch and throws hybridtb::Error on failure.
//
// Shapes (Hk key heads of dk, Hv value heads of dv, value head h reads key head h / (Hv/Hk)):
//   mixed_qkv [T, conv_dim = 2·Hk·dk + Hv·dv]  q_all | k_all | v_all, before the conv
//   a, b      [T, Hv]                          the decay's input and β's logit
//   o         [T, Hv·dv]                       the delta rule's read-out, value head major
//   pools     conv_state [slots, conv_dim, K−1] (oldest first), recurrent_state [slots, Hv, dv, dk]
//             (V-major: row v of value head h is contiguous in k, as vLLM/SGLang/FlashInfer store it)
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ssm/ssm_params.h"

namespace hybridtb::cuda::ssm {

struct GpuStep;  // ssm_gpu_mode.h (C++20; launch_gdn_core is defined in gdn.cpp)

// --- the core launcher ------------------------------------------------------------------------------

// Device inputs and output of the GDN core for the step's rows [0, step.num_tokens), of any float kind.
struct GdnCoreIo {
  RowsRef mixed_qkv;  // [T, ≥ conv_dim] before the conv, any float kind (the conv widens it on load)
  RowsRef a;  // [T, ≥ Hv] the decay's input, any float kind (widened on load)
  RowsRef b;  // [T, ≥ Hv] β's logit, any float kind
  // [T, ≥ Hv·dv] the read-out, rounded once to o.kind (float32 scratch, or a linear layer's output
  // rows themselves): written for the tokens of the step's requests, other rows untouched.
  RowsRef o;
};

// Runs the GDN core over every wave of `step` (eager or fixed, ssm_gpu_mode.h): per wave the conv
// front end (causal_conv.h: conv-state stash, conv + SiLU, final and block-boundary conv states),
// the per-token preparation, then the decodes' single-step update and the prefills' chunked form,
// writing o for the wave's tokens and recurrent_state to the write slots (and, mamba_cache_mode
// all, to the block-boundary slots). Sizes from step.config->ssm_params (num_k_heads, num_v_heads,
// head_k_dim, head_v_dim, conv_kernel); weights conv1d_weight, conv1d_bias (optional), A_log,
// dt_bias from step.weights; pools conv_state and recurrent_state from step.pools. Scratch from
// step.scratch() only; a fixed step uploads nothing. Call check_gdn_supported first.
void launch_gdn_core(const GpuStep& step, const GdnCoreIo& io);

// Throws NotSupported naming the limit for sizes the kernels do not take (below).
void check_gdn_supported(const GpuStep& step);

inline constexpr int kGdnMaxHeadDim = 128;  // head_k_dim, head_v_dim ≤ 128 (Qwen3-Next: 128)
inline constexpr int kGdnChunk = 64;        // tokens per chunk of the WY prefill (fla's chunk size)
// Elements of one chunk's W or k̂ tile in the prefill state pass's fragment order (GdnParams::w_frag):
// kGdnChunk × kGdnMaxHeadDim whatever dk, each gdn_scratch_element_bytes (32 KiB float32, 16 KiB
// 16-bit).
inline constexpr int kGdnFragTileElements = kGdnChunk * kGdnMaxHeadDim;
// Bytes of one element of the prefill's W, k̂ and entry-state scratch (GdnParams::w_frag, k_frag, h)
// for product operands `product_operands` (GdnParams::product_operands): float32 (4) with float32
// operands; with 16-bit operands the operand dtype's 2, the values stored already rounded to it (their
// only readers are the products, which round them to it anyway).
inline constexpr size_t gdn_scratch_element_bytes(ElementKind product_operands) {
  return product_operands == ElementKind::kFloat32 ? sizeof(float) : 2;
}

// Elements per row (value channel) of the prefill's entry-state scratch (GdnParams::h): float32
// operands, dk, the columns in order; 16-bit operands, dk rounded up to 16, each group of 16 columns
// c … c + 15 stored in the order c, c + 4, c + 8, c + 12, c + 1, c + 5, … (element c + k at
// 4·(k % 4) + k / 4: a lane's four B values of an m16n8k16 k slice, one 8-byte load), zeros past dk.
inline constexpr int gdn_entry_state_row(int dk, ElementKind product_operands) {
  return product_operands == ElementKind::kFloat32 ? dk : (dk + 15) / 16 * 16;
}

// --- the kernels ------------------------------------------------------------------------------------

// A piece of ≤ kGdnChunk consecutive tokens of one prefill request. Chunks end at kGdnChunk tokens,
// at every block-boundary token (mamba_cache_mode all: the state after it is written, so it must be
// a chunk's last token) and at the request's end; a request's chunks are consecutive in the list.
struct GdnChunk {
  int32_t request = 0;  // index in the wave
  int32_t begin = 0;    // token rows [begin, end)
  int32_t end = 0;
  int32_t unused = 0;
};

// A prefill request of the wave and its chunks [first_chunk, first_chunk + num_chunks).
struct GdnPrefill {
  int32_t request = 0;  // index in the wave
  int32_t first_chunk = 0;
  int32_t num_chunks = 0;
  int32_t unused = 0;
};

struct GdnParams {
  int32_t Hk = 0, Hv = 0, dk = 0, dv = 0;
  int64_t num_tokens = 0;  // T
  WaveRef wave;
  // The wave's decodes are entries [0, decode_end) (the driver lists them first; a fixed step: every
  // entry, empty ones skipped); the decode kernel skips entries that are not one-token decodes.
  int32_t decode_end = 0;
  // The wave's prefills, their chunks (eager only; device arrays in the step's scratch).
  const GdnPrefill* prefills = nullptr;
  int32_t num_prefills = 0;
  const GdnChunk* chunks = nullptr;
  int32_t num_chunks = 0;
  const int32_t* boundary_slot = nullptr;  // [T] −1, or the slot the state after row t goes to (eager)
  // Activations (float32).
  float* qkv = nullptr;  // [T, conv_dim] conv output after SiLU; q and k normalised in place
  RowsRef a, b;  // [T, ≥ Hv] any float kind
  float* g = nullptr;     // [T, Hv] log decay −exp(A_log)·softplus(a + dt_bias)
  float* beta = nullptr;  // [T, Hv] sigmoid(b)
  RowsRef o;              // [T, ≥ Hv·dv] any float kind (rounded once on store)
  // Chunk scratch (prefills), per token row t and value head h:
  // [T, Hv, dv] U = (I + A)^-1·diag(β)·V; with float32 operands replaced by V_new = U − W·Mᵀ (state pass)
  float* u = nullptr;
  // [T, Hv, kGdnChunk] row i of the chunk: P_ij = (q̂_i·k̂_j)·e^(G_i − G_j), j ≤ i (else 0); float32
  // operands only (16-bit: attn_frag)
  float* attn = nullptr;
  float* gcum = nullptr;   // [T, Hv] G_i: the in-chunk inclusive cumsum of g
  // The elements of h, w_frag and k_frag are gdn_scratch_element_bytes(product_operands) wide: float32
  // with float32 operands, else the operand dtype (float16 / bfloat16, rounded to nearest even).
  // [num_chunks, Hv, dv, gdn_entry_state_row] each chunk's entry state M (V-major; 64 KiB float32 or
  // 32 KiB 16-bit per chunk and value head at dk = dv = 128): written by the state pass, read by the
  // output pass.
  void* h = nullptr;
  // Per chunk (the index in `chunks`), kGdnFragTileElements each: W = (I + A)^-1·diag(β·e^G)·K of each
  // value head, [num_chunks, Hv], and k̂ of each key head, [num_chunks, Hk], in the state pass's mma
  // fragment order (written by the intra kernel; the state pass copies each tile whole).
  void* w_frag = nullptr;
  void* k_frag = nullptr;
  // With 16-bit operands only (else unused): V_new = U − W·Mᵀ rounded to the operand dtype, per chunk,
  // value head and value channel the chunk's kGdnChunk tokens in order, [num_chunks, Hv, dv, kGdnChunk]
  // (zeros past the chunk's last token); written by the state pass, read by the output pass, whose
  // product rounds V_new to that dtype anyway (16 KiB per chunk and value head at dv = 128).
  void* v_new = nullptr;
  // With 16-bit operands only: the output pass's A operands, rounded to the operand dtype and laid out
  // in its fragment order (gdn_prefill.cu: chunk_output_kernel), written by the intra kernel — q̂ per
  // chunk and key head, kGdnFragTileElements each, [num_chunks, Hk]; P per chunk and value head,
  // kGdnChunk² each, [num_chunks, Hv] (8 KiB: the 16×16 blocks on and below the diagonal).
  void* q_frag = nullptr;
  void* attn_frag = nullptr;
  // Weights and the state pool.
  WeightRef A_log, dt_bias;
  PoolRef recurrent_state;
  // The operands of the prefill kernels' products: kFloat32 = float32 operands in 3xTF32
  // (float32-accurate); kFloat16 / kBFloat16 = operands rounded to that dtype (the model's: q̂, k̂,
  // and the float32 intermediates: the in-chunk inverse T and the right-hand sides of W and U, W,
  // V_new·decay, P, the entry states rounded as they enter a product), one m16n8k16 product per 16
  // of k with float32 accumulation, as vLLM's / fla's Triton kernels. The inverse T itself, the
  // decays, the gates and the state carried across chunks stay float32 either way (gdn_prefill.cu).
  ElementKind product_operands = ElementKind::kFloat32;
  // With 16-bit operands, 1: the state pass on Hopper's warpgroup MMAs (gdn_state_wgmma.cu), which
  // needs a compute capability 9.0 device and a build with its sm_90a code (gdn_wgmma_built); the
  // caller decides once per device (gdn.cpp: the SsmContext's compute capability and
  // BackendSettings::ssm_prefill_wgmma), so that a launch makes no device query. Then the intra
  // kernel writes the w_frag and k_frag tiles in wgmma's 128-byte swizzle layout (gdn_sw128_byte)
  // instead of the mma.sync fragment order; the other buffers are the same. 0: mma.sync (every GPU).
  int32_t state_wgmma = 0;
};

// Whether this build has the sm_90a state pass on wgmma (CMAKE_CUDA_ARCHITECTURES with 90: the TU
// of hybridtb_gdn_wgmma), which GdnParams::state_wgmma selects.
bool gdn_wgmma_built();

// Byte offset of element (row, col) of a W or k̂ tile of the wgmma state pass: [kGdnChunk tokens]
// [kGdnMaxHeadDim columns] of 16-bit elements in wgmma's 128-byte swizzle layout (common/wgmma.cuh:
// two slabs of 64 columns, [64 rows][128 bytes] each; 16-byte chunk c of a row r at
// r·128 + (c ^ r % 8)·16 within its slab), kGdnFragTileElements elements in all.
__host__ __device__ constexpr int gdn_sw128_byte(int row, int col) {
  return (col / 64) * kGdnChunk * 128 + row * 128 + ((((col % 64) / 8) ^ (row % 8)) << 4) + (col % 8) * 2;
}

// Columns of mixed_qkv and of the conv output qkv: q_all | k_all | v_all.
__host__ __device__ inline int gdn_conv_dim(const GdnParams& p) { return 2 * p.Hk * p.dk + p.Hv * p.dv; }

// Per token of the wave's requests: q and k of each key head L2-normalised (1e-6 inside the square
// root, as fla's l2norm_fwd), q times dk^-1/2, in place in qkv; g and β per value head. Two grids:
// the decode entries [0, decode_end) (one token each; empty entries skipped) and the prefill list
// (wave.max_tokens × num_prefills); a fixed step's grid from num_requests only.
void launch_gdn_prepare(const GdnParams& p, cudaStream_t stream);
// Decodes (entries [0, decode_end) that are one-token decodes), bandwidth-bound: each value head's
// [dv, dk] state read and written once, row by row — decay, predict, correct, read (the reference's
// delta_rule_step) — in 16-byte accesses where the pool allows. Grid from Hv, dv and decode_end only.
void launch_gdn_decode(const GdnParams& p, cudaStream_t stream);
// Prefills (chunked WY form, tensor-core products with p.product_operands: 3xTF32, or 16-bit
// operands with float32 accumulation): the intra-chunk kernel (per chunk × value
// head: A, the inverse T = (I + A)^-1, W and k̂ in the state pass's fragment order, U, the masked decayed
// q·k), the state pass (per prefill × value head × tile of 8, 16 or 32 state rows: sequential over
// the request's chunks, writing V_new (over U; with 16-bit operands rounded, to v_new), each chunk's
// entry state to h, the block-boundary states and the final state; on wgmma where p.state_wgmma is
// set) and the output pass (per chunk × value head: o).
void launch_gdn_prefill(const GdnParams& p, cudaStream_t stream);

// The mode's gated RMSNorm, per row t flagged kRowActive and value head h:
//   y[t, h·dv + i] = o_i / sqrt(mean(o²) + eps) · norm_weight[i] · silu(z[t, h·dv + i])   (eps: the layer's norm eps)
// z rows z_stride apart; rows not flagged kRowActive are not written.
void launch_gdn_gated_norm(const float* o, const float* z, int64_t z_stride, WeightRef norm_weight, float* y,
                           int32_t Hv, int32_t dv, int64_t num_tokens, const int32_t* flags, float eps,
                           cudaStream_t stream);

}  // namespace hybridtb::cuda::ssm
