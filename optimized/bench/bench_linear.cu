// hybridtb_bench_linear [--out FILE.json] [--filter REGEX]: the GDN (gdn_kernels.h) and Mamba-2 (mamba2_kernels.h)
// kernels of the cuda backend's linear-attention modes on one GPU, called through their launchers
// with hand-built params, against ceilings measured in the same run:
//   copy bandwidth   cudaMemcpyAsync device-to-device of 1 GiB, read + write counted, the best of
//                    three rounds (bench_ssm's, bench::best_copy_bandwidth);
//   FP32 FMA rate    every SM full (2048 threads), 16 independent fmaf chains per thread, 2 FLOP per
//                    FMA: the CUDA-core ceiling of the prefills (they run float32 on CUDA cores). The
//                    bf16 tensor-core figure (989.4 TFLOP/s dense spec, about 790 measured in a GEMM:
//                    ../shared/GPU.md, perf-anchors.md §1.1) is written as context only.
// Cases (the "name" of each; JSON per case: name, shape, median_us, bytes or flops, GB/s or
// TFLOP/s, the ceiling and the % of it):
//   gdn decode {64, 256} seqs {fp32, bf16} pools — launch_gdn_decode at Qwen3-Next's sizes (Hk 16,
//       Hv 32, dk = dv = 128); bytes = recurrent state read + write (2·seqs·Hv·dv·dk·s_state) +
//       per token q̂, k̂ (Hk·dk each), v (Hv·dv), g, β (Hv each) read and o (Hv·dv) written, float32;
//       % of the 1 GiB copy bandwidth and of a copy of the same bytes timed the same way (bench_ssm's
//       "same size copy": what a transfer of this size can reach, launch and ramp included).
//   mamba2 decode {64, 256} seqs {fp32, bf16} pools — launch_mamba2_decode at Falcon-H1-7B's mixer
//       (gen preset falcon-h1-7b-mamba2: Hs 24 heads of P 128, state N 256, G 1); bytes = ssm_state
//       read + write (2·seqs·Hs·P·N·s_state) + per token x (Hs·P), B, C (G·N each), dt (Hs) read and
//       y (Hs·P) written, float32 (perf-anchors.md §6.4); same ceilings.
//   gdn prefill {8k qwen3-next, 8k hv8, 64k hv8} — one fresh request (no initial state), the
//       per-token preparation + the chunked WY prefill (launch_gdn_prepare + launch_gdn_prefill: the
//       intra-chunk, state-pass and output kernels; not the conv), "prepare_us" and "prefill_us" timed
//       by events between them in the same samples. qwen3-next: Hk 16, Hv 32; hv8: FlashInfer's
//       comparison shape of 8 value heads of 128 with Hk 4 here (FlashInfer's has 2 key heads: the
//       key heads only change the preparation's and the loads' share, not the chunk products).
//       FLOPs (matmul FLOPs, 2 per multiply-add, triangular products counted over their half, the
//       FlashAttention causal convention; chunk C = kGdnChunk = 64, per value head and chunk):
//         A = β·Γ·(K̂ K̂ᵀ) strictly lower   C²·dk        P = (Q̂ K̂ᵀ)·Γ lower    C²·dk
//         (I + A)⁻¹ [K̃ | Ṽ] (substitution) C²·(dk + dv) P·V_new              C²·dv
//         W·Mᵀ, Q̂·Mᵀ (read-out), V_newᵀ·K̂ (state update)  3 × 2·C·dk·dv
//       → "flops" = T·Hv·(6·dk·dv + C·(3·dk + 2·dv)) (139 264 per token per head at 128/128): the
//       chunked algorithm's count (perf-anchors.md §6.6: FlashInfer's nominal count plus the
//       WY/UT transform and the intra-chunk attention), "TFLOPs" and "pct_of_fma" against the
//       FP32 FMA ceiling. "flops_nominal" = 4·T·Hv·dk·dv, FlashInfer's convention
//       (bench_gdn_prefill.py, perf-anchors.md §4.5/§6.6), and "TFLOPs_nominal": the figure to set
//       beside FlashInfer's SM90 kernel (H100, h_qk 2, h_v 8: 0.114 ms = 37.6 nominal TFLOP/s at
//       1×8192, 0.399 ms = 86.1 at 1×65536; perf-anchors.md §4.5), copied into the hv8 cases.
//       Products in float32 (3xTF32, the default).
//   gdn prefill {8k qwen3-next, 64k hv8} bf16 operands — the same with the prefill kernels' product
//       operands rounded to bfloat16 (GdnParams::product_operands; BackendSettings::
//       ssm_prefill_operands model with a bfloat16 model): one m16n8k16 per product with float32
//       accumulation, as fla's Triton kernels (the in-chunk inverse is float32, then rounded); the
//       state pass on wgmma on a compute capability 9.0 device where the build has its sm_90a code
//       (GdnParams::state_wgmma, as the backend sets it; "state_pass" says which ran).
//   gdn prefill {8k qwen3-next, 64k hv8} bf16 operands mma.sync — the same with the mma.sync state
//       pass everywhere (BackendSettings::ssm_prefill_wgmma false): the wgmma body's baseline.
//   mamba2 prefill {8k, 32k} — one fresh request of 8192 / 32768 tokens at the Falcon-H1-7B sizes,
//       the chunked SSD (launch_mamba2_prefill: cumsum, C·Bᵀ, chunk states, state passing, chunk
//       scan; chunk 128); time
//       and tokens/s, with perf-anchors.md §6.5's FLOP estimate T·Hs·(2·Q·(N + P) + 4·N·P) (Q = 128)
//       against the FP32 FMA ceiling as context. Products in float32 (3xTF32, the default).
//   mamba2 prefill {8k, 32k} bf16 operands — the same with the chunk kernels' product operands rounded
//       to bfloat16 (Mamba2Params::product_operands; BackendSettings::ssm_prefill_operands model
//       with a bfloat16 model): bfloat16 products with float32 accumulation, as vLLM's Triton SSD
//       kernels, on m16n8k16 — the chunk states and the chunk scan on wgmma instead on a compute
//       capability 9.0 device where the build has their sm_90a code (Mamba2Params::chunk_wgmma, as
//       the backend sets it; "chunk_bodies" says which ran), there with the chunk states and the
//       state passing as one kernel ("state_pass").
//   mamba2 prefill {8k, 32k} bf16 operands states apart — on a 9.0 device, the same with the chunk
//       states and the state passing as two kernels (BackendSettings::ssm_prefill_fused_state_pass
//       false): the fused kernel's baseline.
//   mamba2 prefill {8k, 32k} bf16 operands mma.sync — the same with the mma.sync chunk states and
//       chunk scan everywhere (BackendSettings::ssm_prefill_wgmma false): the wgmma bodies' baseline.
// Inputs are deterministic non-zero values (a hash fill; q and k normalised by one untimed
// preparation before the decode cases, whose kernel reads them as prepared); every timing is the
// median of CUDA-event samples after warm-up launches, with the state pool (and, for the GDN
// prefill, the activations the preparation normalises in place) restored and L2 flushed (a 256 MiB
// read: clean lines, no write-back in the timed region) before every sample, outside the events.
// The JSON records the device, its maximum clocks (cudaDeviceGetAttribute) and the SM clock
// measured at the start and the end of the run (clock64 cycles over %globaltimer nanoseconds).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <exception>
#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "bench/bench_kernels.h"
#include "bench/event_timer.h"
#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/kernel_attributes.h"
#include "ssm/gdn_kernels.h"
#include "ssm/mamba2_kernels.h"

