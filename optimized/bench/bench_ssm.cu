// hybridtb_bench_ssm [--out FILE.json] [--case NAME] [--prefill-tokens T1,T2,...]: the mamba1
// kernels of the cuda backend's SSM branch (optimized/src/ssm/mamba1_kernels.cu, mamba1_decode.cu)
// on one GPU, in the configuration the backend launches, against ceilings measured in the same run
// (device-to-device copy bandwidth of 1 GiB, the best of three rounds; ex2 throughput with every SM
// full):
//   decode: the single-step state update (launch_mamba1_scan on decode requests) for d_inner 5120,
//           state 16, 64 and 256 sequences; bytes = ssm_state read + write (fp32) + per-token
//           inputs; % of the measured copy bandwidth (read + write counted), of the 1 GiB copy and of
//           a copy of the same bytes (the state pool's size: what a transfer of this size can reach);
//   prefill: the selective scan (gating fused) of one request of 8k and 32k tokens, and the causal
//           conv; tokens/s against t_min = max(bytes / copy bandwidth, D·N·T / ex2 rate)
//           (perf-anchors.md §6.3). "rerun_max_rel_diff_y": y of the timed runs against y of an
//           earlier run, max |Δy| / max |y| (0: the scan is bitwise reproducible).
// --case runs only the case of that name (e.g. "prefill 8k", for a profiler); --prefill-tokens
// replaces the prefill lengths 8192,32768 (multiples of 1024 up to 256k, named "prefill <T/1024>k"),
// e.g. to separate the scan's fixed cost from its cost per token.
// Inputs are deterministic non-zero values (a hash fill); every timing is the median of CUDA-event
// samples after warm-up, with the ssm_state pool restored and L2 flushed (256 MiB read) before
// every sample, outside the events (a 256 MiB read: clean lines, no write-back in the timed region). The GEMMs (cuBLAS) are not timed here. Case names ("name")
// match experiments/peers/torch_mamba1_peer.py's (peer_ratio_ssm.py joins the two JSON files).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_kernels.h"
#include "bench/event_timer.h"
#include "common/cuda_check.h"
#include "ssm/causal_conv.h"
#include "ssm/ssm_kernels.h"

using namespace hybridtb::cuda;
using namespace hybridtb::cuda::ssm;

namespace {

// max |a − b| (max |a| where b is null) over n elements into *out, as the bits of a non-negative
// float (NaN counts as +inf).
__global__ void max_abs_diff_kernel(const float* a, const float* b, int64_t n, unsigned* out) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float d = fabsf(b == nullptr ? a[i] : a[i] - b[i]);
    m = d <= m ? m : (d > m ? d : INFINITY);
  }
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) atomicMax(out, __float_as_uint(m));
}

__global__ void fill_kernel(float* p, int64_t n, float low, float high, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    p[i] = low + (high - low) * static_cast<float>(h & 0xFFFFFF) / 16777216.0f;
  }
}

// The exp ceiling: every thread runs 8 independent chains of ex2.approx (the scan's exp), so the
// special-function units, not latency, bound it; x ← 2^(−x) stays in [0.5, 1], never denormal.
constexpr int kExpChains = 8;
constexpr int kExpSteps = 4096;
__global__ void exp_rate_kernel(float* sink) {
  float x[kExpChains];
#pragma unroll
  for (int c = 0; c < kExpChains; ++c) x[c] = 0.5f + 0.01f * c + 1e-6f * threadIdx.x;
  for (int step = 0; step < kExpSteps; ++step) {
#pragma unroll
    for (int c = 0; c < kExpChains; ++c) {
      float y;
      asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(-x[c]));
      x[c] = y;
    }
  }
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kExpChains; ++c) acc += x[c];
  if (acc == -1.0f) *sink = acc;  // never true; keeps the chains
}

float* device_filled(int64_t n, float low, float high, uint32_t seed) {
  float* p = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float)));
  fill_kernel<<<1024, 256>>>(p, n, low, high, seed);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  return p;
}

template <typename T>
T* upload(const std::vector<T>& v) {
  T* p = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, v.size()) * sizeof(T)));
  HYBRIDTB_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

constexpr int I = 5120, N = 16, K = 4, R = 160;

struct Setup {
  Mamba1Params p;
  CausalConvParams conv;  // mamba1's conv in front of the scan (x + in_proj_bias → c)
  std::vector<void*> owned;
  float* pool_saved = nullptr;  // the ssm_state pool before any run (restored before every sample)
  size_t pool_bytes = 0;
};

