// Launchers of the mamba2 GPU mode's kernels (mamba2_kernels.cu): the single-step decode update,
// the chunked SSD prefill (chunk states, state passing, chunk scan) and the gated RMSNorm. C++17,
// no CUDA headers beyond the runtime's stream type; every launcher checks its launch and throws
// hybridtb::Error on failure. The conv front end is causal_conv.h's; the projections gemm_rows.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ssm/ssm_params.h"

namespace hybridtb::cuda::ssm {

// Tokens per SSD chunk (at most; chunks also end at boundaries): a multiple of 64 (the chunk
// kernels' t tile). 128 (Falcon-H1's and vLLM's chunk size for it) halves the chunk states written,
// passed and read against 64, for twice the intra-chunk product.
inline constexpr int kMamba2ChunkTokens = 128;
inline constexpr int kMamba2MaxState = 256;    // state_size ≤ 256 (the decode update: ≤ 2 quads per lane)

// A chunk of the SSD prefill: ≤ kMamba2ChunkTokens consecutive token rows of one prefill request.
// The host cuts every request's rows into chunks from its first row on, also ending a chunk after
// each block-boundary row (mamba_cache_mode all), so boundary states are exactly the states
// between chunks — the ones the state passing computes anyway.
struct Mamba2Chunk {
  int32_t begin = 0;           // token rows [begin, end)
  int32_t end = 0;
  int32_t boundary_slot = -1;  // the slot receiving the state after row end − 1, or −1
  int32_t unused = 0;
};

// A prefill request of the wave as the state passing walks it: chunks [first_chunk,
// first_chunk + num_chunks), consecutive in the chunk list.
struct Mamba2Sequence {
  int32_t first_chunk = 0;
  int32_t num_chunks = 0;
  int32_t read_slot = -1;  // the initial state (−1: zeros)
  int32_t write_slot = 0;  // the state after the request's last row
};

struct Mamba2Params {
  int32_t heads = 0;     // Hs
  int32_t head_dim = 0;  // P
  int32_t state = 0;     // N
  int32_t groups = 0;    // G: head h reads the B and C of group h / (Hs / G)
  int64_t num_tokens = 0;
  // Activations: dt, the Hs columns of in_proj's output rows [z (d_ssm) | xBC (conv_dim) | dt (Hs)]
  // without its bias (or a linear layer's own dt input, of any float kind: widened on load); the
  // conv's output rows [x (d_ssm) | B (G·N) | C (G·N)], float32 dense.
  RowsRef dt;                     // [T, ≥ Hs]
  const float* xbc = nullptr;     // [T, d_ssm + 2·G·N]
  // [T, ≥ d_ssm] the SSM output with the D skip, rounded once to y.kind: float32 scratch before
  // the norm, or a linear layer's output rows themselves.
  RowsRef y;
  // Weights: in_proj_bias (optional, [2·d_ssm + 2·G·N + Hs]), dt_bias, A_log and D [Hs].
  WeightRef in_bias, dt_bias, A_log, D;
  PoolRef ssm_state;  // [slots, Hs, P, N]

  // Decode update (launch_mamba2_decode): the wave's entries with one token. decode_all: every
  // non-empty entry (a fixed decode step); else only entries flagged decode (an eager wave).
  WaveRef wave;
  int32_t decode_all = 0;
  const int32_t* boundary_slot = nullptr;  // eager: [T] −1 or the slot receiving the state after row t