using namespace hybridtb::cuda;
using namespace hybridtb::cuda::ssm;

namespace {

// Element i ← low + (high − low)·hash(i, seed) in [low, high), stored as `kind` (RNE).
__global__ void fill_kernel(void* p, ElementKind kind, int64_t n, float low, float high, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    store_element(p, i, kind, low + (high - low) * static_cast<float>(h & 0xFFFFFF) / 16777216.0f);
  }
}

// The FP32 FMA ceiling: kFmaChains independent chains x ← x·a + b per thread (a, b kernel arguments:
// nothing folds; x stays near b / (1 − a), never denormal), so issue, not latency, bounds it.
constexpr int kFmaChains = 16;
constexpr int kFmaSteps = 4096;
__global__ void fma_rate_kernel(float a, float b, float* sink) {
  float x[kFmaChains];
#pragma unroll
  for (int c = 0; c < kFmaChains; ++c) x[c] = 0.5f + 0.01f * c + 1e-6f * threadIdx.x;
#pragma unroll 8
  for (int step = 0; step < kFmaSteps; ++step) {
#pragma unroll
    for (int c = 0; c < kFmaChains; ++c) x[c] = fmaf(x[c], a, b);
  }
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kFmaChains; ++c) acc += x[c];
  if (acc == -1.0f) *sink = acc;  // never true; keeps the chains
}

size_t element_size(ElementKind kind) { return kind == ElementKind::kFloat32 ? 4 : 2; }

// The wave of a case: `requests` requests of `length` token rows each, back to back; decodes
// (length 1) read and write slot r + 1, prefills start from zeros and write slot r + 1.
std::vector<GpuRequest> case_requests(int requests, int length) {
  std::vector<GpuRequest> reqs;
  for (int r = 0; r < requests; ++r) {
    GpuRequest q;
    q.begin = r * length;
    q.end = (r + 1) * length;
    q.decode = length == 1 ? 1 : 0;
    q.read_slot = length == 1 ? r + 1 : -1;
    q.write_slot = r + 1;
    reqs.push_back(q);
  }
  return reqs;
}

