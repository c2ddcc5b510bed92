// Probe, not part of the product (no CMake target; build and run on an sm_90 GPU with
//   nvcc -O3 -arch=sm_90 -o scan_lanes_over_time experiments/probes/scan_lanes_over_time.cu
//   ./scan_lanes_over_time
// ): the core loop of a candidate mamba1 prefill scan with its lanes over time — one warp per
// channel, K consecutive tokens per lane, a loop over the 16 states, each state's (Π a, h) pairs
// joined by a warp scan (5 shuffle levels) and carried from chunk to chunk, then a rescan for y.
// Channel-major inputs (Δ and Δ·c per channel row, B/C transposed [N][T]) so that only the core is
// timed: no staging, no preparation, no gating, results not checked. It prints µs for T = 8192,
// I = 5120, N = 16 for K = 4, 8, 16 and S states unrolled (S > 1: S states' chains interleaved).
// Measured (H100, 1f21b98; the log: `git show 644c420:experiments/results/` +
// `2026-11-22_h100_1f21b98_scan-lanes-over-time-probe.txt`): 863 µs at best (K 4, S 4), against
// 556 µs for the whole tile scan (scan_tile_kernel) at the same size and 413 µs for its core
// without copies and preparation — so this design is not the way to the 60% target (≤ ≈ 374 µs):
// its per-state join and chains leave it latency-bound.
#include <cstdio>
#include <cuda_runtime.h>

constexpr int N = 16;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int K, int kStatesInFlight>
__global__ void __launch_bounds__(128) probe(const float* __restrict__ d_t, const float* __restrict__ dc_t,
                                             const float* __restrict__ bt, const float* __restrict__ ct,
                                             const float* __restrict__ a2g, float* __restrict__ y_t, int T, int I) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= I) return;
  const int ch = warp;
  float A2[N], carry[N];
#pragma unroll
  for (int n = 0; n < N; ++n) A2[n] = a2g[ch * N + n], carry[n] = 0.0f;
  for (int chunk = 0; chunk < T; chunk += 32 * K) {
    const int t0 = chunk + lane * K;
    float d[K], dc[K], yk[K];
#pragma unroll
    for (int k = 0; k < K; k += 4) {
      const float4 v = *reinterpret_cast<const float4*>(d_t + size_t(ch) * T + t0 + k);
      const float4 w = *reinterpret_cast<const float4*>(dc_t + size_t(ch) * T + t0 + k);
      d[k] = v.x, d[k + 1] = v.y, d[k + 2] = v.z, d[k + 3] = v.w;
      dc[k] = w.x, dc[k + 1] = w.y, dc[k + 2] = w.z, dc[k + 3] = w.w;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) yk[k] = 0.0f;
#pragma unroll kStatesInFlight
    for (int n = 0; n < N; ++n) {
      float a[K], u[K];
      float P = 1.0f, h = 0.0f;
#pragma unroll
      for (int k = 0; k < K; k += 4) {
        const float4 b = __ldg(reinterpret_cast<const float4*>(bt + size_t(n) * T + t0 + k));
        const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          a[k + j] = ex2(d[k + j] * A2[n]);
          u[k + j] = dc[k + j] * bv[j];
          h = fmaf(a[k + j], h, u[k + j]);
          P *= a[k + j];
        }
      }
      // inclusive scan over lanes: (P, h) ∘ earlier
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const float Pu = __shfl_up_sync(0xffffffffu, P, off);
        const float hu = __shfl_up_sync(0xffffffffu, h, off);
        if (lane >= off) {
          h = fmaf(P, hu, h);
          P *= Pu;
        }
      }
      float Pe = __shfl_up_sync(0xffffffffu, P, 1);
      float he = __shfl_up_sync(0xffffffffu, h, 1);
      if (lane == 0) Pe = 1.0f, he = 0.0f;
      const float Pall = __shfl_sync(0xffffffffu, P, 31);
      const float hall = __shfl_sync(0xffffffffu, h, 31);
      float hs = fmaf(Pe, carry[n], he);
      carry[n] = fmaf(Pall, carry[n], hall);
#pragma unroll
      for (int k = 0; k < K; k += 4) {
        const float4 c = __ldg(reinterpret_cast<const float4*>(ct + size_t(n) * T + t0 + k));
        const float cv[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          hs = fmaf(a[k + j], hs, u[k + j]);
          yk[k + j] = fmaf(cv[j], hs, yk[k + j]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < K; k += 4) {
      *reinterpret_cast<float4*>(y_t + size_t(ch) * T + t0 + k) = make_float4(yk[k], yk[k + 1], yk[k + 2], yk[k + 3]);
    }
  }
}

__global__ void fill(float* p, size_t n, float lo, float hi, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    p[i] = lo + (hi - lo) * float(h & 0xFFFFFF) / 16777216.0f;
  }
}

template <int K, int S>
float run(int T, int I, float* d, float* dc, float* b, float* c, float* a2, float* y) {
  const int blocks = (I * 32 + 127) / 128;
  cudaEvent_t s, e;
  cudaEventCreate(&s);
  cudaEventCreate(&e);
  float best = 1e30f;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(s);
    probe<K, S><<<blocks, 128>>>(d, dc, b, c, a2, y, T, I);
    cudaEventRecord(e);
    cudaEventSynchronize(e);
    float ms;
    cudaEventElapsedTime(&ms, s, e);
    if (r >= 2 && ms < best) best = ms;
  }
  return best * 1000.0f;
}

int main() {
  const int T = 8192, I = 5120;
  float *d, *dc, *b, *c, *a2, *y;
  cudaMalloc(&d, sizeof(float) * size_t(T) * I);
  cudaMalloc(&dc, sizeof(float) * size_t(T) * I);
  cudaMalloc(&y, sizeof(float) * size_t(T) * I);
  cudaMalloc(&b, sizeof(float) * size_t(T) * N);
  cudaMalloc(&c, sizeof(float) * size_t(T) * N);
  cudaMalloc(&a2, sizeof(float) * size_t(I) * N);
  fill<<<1024, 256>>>(d, size_t(T) * I, 0.01f, 0.1f, 1);
  fill<<<1024, 256>>>(dc, size_t(T) * I, -0.1f, 0.1f, 2);
  fill<<<1024, 256>>>(b, size_t(T) * N, -1.0f, 1.0f, 3);
  fill<<<1024, 256>>>(c, size_t(T) * N, -1.0f, 1.0f, 4);
  fill<<<1024, 256>>>(a2, size_t(I) * N, -23.0f, -1.4f, 5);
  cudaDeviceSynchronize();
  std::printf("lanes-over-time core, T %d, I %d, N %d (best of 5, us), K tokens per lane x S states unrolled:\n", T, I, N);
  std::printf("  K=4 S=1 %.1f  K=8 S=1 %.1f  K=16 S=1 %.1f\n", run<4, 1>(T, I, d, dc, b, c, a2, y),
              run<8, 1>(T, I, d, dc, b, c, a2, y), run<16, 1>(T, I, d, dc, b, c, a2, y));
  std::printf("  K=4 S=2 %.1f  K=8 S=2 %.1f  K=4 S=4 %.1f  K=8 S=4 %.1f\n", run<4, 2>(T, I, d, dc, b, c, a2, y),
              run<8, 2>(T, I, d, dc, b, c, a2, y), run<4, 4>(T, I, d, dc, b, c, a2, y), run<8, 4>(T, I, d, dc, b, c, a2, y));
  std::printf("error: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