  // Chunked prefill (launch_mamba2_prefill): host-planned lists (uploaded) and scratch.
  const Mamba2Chunk* chunks = nullptr;  // [num_chunks]
  int32_t num_chunks = 0;
  const Mamba2Sequence* sequences = nullptr;  // [num_sequences]
  int32_t num_sequences = 0;
  // [num_chunks, Hs, P, N]: each chunk's own state sum, then the state entering it (unless
  // chunk_states16 takes that); not used, and may be null, where mamba2_fused_state_pass(p).
  float* chunk_states = nullptr;
  float* chunk_decay = nullptr;   // [num_chunks, Hs]: exp(Σ_chunk Δ·A), the decay across the whole chunk
  // [num_chunks, Hs, 3, kMamba2ChunkTokens]: per token s of the chunk Δ_s, Λ_s (the cumulative
  // Σ Δ·A) and exp(Λ_last − Λ_s)·Δ_s; zeros past the chunk's length.
  float* chunk_cumsum = nullptr;
  float* chunk_cb = nullptr;  // [num_chunks, G, kMamba2ChunkTokens, kMamba2ChunkTokens]: C_t·B_s (s ≤ t)
  // [num_chunks, Hs, P, N] of the 16-bit product dtype, or nullptr. Where set (16-bit operands on
  // the wgmma chunk scan only), the state passing writes the state entering each chunk here,
  // rounded (RNE) as the chunk scan would round it while staging, instead of over chunk_states in
  // float32, and the wgmma chunk scan reads it from here: the same operand values with half the
  // bytes written and read back. nullptr: the entering states stay float32 in chunk_states.
  void* chunk_states16 = nullptr;
  // [num_tokens, 2·G·N] of the 16-bit product dtype, or nullptr: the conv rows' B and C (xbc's
  // columns d_ssm …) rounded (RNE) once by the C·Bᵀ kernel, for the wgmma chunk states and chunk
  // scan, which read them instead of rounding xbc's float32 B and C in every head's block (the same
  // operand values, a quarter of the bytes). Required where chunk_wgmma is set with 16-bit
  // operands; rows of prefill chunks only are written.
  void* bc16 = nullptr;
  // The operands of the chunk kernels' products (C·Bᵀ, chunk states, chunk scan): kFloat32 = float32
  // operands in 3xTF32 (float32-accurate); kFloat16 / kBFloat16 = operands rounded to that dtype (the
  // model's: x, B, C, and the float32 decayed C·Bᵀ weights, weighted x and entering states rounded
  // before the product), one m16n8k16 product per 16 of k with float32 accumulation, as vLLM's
  // Triton SSD kernels. Everything else stays float32 either way.
  ElementKind product_operands = ElementKind::kFloat32;
  // The bodies of the chunk scan and the chunk states with 16-bit product operands (float32 operands
  // ignore it): 1 = on Hopper's warpgroup MMAs (mamba2_scan_wgmma.h, mamba2_state_wgmma.h), which
  // needs a compute capability 9.0 device and a build with their sm_90a code (mamba2_wgmma_built);
  // 0 = on mma.sync (chunk_scan_kernel, chunk_state_kernel: every GPU).
  // The caller decides once per device (mamba2.cpp: the SsmContext's compute capability and
  // BackendSettings::ssm_prefill_wgmma), so that a launch makes no device query.
  int32_t chunk_wgmma = 0;
  // With chunk_wgmma and 16-bit entering states: 1 = the chunk states and the state passing in one
  // kernel where it takes p (mamba2_fused_state_pass: chunk_states is then not used; the same
  // values written), 0 = the two kernels apart (the benchmark's "states apart" rows time them).
  int32_t fuse_state_passing = 1;
};

// Whether this build has the sm_90a chunk scan and chunk states on wgmma (CMAKE_CUDA_ARCHITECTURES
// with 90; the TUs of hybridtb_mamba2_wgmma), which Mamba2Params::chunk_wgmma selects.
bool mamba2_wgmma_built();

// Whether launch_mamba2_prefill runs the chunk states and the state passing as one kernel on p
// (and leaves chunk_states alone, which may then be null): fuse_state_passing set, the 16-bit
// wgmma chunk kernels (chunk_wgmma, 16-bit operands, a build with their code), 16-bit entering
// states (chunk_states16, 4-byte aligned), B's rows of bc16 whole 16-byte vectors (N a multiple
// of 8, bc16 16-byte aligned), x's rows of xbc whole 16-byte vectors (P and the conv width
// multiples of 4, xbc 16-byte aligned), the pool's rows in pairs of columns (8-byte aligned, even
// slots).
bool mamba2_fused_state_pass(const Mamba2Params& p);

// The single-step update (vLLM's selective_state_update) of the wave's decode entries: per head,
// Δ = softplus(dt + dt_bias), S = exp(Δ·A)·S + Δ·x ⊗ B, y = S·C + D·x; S read from read_slot (zeros
// if −1) and written to write_slot (and the boundary slot of the row, if any). Every state row is
// read and written once, in 16-byte accesses whatever the pool's element, several rows in flight
// per thread. Grid from Hs, P, N and the wave's num_requests only (fixed decode steps).
void launch_mamba2_decode(const Mamba2Params& p, cudaStream_t stream);

// The chunked SSD prefill of the wave's sequences: (0) per chunk × head Δ, the cumulative log decay
// Λ and the chunk's decay, per chunk × group C·Bᵀ, (1) per chunk × head × P tile the chunk's own
// state sum, (2) per sequence × state element the state passing across its chunks from the saved
// state (block-boundary and final states stored to the pool), (3) per 64-token tile of a chunk ×
// head × P tile the outputs: the intra-chunk term (C·Bᵀ masked by the segment-sum decay) + the
// inter-chunk term exp(Λ_t)·(H·C_t) + D·x. With 16-bit operands, steps (1) and (3) run on wgmma
// where p.chunk_wgmma is set (Error, before any launch, where this build has no such code), else on
// mma.sync.
void launch_mamba2_prefill(const Mamba2Params& p, cudaStream_t stream);

// Gated RMSNorm (mamba_ssm's RMSNormGated, norm_before_gate False) of rows t < num_tokens flagged
// kRowActive: v = y ⊙ silu(z + z_bias), then per group of d_ssm / G channels
// v / sqrt(mean(v²) + eps) ⊙ norm_weight. Other rows of `out` are not written.
struct Mamba2NormParams {
  int32_t d_ssm = 0;
  int32_t groups = 0;
  int64_t num_tokens = 0;
  float eps = 1e-5f;
  const float* y = nullptr;       // [T, d_ssm]
  const float* z = nullptr;       // z of row t at z[t·z_stride …] (in_proj's output, no bias)
  int64_t z_stride = 0;
  WeightRef z_bias;               // optional: in_proj_bias (its first d_ssm values are z's)
  WeightRef norm_weight;          // [d_ssm]
  int32_t rms_norm = 1;           // 0: out = y·silu(z) alone (mamba_rms_norm = 0; no norm_weight)
  const int32_t* flags = nullptr;  // [T] row flags
  float* out = nullptr;           // [T, d_ssm]
};
void launch_mamba2_gated_norm(const Mamba2NormParams& p, cudaStream_t stream);

}  // namespace hybridtb::cuda::ssm