// Device allocations of one case, freed together.
struct Buffers {
  std::vector<void*> owned;
  ~Buffers() {
    for (void* p : owned) cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    HYBRIDTB_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    owned.push_back(p);
    return p;
  }
  void* filled(int64_t n, ElementKind kind, float low, float high, uint32_t seed) {
    void* p = alloc(static_cast<size_t>(n) * element_size(kind));
    fill_kernel<<<1024, 256>>>(p, kind, n, low, high, seed);
    HYBRIDTB_CUDA_CHECK_LAUNCH();
    return p;
  }
  float* f32(int64_t n, float low, float high, uint32_t seed) {
    return static_cast<float*>(filled(n, ElementKind::kFloat32, low, high, seed));
  }
  template <typename T>
  T* upload(const std::vector<T>& v) {
    T* p = static_cast<T*>(alloc(v.size() * sizeof(T)));
    HYBRIDTB_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
  }
  // A device copy of `bytes` at `src` (the state before any run, restored before every sample).
  void* saved(const void* src, size_t bytes) {
    void* p = alloc(bytes);
    HYBRIDTB_CUDA_CHECK(cudaMemcpy(p, src, bytes, cudaMemcpyDeviceToDevice));
    return p;
  }
};

// What is restored before every sample: dst ← src, `bytes`.
struct Restore {
  void* dst;
  const void* src;
  size_t bytes;
};


// The medians (ms) of `reps` samples after `warmup` untimed ones of the phases run back to back,
// an event before each phase and after the last: element i is phase i's median, the last element
// the median of the whole. Before every sample, outside the events: the restores, then the L2 flush.
std::vector<double> median_phases_ms(int reps, int warmup, cudaStream_t stream, const std::vector<Restore>& restores,
                                     const bench::ReadFlusher& flush,
                                     const std::vector<std::function<void()>>& phases) {
  const size_t n = phases.size();
  std::vector<cudaEvent_t> events(n + 1);
  for (cudaEvent_t& e : events) HYBRIDTB_CUDA_CHECK(cudaEventCreate(&e));
  std::vector<std::vector<float>> times(n + 1);
  for (int r = 0; r < warmup + reps; ++r) {
    for (const Restore& x : restores) {
      HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(x.dst, x.src, x.bytes, cudaMemcpyDeviceToDevice, stream));
    }
    flush.flush(stream);
    for (size_t i = 0; i < n; ++i) {
      HYBRIDTB_CUDA_CHECK(cudaEventRecord(events[i], stream));
      phases[i]();
    }
    HYBRIDTB_CUDA_CHECK(cudaEventRecord(events[n], stream));
    HYBRIDTB_CUDA_CHECK(cudaEventSynchronize(events[n]));
    if (r < warmup) continue;
    for (size_t i = 0; i < n; ++i) {
      float ms = 0.0f;
      HYBRIDTB_CUDA_CHECK(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
      times[i].push_back(ms);
    }
    float total = 0.0f;
    HYBRIDTB_CUDA_CHECK(cudaEventElapsedTime(&total, events[0], events[n]));
    times[n].push_back(total);
  }
  for (cudaEvent_t& e : events) HYBRIDTB_CUDA_CHECK(cudaEventDestroy(e));
  std::vector<double> medians;
  for (std::vector<float>& t : times) {
    std::sort(t.begin(), t.end());
    medians.push_back(static_cast<double>(t[t.size() / 2]));
  }
  return medians;
}

double median_ms(int reps, int warmup, cudaStream_t stream, const std::vector<Restore>& restores,
                 const bench::ReadFlusher& flush,
                 const std::function<void()>& fn) {
  return median_phases_ms(reps, warmup, stream, restores, flush, {fn}).back();
}

// The same bytes moved by a device-to-device copy (bytes / 2 read, bytes / 2 written), timed like
// the kernel (restores and L2 flush first): the ceiling for a transfer of this size.
double same_size_copy_ms(double bytes, cudaStream_t stream, const std::vector<Restore>& restores,
                         const bench::ReadFlusher& flush) {
  Buffers b;
  const auto half = static_cast<size_t>(bytes / 2);
  void* src = b.alloc(half);
  void* dst = b.alloc(half);
  HYBRIDTB_CUDA_CHECK(cudaMemset(src, 1, half));
  return median_ms(50, 5, stream, restores, flush, [&] {
    HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice, stream));
  });
}

// A JSON object built field by field.
class Obj {
 public:
  Obj& str(const std::string& key, const std::string& value) { return raw(key, "\"" + value + "\""); }
  Obj& num(const std::string& key, double value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", value);
    return raw(key, std::isfinite(value) ? buf : "null");
  }
  Obj& raw(const std::string& key, const std::string& value) {
    text_ += (text_.empty() ? "" : ", ") + ("\"" + key + "\": ") + value;
    return *this;
  }
  std::string text() const { return "{" + text_ + "}"; }

 private:
  std::string text_;
};

const char* pool_name(ElementKind kind) { return kind == ElementKind::kFloat32 ? "fp32" : "bf16"; }

// --- GDN ---------------------------------------------------------------------------------------------

struct GdnShape {
  int Hk, Hv, dk, dv;
  int conv_dim() const { return 2 * Hk * dk + Hv * dv; }
};
constexpr GdnShape kQwen3Next{16, 32, 128, 128};
constexpr GdnShape kGdnHv8{4, 8, 128, 128};