// The median of `reps` CUDA-event samples of fn() after `warmup` untimed calls; before every call,
// outside the events: the ssm_state pool restored and L2 flushed (a 256 MiB read, clean lines).
template <typename Fn>
double median_ms_flushed(int reps, int warmup, cudaStream_t stream, const Setup& s, const bench::ReadFlusher& flush,
                         Fn fn) {
  const auto restore_and_flush = [&] {
    HYBRIDTB_CUDA_CHECK(
        cudaMemcpyAsync(s.p.ssm_state.data, s.pool_saved, s.pool_bytes, cudaMemcpyDeviceToDevice, stream));
    flush.flush(stream);
  };
  return bench::median_ms_after(reps, stream, restore_and_flush, fn, warmup);
}

// `requests` requests of `length` tokens each (length 1: decodes), fp32 weights and pools.
Setup make_setup(int requests, int length) {
  Setup s;
  Mamba1Params& p = s.p;
  const int64_t T = int64_t{requests} * length;
  p.I = I;
  p.N = N;
  p.R = R;
  p.num_tokens = T;
  auto own = [&](float* ptr) {
    s.owned.push_back(ptr);
    return ptr;
  };
  p.xz = own(device_filled(T * 2 * I, -1.0f, 1.0f, 1));
  p.c = own(device_filled(T * I, -1.0f, 1.0f, 2));
  p.dbc = own(device_filled(T * (R + 2 * N), -1.0f, 1.0f, 3));
  p.dt = own(device_filled(T * I, -4.6f, -2.3f, 4));  // softplus → Δ ≈ 0.01 … 0.1
  p.y = own(device_filled(T * I, 0.0f, 0.0f, 5));
  p.dt_bias = WeightRef{own(device_filled(I, -0.1f, 0.1f, 8)), ElementKind::kFloat32};
  p.A_log = WeightRef{own(device_filled(int64_t{I} * N, 0.0f, 2.77f, 9)), ElementKind::kFloat32};
  p.D = WeightRef{own(device_filled(I, 0.5f, 1.5f, 10)), ElementKind::kFloat32};
  p.in_bias = WeightRef{own(device_filled(2 * I, -0.1f, 0.1f, 11)), ElementKind::kFloat32};
  const int slots = requests + 1;
  p.ssm_state = PoolRef{own(device_filled(int64_t{slots} * I * N, -1.0f, 1.0f, 12)), ElementKind::kFloat32,
                        int64_t{I} * N};
  CausalConvParams& conv = s.conv;
  conv.channels = I;
  conv.kernel = K;
  conv.num_tokens = T;
  conv.in = RowsRef{const_cast<float*>(p.xz), ElementKind::kFloat32, 2 * I};
  conv.in_bias = p.in_bias;
  conv.weight = WeightRef{own(device_filled(int64_t{I} * K, -0.5f, 0.5f, 6)), ElementKind::kFloat32};
  conv.bias = WeightRef{own(device_filled(I, -0.1f, 0.1f, 7)), ElementKind::kFloat32};
  conv.out = own(device_filled(T * I, 0.0f, 0.0f, 15));
  conv.state = PoolRef{own(device_filled(int64_t{slots} * I * (K - 1), -1.0f, 1.0f, 13)), ElementKind::kFloat32,
                       int64_t{I} * (K - 1)};
  std::vector<GpuRequest> reqs;
  for (int r = 0; r < requests; ++r) {
    GpuRequest q;
    q.begin = r * length;
    q.end = (r + 1) * length;
    q.read_slot = r + 1;
    q.write_slot = r + 1;
    q.decode = length == 1 ? 1 : 0;
    reqs.push_back(q);
  }
  p.wave.requests = upload(reqs);
  p.wave.num_requests = requests;
  p.wave.max_tokens = length;
  p.boundary_slot = upload(std::vector<int32_t>(static_cast<size_t>(T), -1));
  s.owned.insert(s.owned.end(), {(void*)p.wave.requests, (void*)p.boundary_slot});
  conv.wave = p.wave;
  conv.boundary_slot = p.boundary_slot;
  conv.stash = own(device_filled(causal_conv_stash_floats(conv), 0.0f, 0.0f, 14));
  p.decode_end = length == 1 ? requests : 0;
  p.prefill_begin = length == 1 ? requests : 0;
  s.pool_bytes = static_cast<size_t>(slots) * I * N * sizeof(float);
  s.pool_saved = own(device_filled(int64_t{slots} * I * N, 0.0f, 0.0f, 17));
  HYBRIDTB_CUDA_CHECK(cudaMemcpy(s.pool_saved, p.ssm_state.data, s.pool_bytes, cudaMemcpyDeviceToDevice));
  HYBRIDTB_CUDA_CHECK(cudaDeviceSynchronize());
  return s;
}