// `requests` requests of `length` tokens (length 1: decodes, read_slot = write_slot = r + 1;
// otherwise fresh prefills, read_slot −1, write_slot r + 1) with every input filled; prefills get
// their chunks of kGdnChunk tokens and the chunk scratch.
GdnParams make_gdn(Buffers& b, const GdnShape& s, int requests, int length, ElementKind pool_kind) {
  GdnParams p;
  const int64_t T = int64_t{requests} * length;
  p.Hk = s.Hk;
  p.Hv = s.Hv;
  p.dk = s.dk;
  p.dv = s.dv;
  p.num_tokens = T;
  p.qkv = b.f32(T * s.conv_dim(), -1.0f, 1.0f, 21);
  p.a = RowsRef{b.f32(T * s.Hv, -1.0f, 1.0f, 22), ElementKind::kFloat32, s.Hv};
  p.b = RowsRef{b.f32(T * s.Hv, -1.0f, 1.0f, 23), ElementKind::kFloat32, s.Hv};
  p.g = b.f32(T * s.Hv, 0.0f, 0.0f, 24);
  p.beta = b.f32(T * s.Hv, 0.0f, 0.0f, 25);
  p.o = RowsRef{b.f32(T * s.Hv * s.dv, 0.0f, 0.0f, 26), ElementKind::kFloat32, int64_t{s.Hv} * s.dv};
  p.A_log = WeightRef{b.f32(s.Hv, -1.0f, 1.0f, 27), ElementKind::kFloat32};
  p.dt_bias = WeightRef{b.f32(s.Hv, -0.1f, 0.1f, 28), ElementKind::kFloat32};
  const int64_t slot = int64_t{s.Hv} * s.dv * s.dk;
  p.recurrent_state = PoolRef{b.filled((requests + 1) * slot, pool_kind, -1.0f, 1.0f, 29), pool_kind, slot};
  const std::vector<GpuRequest> reqs = case_requests(requests, length);
  p.wave.requests = b.upload(reqs);
  p.wave.num_requests = requests;
  p.wave.max_tokens = length;
  p.boundary_slot = b.upload(std::vector<int32_t>(static_cast<size_t>(T), -1));
  if (length == 1) {
    p.decode_end = requests;
    return p;
  }
  std::vector<GdnPrefill> prefills;
  std::vector<GdnChunk> chunks;
  for (int r = 0; r < requests; ++r) {
    GdnPrefill pf;
    pf.request = r;
    pf.first_chunk = static_cast<int32_t>(chunks.size());
    for (int32_t begin = r * length; begin < (r + 1) * length; begin += kGdnChunk) {
      chunks.push_back(GdnChunk{r, begin, std::min((r + 1) * length, begin + kGdnChunk), 0});
    }
    pf.num_chunks = static_cast<int32_t>(chunks.size()) - pf.first_chunk;
    prefills.push_back(pf);
  }
  p.prefills = b.upload(prefills);
  p.num_prefills = static_cast<int32_t>(prefills.size());
  p.chunks = b.upload(chunks);
  p.num_chunks = static_cast<int32_t>(chunks.size());
  p.u = b.f32(T * s.Hv * s.dv, 0.0f, 0.0f, 31);
  p.attn = b.f32(T * s.Hv * kGdnChunk, 0.0f, 0.0f, 32);
  p.gcum = b.f32(T * s.Hv, 0.0f, 0.0f, 33);
  // h, w_frag, k_frag sized for float32 elements: enough for either kind of product operands (16-bit
  // operands use at most the first half; gdn_scratch_element_bytes, gdn_entry_state_row).
  p.h = b.f32(int64_t{p.num_chunks} * s.Hv * s.dv * gdn_entry_state_row(s.dk, ElementKind::kBFloat16), 0.0f, 0.0f, 34);
  p.w_frag = b.alloc(sizeof(float) * p.num_chunks * s.Hv * size_t{kGdnFragTileElements});
  p.k_frag = b.alloc(sizeof(float) * p.num_chunks * s.Hk * size_t{kGdnFragTileElements});
  // With 16-bit operands only: V_new and the output pass's q̂ and P fragments (GdnParams).
  p.v_new = b.alloc(sizeof(uint16_t) * p.num_chunks * s.Hv * s.dv * size_t{kGdnChunk});
  p.q_frag = b.alloc(sizeof(uint16_t) * p.num_chunks * s.Hk * size_t{kGdnFragTileElements});
  p.attn_frag = b.alloc(sizeof(uint16_t) * p.num_chunks * s.Hv * size_t{kGdnChunk} * kGdnChunk);
  return p;
}

// --- Mamba-2 -----------------------------------------------------------------------------------------

struct Mamba2Shape {
  int Hs, P, N, G;
  int64_t d_ssm() const { return int64_t{Hs} * P; }
  int64_t conv_dim() const { return d_ssm() + 2 * int64_t{G} * N; }
};
constexpr Mamba2Shape kFalconH1{24, 128, 256, 1};  // gen preset falcon-h1-7b-mamba2

// As make_gdn: decodes (length 1) or fresh prefills cut into chunks of kMamba2ChunkTokens.
Mamba2Params make_mamba2(Buffers& b, const Mamba2Shape& s, int requests, int length, ElementKind pool_kind) {
  Mamba2Params p;
  const int64_t T = int64_t{requests} * length;
  p.heads = s.Hs;
  p.head_dim = s.P;
  p.state = s.N;
  p.groups = s.G;
  p.num_tokens = T;
  p.dt = RowsRef{b.f32(T * s.Hs, -4.6f, -2.3f, 41), ElementKind::kFloat32, s.Hs};  // softplus → Δ ≈ 0.01 … 0.1
  p.xbc = b.f32(T * s.conv_dim(), -1.0f, 1.0f, 42);
  p.y = RowsRef{b.f32(T * s.d_ssm(), 0.0f, 0.0f, 43), ElementKind::kFloat32, s.d_ssm()};
  p.dt_bias = WeightRef{b.f32(s.Hs, -0.1f, 0.1f, 44), ElementKind::kFloat32};
  p.A_log = WeightRef{b.f32(s.Hs, 0.0f, 2.77f, 45), ElementKind::kFloat32};  // A = −1 … −16
  p.D = WeightRef{b.f32(s.Hs, 0.5f, 1.5f, 46), ElementKind::kFloat32};
  const int64_t slot = int64_t{s.Hs} * s.P * s.N;
  p.ssm_state = PoolRef{b.filled((requests + 1) * slot, pool_kind, -1.0f, 1.0f, 47), pool_kind, slot};
  const std::vector<GpuRequest> reqs = case_requests(requests, length);
  std::vector<Mamba2Chunk> chunks;
  std::vector<Mamba2Sequence> sequences;
  for (const GpuRequest& q : reqs) {
    if (q.decode != 0) continue;
    Mamba2Sequence seq;
    seq.first_chunk = static_cast<int32_t>(chunks.size());
    seq.read_slot = q.read_slot;
    seq.write_slot = q.write_slot;
    for (int32_t begin = q.begin; begin < q.end; begin += kMamba2ChunkTokens) {
      Mamba2Chunk c;
      c.begin = begin;
      c.end = std::min(q.end, begin + kMamba2ChunkTokens);
      chunks.push_back(c);
    }
    seq.num_chunks = static_cast<int32_t>(chunks.size()) - seq.first_chunk;
    sequences.push_back(seq);
  }
  p.wave.requests = b.upload(reqs);
  p.wave.num_requests = requests;
  p.wave.max_tokens = length;
  p.boundary_slot = b.upload(std::vector<int32_t>(static_cast<size_t>(T), -1));
  if (!chunks.empty()) {
    p.chunks = b.upload(chunks);
    p.num_chunks = static_cast<int32_t>(chunks.size());
    p.sequences = b.upload(sequences);
    p.num_sequences = static_cast<int32_t>(sequences.size());
    p.chunk_states = b.f32(int64_t{p.num_chunks} * s.Hs * s.P * s.N, 0.0f, 0.0f, 48);
    p.chunk_decay = b.f32(int64_t{p.num_chunks} * s.Hs, 0.0f, 0.0f, 49);
    p.chunk_cumsum = b.f32(int64_t{p.num_chunks} * s.Hs * 3 * kMamba2ChunkTokens, 0.0f, 0.0f, 50);
    p.chunk_cb = b.f32(int64_t{p.num_chunks} * s.G * kMamba2ChunkTokens * kMamba2ChunkTokens, 0.0f, 0.0f, 51);
  }
  return p;
}

}  // namespace