void release(Setup& s) {
  for (void* p : s.owned) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  std::string only_case;
  std::vector<int> prefill_tokens = {8192, 32768};
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0) out_path = argv[i + 1];
    if (std::strcmp(argv[i], "--case") == 0) only_case = argv[i + 1];
    if (std::strcmp(argv[i], "--prefill-tokens") == 0) {
      prefill_tokens.clear();
      for (const char* t = argv[i + 1]; *t != '\0';) {
        char* end = nullptr;
        const long v = std::strtol(t, &end, 10);
        if (end == t || v <= 0 || v % 1024 != 0 || v > (1 << 18) || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--prefill-tokens: expected a comma-separated list of multiples of 1024 up to 262144, got '%s'\n",
                       argv[i + 1]);
          return 2;
        }
        prefill_tokens.push_back(static_cast<int>(v));
        t = *end == ',' ? end + 1 : end;
      }
    }
  }
  const auto skip = [&](const std::string& name) { return !only_case.empty() && name != only_case; };
  cudaStream_t stream = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaDeviceProp prop{};
  HYBRIDTB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

  // Ceiling: device-to-device copy of 1 GiB (read + write counted), the best of three rounds of 20.
  const bench::CopyCeiling copy = bench::best_copy_bandwidth(int64_t{1} << 30, 20, 3, stream);
  const double copy_bw = copy.best_Bps;
  const double exp_rate_nominal = 4.17e12;  // perf-anchors §6.3 (H100 SXM: 132 SMs × 16 / clock × 1.98 GHz)
  // Ceiling: ex2 throughput measured with every SM full (2048 threads each).
  float* exp_sink = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaMalloc(&exp_sink, sizeof(float)));
  const unsigned exp_blocks = static_cast<unsigned>(prop.multiProcessorCount) * 8;
  const double exp_ms = bench::median_ms(10, stream, [&] { exp_rate_kernel<<<exp_blocks, 256, 0, stream>>>(exp_sink); }, 2);
  const double exp_rate = static_cast<double>(exp_blocks) * 256 * kExpChains * kExpSteps / (exp_ms * 1e-3);
  cudaFree(exp_sink);

  std::string json = "{\n  \"gpu\": \"" + std::string(prop.name) + "\",\n  \"copy_bandwidth_Bps\": " +
                     std::to_string(copy_bw) + ",\n  \"copy_bandwidth_rounds_Bps\": " + copy.rounds_json() +
                     ",\n  \"exp_rate_per_s\": " + std::to_string(exp_rate) +
                     ",\n  \"exp_rate_nominal_per_s\": " + std::to_string(exp_rate_nominal) +
                     ",\n  \"I\": 5120, \"N\": 16, \"K\": 4, \"R\": 160,\n  \"cases\": [\n";
  bool first_case = true;
  auto add_case = [&](const std::string& text) {
    json += (first_case ? "    " : ",\n    ") + text;
    first_case = false;
    std::printf("%s\n", text.c_str());
  };

  const bench::ReadFlusher flush;  // 256 MiB
  const auto num = [](double v) { return std::to_string(v); };
  const auto sci = [](double v) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.3e", v);
    return std::string(text);
  };

  // Case names ("name") match experiments/peers/torch_mamba1_peer.py's; "median_us" is the time.
  for (const int seqs : {64, 256}) {
    if (skip("decode " + std::to_string(seqs) + " seqs")) continue;
    Setup s = make_setup(seqs, 1);
    const double ms = median_ms_flushed(50, 5, stream, s, flush, [&] { launch_mamba1_scan(s.p, stream); });
    // ssm_state read + write, plus dt, c, z in and y out per channel, and B/C per sequence.
    const double state_bytes = seqs * (2.0 * I * N * 4);
    const double bytes = state_bytes + seqs * (4.0 * I * 4 + 2.0 * N * 4);
    const double pct = 100.0 * (bytes / copy_bw) / (ms * 1e-3);
    // The same bytes moved by a device-to-device copy (bytes / 2 read, bytes / 2 written), timed the
    // same way (L2 flushed first): the ceiling for a transfer of this size, launch and ramp included.
    void* copy_src = nullptr;
    void* copy_dst = nullptr;
    const auto half = static_cast<size_t>(bytes / 2);
    HYBRIDTB_CUDA_CHECK(cudaMalloc(&copy_src, half));
    HYBRIDTB_CUDA_CHECK(cudaMalloc(&copy_dst, half));
    HYBRIDTB_CUDA_CHECK(cudaMemset(copy_src, 1, half));
    const double same_size_copy_ms = median_ms_flushed(50, 5, stream, s, flush, [&] {
      HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(copy_dst, copy_src, half, cudaMemcpyDeviceToDevice, stream));
    });
    cudaFree(copy_src);
    cudaFree(copy_dst);
    const double pct_same_size = 100.0 * same_size_copy_ms / ms;
    add_case("{\"name\": \"decode " + std::to_string(seqs) + " seqs\", \"case\": \"decode_state_update\", \"seqs\": " +
             std::to_string(seqs) + ", \"median_us\": " + num(ms * 1e3) + ", \"us\": " + num(ms * 1e3) +
             ", \"bytes\": " + num(bytes) + ", \"state_bytes\": " + num(state_bytes) + ", \"GBps\": " +
             num(bytes / (ms * 1e-3) / 1e9) + ", \"pct_of_copy_bw\": " + num(pct) + ", \"same_size_copy_us\": " +
             num(same_size_copy_ms * 1e3) + ", \"pct_of_same_size_copy\": " + num(pct_same_size) +
             ", \"launches\": 1}");
    release(s);
  }
  for (const int tokens : prefill_tokens) {
    if (skip("prefill " + std::to_string(tokens / 1024) + "k")) continue;
    Setup s = make_setup(1, tokens);
    // y of the timed runs against y of a run of its own, max |Δy| / max |y|: 0 when runs are bitwise
    // reproducible (each timed sample starts from the restored pool, so the last one leaves a
    // complete y).
    const int64_t y_count = int64_t{tokens} * I;
    float* y_first = nullptr;
    unsigned* max_bits = nullptr;
    HYBRIDTB_CUDA_CHECK(cudaMalloc(&y_first, y_count * sizeof(float)));
    HYBRIDTB_CUDA_CHECK(cudaMalloc(&max_bits, sizeof(unsigned)));
    const auto max_abs_diff = [&](const float* a, const float* b) {
      HYBRIDTB_CUDA_CHECK(cudaMemsetAsync(max_bits, 0, sizeof(unsigned), stream));
      max_abs_diff_kernel<<<1024, 256, 0, stream>>>(a, b, y_count, max_bits);
      HYBRIDTB_CUDA_CHECK(cudaGetLastError());
      unsigned bits = 0;
      HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(&bits, max_bits, sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
      HYBRIDTB_CUDA_CHECK(cudaStreamSynchronize(stream));
      float v = 0.0f;
      std::memcpy(&v, &bits, sizeof(v));
      return static_cast<double>(v);
    };
    (void)median_ms_flushed(1, 0, stream, s, flush, [&] { launch_mamba1_scan(s.p, stream); });
    HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(y_first, s.p.y, y_count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    const double y_scale = max_abs_diff(y_first, nullptr);
    const double scan_ms = median_ms_flushed(10, 2, stream, s, flush, [&] { launch_mamba1_scan(s.p, stream); });
    const double rerun_diff = max_abs_diff(s.p.y, y_first) / y_scale;
    cudaFree(y_first);
    cudaFree(max_bits);
    const double conv_ms = median_ms_flushed(10, 2, stream, s, flush, [&] { launch_causal_conv(s.conv, stream); });
    // Minimal traffic of the scan with our float32 I/O: dt, c, z in, y out (4 B each per channel) + B, C.
    const double bytes = static_cast<double>(tokens) * (4.0 * I * 4 + 2.0 * N * 4);
    const double t_bw = bytes / copy_bw;
    const double t_exp = static_cast<double>(I) * N * tokens / exp_rate;
    const double t_min = std::max(t_bw, t_exp);
    add_case("{\"name\": \"prefill " + std::to_string(tokens / 1024) + "k\", \"case\": \"prefill_scan\", \"tokens\": " +
             std::to_string(tokens) + ", \"median_us\": " + num(scan_ms * 1e3) + ", \"scan_us\": " +
             num(scan_ms * 1e3) + ", \"conv_us\": " + num(conv_ms * 1e3) + ", \"scan_tokens_per_s\": " +
             num(tokens / (scan_ms * 1e-3)) + ", \"t_min_bw_us\": " + num(t_bw * 1e6) + ", \"t_min_exp_us\": " +
             num(t_exp * 1e6) + ", \"pct_of_bound\": " + num(100.0 * t_min / (scan_ms * 1e-3)) +
             ", \"rerun_max_rel_diff_y\": " + sci(rerun_diff) + "}");
    release(s);
  }
  json += "\n  ]\n}\n";
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f == nullptr) return 1;
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  cudaStreamDestroy(stream);
  return 0;
}