int run(int argc, char** argv) {
  std::string out_path;
  std::optional<std::regex> filter;  // --filter: only the cases whose name it matches (std::regex_search)
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--out" || arg == "--filter") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (arg == "--out") {
        out_path = value;
      } else {
        try {
          filter.emplace(value);
        } catch (const std::regex_error& e) {
          std::cerr << "hybridtb_bench_linear: --filter '" << value << "' is not a regular expression: " << e.what()
                    << "\n";
          return 2;
        }
      }
    } else {
      std::cerr << "hybridtb_bench_linear: unknown or incomplete argument '" << arg
                << "'\nusage: hybridtb_bench_linear [--out FILE.json] [--filter REGEX]\n";
      return 2;
    }
  }
  auto wanted = [&](const std::string& name) { return !filter || std::regex_search(name, *filter); };
  cudaStream_t stream = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaDeviceProp prop{};
  HYBRIDTB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const bench::DeviceFacts facts = bench::device_facts();
  const double sm_clock_start = bench::measure_sm_clock_mhz();

  // Ceiling: device-to-device copy of 1 GiB (read + write counted), the best of three rounds of 20.
  const bench::CopyCeiling copy = bench::best_copy_bandwidth(int64_t{1} << 30, 20, 3, stream);
  const double copy_bw = copy.best_Bps;
  // Ceiling: FP32 FMA throughput with every SM full (8 blocks of 256 threads per SM).
  double fma_rate = 0.0;
  {
    Buffers b;
    auto* sink = static_cast<float*>(b.alloc(sizeof(float)));
    const unsigned blocks = static_cast<unsigned>(prop.multiProcessorCount) * 8;
    const double ms = bench::median_ms(10, stream, [&] {
      fma_rate_kernel<<<blocks, 256, 0, stream>>>(0.9999f, 1e-4f, sink);
      HYBRIDTB_CUDA_CHECK_LAUNCH();
    }, 2);
    fma_rate = 2.0 * blocks * 256 * kFmaChains * kFmaSteps / (ms * 1e-3);
  }
  constexpr double kBf16TensorSpec = 989.4e12;  // H100 SXM dense bf16 (perf-anchors.md §1.1): context only

  const bench::ReadFlusher flush;  // 256 MiB

  std::vector<std::string> cases;
  auto add_case = [&](const Obj& o) {
    cases.push_back(o.text());
    std::printf("%s\n", cases.back().c_str());
    std::fflush(stdout);
  };
  // The decode figures shared by both modes.
  auto decode_case = [&](Obj o, double ms, double bytes, double state_bytes, double copy_ms) {
    o.num("median_us", ms * 1e3)
        .num("bytes", bytes)
        .num("state_bytes", state_bytes)
        .num("GBps", bytes / (ms * 1e-3) / 1e9)
        .num("ceiling_copy_GBps", copy_bw / 1e9)
        .num("pct_of_copy_bw", 100.0 * (bytes / copy_bw) / (ms * 1e-3))
        .num("same_size_copy_us", copy_ms * 1e3)
        .num("pct_of_same_size_copy", 100.0 * copy_ms / ms);
    add_case(o);
  };

  // --- GDN decode ---
  for (const ElementKind kind : {ElementKind::kFloat32, ElementKind::kBFloat16}) {
    for (const int seqs : {64, 256}) {
      const std::string name = std::string("gdn decode ") + std::to_string(seqs) + " seqs " + pool_name(kind);
      if (!wanted(name)) continue;
      Buffers b;
      const GdnShape s = kQwen3Next;
      GdnParams p = make_gdn(b, s, seqs, 1, kind);
      launch_gdn_prepare(p, stream);  // q̂, k̂, g, β as the decode reads them (not timed)
      const size_t pool_bytes = static_cast<size_t>(seqs + 1) * p.recurrent_state.slot_size * element_size(kind);
      const std::vector<Restore> restores{{p.recurrent_state.data, b.saved(p.recurrent_state.data, pool_bytes), pool_bytes}};
      const double ms = median_ms(50, 5, stream, restores, flush, [&] { launch_gdn_decode(p, stream); });
      const double state_bytes = 2.0 * seqs * s.Hv * s.dv * s.dk * static_cast<double>(element_size(kind));
      const double token_bytes = 4.0 * (2.0 * s.Hk * s.dk + s.Hv * s.dv + 2.0 * s.Hv + s.Hv * s.dv);
      const double bytes = state_bytes + seqs * token_bytes;
      Obj o;
      o.str("name", name)
          .str("case", "gdn_decode")
          .str("shape", "Qwen3-Next: Hk 16, Hv 32, dk 128, dv 128")
          .num("seqs", seqs)
          .str("pool", pool_name(kind));
      decode_case(o, ms, bytes, state_bytes, same_size_copy_ms(bytes, stream, restores, flush));
    }
  }

  // --- Mamba-2 decode ---
  for (const ElementKind kind : {ElementKind::kFloat32, ElementKind::kBFloat16}) {
    for (const int seqs : {64, 256}) {
      const std::string name = std::string("mamba2 decode ") + std::to_string(seqs) + " seqs " + pool_name(kind);
      if (!wanted(name)) continue;
      Buffers b;
      const Mamba2Shape s = kFalconH1;
      Mamba2Params p = make_mamba2(b, s, seqs, 1, kind);
      const size_t pool_bytes = static_cast<size_t>(seqs + 1) * p.ssm_state.slot_size * element_size(kind);
      const std::vector<Restore> restores{{p.ssm_state.data, b.saved(p.ssm_state.data, pool_bytes), pool_bytes}};
      const double ms = median_ms(50, 5, stream, restores, flush, [&] { launch_mamba2_decode(p, stream); });
      const double state_bytes = 2.0 * seqs * s.Hs * s.P * s.N * static_cast<double>(element_size(kind));
      const double token_bytes = 4.0 * (2.0 * s.d_ssm() + 2.0 * s.G * s.N + s.Hs);
      const double bytes = state_bytes + seqs * token_bytes;
      Obj o;
      o.str("name", name)
          .str("case", "mamba2_decode")
          .str("shape", "Falcon-H1-7B: Hs 24, P 128, N 256, G 1")
          .num("seqs", seqs)
          .str("pool", pool_name(kind));
      decode_case(o, ms, bytes, state_bytes, same_size_copy_ms(bytes, stream, restores, flush));
    }
  }

  // --- GDN chunked prefill (one fresh request; fp32 pool) ---
  struct GdnPrefillCase {
    const char* name;
    const char* shape;
    GdnShape s;
    int tokens;
    double flashinfer_ms;  // FlashInfer SM90, H100, h_qk 2, h_v 8 (perf-anchors.md §4.5); 0: no figure
    ElementKind operands;  // GdnParams::product_operands: float32 (3xTF32) or bfloat16
    bool force_mma_sync;   // bfloat16: the mma.sync state pass even where wgmma's would run
  };
  const char* const qwen3_next = "Qwen3-Next: Hk 16, Hv 32, dk 128, dv 128";
  const char* const hv8 = "FlashInfer's: Hk 4 (FlashInfer 2), Hv 8, dk 128, dv 128";
  const GdnPrefillCase gdn_prefills[] = {
      {"gdn prefill 8k qwen3-next", qwen3_next, kQwen3Next, 8192, 0.0, ElementKind::kFloat32, false},
      {"gdn prefill 8k qwen3-next bf16 operands", qwen3_next, kQwen3Next, 8192, 0.0, ElementKind::kBFloat16, false},
      {"gdn prefill 8k qwen3-next bf16 operands mma.sync", qwen3_next, kQwen3Next, 8192, 0.0,
       ElementKind::kBFloat16, true},
      {"gdn prefill 8k hv8", hv8, kGdnHv8, 8192, 0.114, ElementKind::kFloat32, false},
      {"gdn prefill 64k hv8", hv8, kGdnHv8, 65536, 0.399, ElementKind::kFloat32, false},
      {"gdn prefill 64k hv8 bf16 operands", hv8, kGdnHv8, 65536, 0.399, ElementKind::kBFloat16, false},
      {"gdn prefill 64k hv8 bf16 operands mma.sync", hv8, kGdnHv8, 65536, 0.399, ElementKind::kBFloat16, true},
  };
  const bool gdn_hopper = ComputeCapability{prop.major, prop.minor}.is_hopper();
  for (const GdnPrefillCase& c : gdn_prefills) {
    if (!wanted(c.name)) continue;
    Buffers b;
    const GdnShape& s = c.s;
    const int T = c.tokens;
    GdnParams p = make_gdn(b, s, 1, T, ElementKind::kFloat32);
    p.product_operands = c.operands;
    // The state pass on wgmma as gdn.cpp sets it (16-bit operands, a compute capability 9.0 device, a
    // build with the sm_90a code), unless the case forces mma.sync.
    p.state_wgmma = c.operands != ElementKind::kFloat32 && !c.force_mma_sync && gdn_wgmma_built() && gdn_hopper ? 1 : 0;
    const size_t qkv_bytes = static_cast<size_t>(T) * s.conv_dim() * sizeof(float);
    const size_t pool_bytes = 2 * static_cast<size_t>(p.recurrent_state.slot_size) * sizeof(float);
    const std::vector<Restore> restores{{p.qkv, b.saved(p.qkv, qkv_bytes), qkv_bytes},
                                        {p.recurrent_state.data, b.saved(p.recurrent_state.data, pool_bytes), pool_bytes}};
    const std::vector<double> ms = median_phases_ms(10, 2, stream, restores, flush,
                                                    {[&] { launch_gdn_prepare(p, stream); },
                                                     [&] { launch_gdn_prefill(p, stream); }});
    const double total = ms[2] * 1e-3;
    const double flops = static_cast<double>(T) * s.Hv *
                         (6.0 * s.dk * s.dv + kGdnChunk * (3.0 * s.dk + 2.0 * s.dv));
    const double nominal = 4.0 * T * s.Hv * s.dk * s.dv;
    Obj o;
    o.str("name", c.name)
        .str("case", "gdn_prefill")
        .str("shape", c.shape)
        .str("product_operands", c.operands == ElementKind::kFloat32 ? "float32 (3xTF32)"
                                                                     : "bf16 (m16n8k16, float32 accumulation)")
        .str("state_pass", p.state_wgmma != 0 ? "wgmma" : "mma.sync")
        .num("tokens", T)
        .num("chunk", kGdnChunk)
        .num("median_us", ms[2] * 1e3)
        .num("prepare_us", ms[0] * 1e3)
        .num("prefill_us", ms[1] * 1e3)
        .num("tokens_per_s", T / total)
        .num("flops", flops)
        .num("TFLOPs", flops / total / 1e12)
        .num("ceiling_fma_TFLOPs", fma_rate / 1e12)
        .num("pct_of_fma", 100.0 * flops / total / fma_rate)
        .num("flops_nominal", nominal)
        .num("TFLOPs_nominal", nominal / total / 1e12)
        .num("pct_nominal_of_bf16_tensor_spec", 100.0 * nominal / total / kBf16TensorSpec);
    if (c.flashinfer_ms > 0.0) {
      o.num("flashinfer_sm90_h100_us", c.flashinfer_ms * 1e3)
          .num("flashinfer_sm90_TFLOPs_nominal", nominal / (c.flashinfer_ms * 1e-3) / 1e12)
          .num("ratio_to_flashinfer", total / (c.flashinfer_ms * 1e-3));
    }
    add_case(o);
  }

  // --- Mamba-2 chunked prefill (one fresh request of 8k or 32k tokens; fp32 pool), with the
  // products' operands in float32 (3xTF32, the default) and in bfloat16 (ssm_prefill_operands model
  // with a bfloat16 model: Mamba2Params::product_operands), the latter also with the mma.sync chunk
  // kernels forced (BackendSettings::ssm_prefill_wgmma false) and, on Hopper, with the chunk states
  // and the state passing as two kernels (Mamba2Params::fuse_state_passing 0) ---
  struct Mamba2Body {
    ElementKind operands;
    bool force_mma_sync;
    bool states_apart;
    const char* suffix;
  };
  const Mamba2Body mamba2_bodies[] = {{ElementKind::kFloat32, false, false, ""},
                                      {ElementKind::kBFloat16, false, false, " bf16 operands"},
                                      {ElementKind::kBFloat16, false, true, " bf16 operands states apart"},
                                      {ElementKind::kBFloat16, true, false, " bf16 operands mma.sync"}};
  for (const int T : {8192, 32768})
  for (const Mamba2Body& body : mamba2_bodies) {
    const bool float32 = body.operands == ElementKind::kFloat32;
    const std::string name = "mamba2 prefill " + std::to_string(T / 1024) + "k" + body.suffix;
    if (!wanted(name)) continue;
    Buffers b;
    const Mamba2Shape s = kFalconH1;
    Mamba2Params p = make_mamba2(b, s, 1, T, ElementKind::kFloat32);
    p.product_operands = body.operands;
    // The chunk kernels' bodies the backend picks on this device (mamba2.cpp), unless forced.
    const bool hopper = ComputeCapability{prop.major, prop.minor}.is_hopper();
    p.chunk_wgmma = !body.force_mma_sync && mamba2_wgmma_built() && hopper ? 1 : 0;
    if (body.states_apart && p.chunk_wgmma == 0) continue;  // the fused state pass is a wgmma kernel
    p.fuse_state_passing = body.states_apart ? 0 : 1;
    if (!float32 && p.chunk_wgmma != 0) {  // 16-bit entering states, B and C, as mamba2.cpp plans them
      p.chunk_states16 = b.alloc(static_cast<size_t>(p.num_chunks) * s.Hs * s.P * s.N * sizeof(uint16_t));
      p.bc16 = b.alloc(static_cast<size_t>(p.num_tokens) * 2 * s.G * s.N * sizeof(uint16_t));
    }
    const size_t pool_bytes = 2 * static_cast<size_t>(p.ssm_state.slot_size) * sizeof(float);
    const std::vector<Restore> restores{{p.ssm_state.data, b.saved(p.ssm_state.data, pool_bytes), pool_bytes}};
    const double ms = median_ms(10, 2, stream, restores, flush, [&] { launch_mamba2_prefill(p, stream); });
    const double flops = static_cast<double>(T) * s.Hs *
                         (2.0 * kMamba2ChunkTokens * (s.N + s.P) + 4.0 * s.N * s.P);
    Obj o;
    o.str("name", name)
        .str("case", "mamba2_prefill")
        .str("shape", "Falcon-H1-7B: Hs 24, P 128, N 256, G 1")
        .str("product_operands", float32 ? "float32 (3xTF32)" : "bf16 (float32 accumulation)")
        .str("chunk_bodies", !float32 && p.chunk_wgmma != 0 ? "wgmma" : "mma.sync")
        .str("state_pass", mamba2_fused_state_pass(p)
                               ? "fused with the chunk states"
                               : "apart")
        .num("tokens", T)
        .num("chunk", kMamba2ChunkTokens)
        .num("median_us", ms * 1e3)
        .num("tokens_per_s", T / (ms * 1e-3))
        .num("flops_estimate", flops)
        .num("TFLOPs", flops / (ms * 1e-3) / 1e12)
        .num("ceiling_fma_TFLOPs", fma_rate / 1e12)
        .num("pct_of_fma", 100.0 * flops / (ms * 1e-3) / fma_rate);
    add_case(o);
  }
  HYBRIDTB_CUDA_CHECK(cudaDeviceSynchronize());
  const double sm_clock_end = bench::measure_sm_clock_mhz();

  Obj head;
  head.str("gpu", prop.name)
      .num("sms", prop.multiProcessorCount)
      .num("max_sm_clock_mhz", facts.max_sm_clock_mhz)
      .num("max_mem_clock_mhz", facts.max_mem_clock_mhz)
      .num("sm_clock_mhz_measured_start", sm_clock_start)
      .num("sm_clock_mhz_measured_end", sm_clock_end)
      .num("cuda_driver_version", facts.cuda_driver_version)
      .num("cuda_runtime_version", facts.cuda_runtime_version)
      .num("copy_bandwidth_Bps", copy_bw)
      .raw("copy_bandwidth_rounds_Bps", copy.rounds_json())
      .num("fp32_fma_flops_per_s", fma_rate)
      .num("bf16_tensor_spec_flops_per_s", kBf16TensorSpec);
  std::printf("%s\n", head.text().c_str());
  std::string json = head.text();
  json.pop_back();  // the closing brace: the cases follow
  json += ",\n  \"cases\": [\n";
  for (size_t i = 0; i < cases.size(); ++i) json += "    " + cases[i] + (i + 1 < cases.size() ? ",\n" : "\n");
  json += "  ]\n}\n";
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f == nullptr) return 1;
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  cudaStreamDestroy(stream);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hybridtb_bench_linear: %s\n", e.what());
    return 1;
  }
}
