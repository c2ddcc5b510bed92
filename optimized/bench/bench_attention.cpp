// hybridtb_bench_attention [--out FILE.json] [--quick] [--filter REGEX] [--mma-decode-split C,MIN,MAX]: times the CUDA
// attention kernels (prepare once, launch timed with CUDA events after an L2 flush by a 256 MiB read, warm-up, median)
// on Llama-3-8B shapes (32 query / 8 kv heads, head 128 (the d64 / d256 rows: 64 / 256), bf16, block 16, shuffled paged
// KV unless the row says), with the ceilings measured in the same run (read-only streaming kernel and D2D copy for
// bandwidth, a cuBLAS bf16 GEMM for tensor-core FLOP/s; beside each decode row, that read kernel over the row's own
// bytes in one launch, timed the same way: sized_read_us). Bytes count each in-window K/V byte once plus Q and O; FLOPs
// are 4·D·Hq·(visible query-key pairs): a window counts only its in-window pairs. One KV cache, sized for the largest
// case, is allocated once and serves every case. Prefill cases: 1×2k/4k/8k/32k tokens, no window and window 4096, on
// the tensor-core path, plus 1×4k on the generic SIMT kernel for comparison; 1-byte KV caches (fp8 e4m3/e5m2 per
// tensor, int8/fp8 per token-head) for prefill and decode, their bytes counted at one per element; the mixed steps
// (2048 fresh tokens or a 2048-token chunk at context 4096, each beside 64 decodes at 4k) run as planned (one grid, or
// on Hopper the wgmma prefill and the decode apart where the prefill outweighs the decodes), in their "separate" rows
// as separate launches, and in their "mma.sync" rows (Hopper) in one grid on the pinned mma.sync prefill body; the
// first is also reported as a ratio to the sum of its parts (decode 64×4k + prefill 1×2k), each as a ratio to its
// separate launches. --filter runs only the cases whose name matches REGEX (ECMAScript, anywhere in the name; the
// ceilings are measured all the same). --mma-decode-split replaces the tensor-core decode kernel's key-split policy
// (about C CTAs per SM, splits of MIN to MAX keys; attention_work_plan.h) for every case, to tune it. Run by
// harness/scripts/gpu-check.sh.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "attention/attention_caps.h"
#include "attention/attention_plan.h"
#include "bench/bench_kernels.h"
#include "bench/event_timer.h"
#include "common/cuda_check.h"
#include "common/device_memory.h"
#include "hybridtb/revision.h"

namespace {

using namespace hybridtb;
using namespace hybridtb::cuda;

struct Request {
  int64_t context_len;
  int64_t query_len;
};

// Where a case's pages lie in the cache: shuffled over every request's blocks (the default, as an
// allocator's free list leaves them after a while), in order (request after request, block after
// block), or, for a window, only the window's pages allocated (shuffled) and the blocks wholly
// before it pointing at the null block 0, as vLLM's sliding-window manager frees them.
enum class PageLayout { kShuffled, kInOrder, kWindowOnly };

struct BenchCase {
  std::string name;
  std::string kind;  // decode | prefill | mixed
  std::vector<Request> requests;
  int64_t window = 0;
  bool generic = false;  // keep non-decode rows on the generic SIMT kernel (the before/after line)
  int variant = -1;      // prefill tile variant (-1: the default for the head size)
  KvCacheDtype kv = KvCacheDtype::kAuto;
  bool simt_decode = false;  // decode rows on the SIMT decode kernel (the tensor-core kernel's comparison)
  bool separate_mixed = false;  // a mixed step's prefill and decode kernels launched apart (no mixed grid)
  int64_t block_size = 16;      // KV cache page (vLLM's default; hybrid models' pages are often larger)
  int64_t head_size = 128;      // Llama-3-8B's; the d64 / d256 rows time the other head sizes
  bool short_queries_as_prefill = false;  // short queries as prefill items, not decode rows per token
  PageLayout pages = PageLayout::kShuffled;
};

std::vector<Request> repeat(int64_t count, Request r) { return std::vector<Request>(static_cast<size_t>(count), r); }

constexpr int64_t kNumHeads = 32;    // Llama-3-8B's query heads
constexpr int64_t kNumKvHeads = 8;   // and kv heads

// The first key a request's first query token sees (0 without a window).
int64_t window_first_key(const BenchCase& bc, const Request& r) {
  return bc.window > 0 ? std::max<int64_t>(0, r.context_len - bc.window + 1) : 0;
}

// A request's first allocated block: the blocks before it point at the null block (window-only pages).
int64_t first_kept_block(const BenchCase& bc, const Request& r) {
  return bc.pages == PageLayout::kWindowOnly ? window_first_key(bc, r) / bc.block_size : 0;
}

const char* to_string(PageLayout pages) {
  switch (pages) {
    case PageLayout::kInOrder:
      return "in order";
    case PageLayout::kWindowOnly:
      return "window only";
    case PageLayout::kShuffled:
      break;
  }
  return "shuffled";
}

// The case's cache blocks: every request's allocated blocks plus the null block 0.
int64_t num_cache_blocks(const BenchCase& bc) {
  int64_t blocks = 1;
  for (const Request& r : bc.requests) {
    blocks += (r.context_len + r.query_len + bc.block_size - 1) / bc.block_size - first_kept_block(bc, r);
  }
  return blocks;
}

int64_t cache_bytes(const BenchCase& bc) {
  const int64_t element_bytes = element_size(kv_storage_dtype(bc.kv, DType::kBFloat16));
  return num_cache_blocks(bc) * 2 * bc.block_size * kNumKvHeads * bc.head_size * element_bytes;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { HYBRIDTB_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(bytes, 256))); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};



// What a recorded result must carry: commit, build, date, driver/runtime and the device's maximum
// clocks (bench::device_facts).
nlohmann::json run_environment() {
  const bench::DeviceFacts facts = bench::device_facts();
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"commit", hybridtb::source_revision().label()},
          {"build_type", HYBRIDTB_BUILD_TYPE},
          {"date_utc", date},
          {"cuda_driver_version", facts.cuda_driver_version},
          {"cuda_runtime_version", facts.cuda_runtime_version},
          {"max_sm_clock_mhz", facts.max_sm_clock_mhz},
          {"max_mem_clock_mhz", facts.max_mem_clock_mhz}};
}

// Runs one case with its KV cache at the start of `cache_arena` (at least cache_bytes(bc) bytes), L2
// flushed by `flusher` before every timed launch.
nlohmann::json run_case(const BenchCase& bc, void* cache_arena, const bench::ReadFlusher& flusher, int num_sms,
                        cudaStream_t stream, bool quick, const std::optional<DecodeSplitPolicy>& mma_decode_split) {
  AttentionConfig config;
  config.num_heads = kNumHeads;
  config.num_kv_heads = kNumKvHeads;
  config.head_size = bc.head_size;
  config.block_size = bc.block_size;
  config.scale = 1.0 / std::sqrt(static_cast<double>(bc.head_size));
  config.dtype = DType::kBFloat16;
  config.kv_cache_dtype = bc.kv;
  config.sliding_window = bc.window;
  const int64_t bs = config.block_size;
  const int64_t hq = config.num_heads;
  const int64_t hkv = config.num_kv_heads;
  const int64_t d = config.head_size;

  // Batch: physical blocks laid out as bc.pages says (block 0 reserved as vLLM's null block).
  BatchDescription batch;
  std::vector<int32_t> qsl{0};
  std::vector<int32_t> seq_lens;
  int64_t max_blocks = 1;
  for (const Request& r : bc.requests) {
    qsl.push_back(static_cast<int32_t>(qsl.back() + r.query_len));
    seq_lens.push_back(static_cast<int32_t>(r.context_len + r.query_len));
    max_blocks = std::max(max_blocks, (r.context_len + r.query_len + bs - 1) / bs);
  }
  const int64_t num_blocks = num_cache_blocks(bc);
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::mt19937_64 rng(42);
  if (bc.pages != PageLayout::kInOrder) std::shuffle(ids.begin(), ids.end(), rng);
  const auto num_reqs = static_cast<int64_t>(bc.requests.size());
  batch.query_start_loc = IntArray::vector(qsl);
  batch.seq_lens = IntArray::vector(seq_lens);
  batch.block_table = IntArray::matrix(num_reqs, max_blocks, 0);
  size_t next = 0;
  int64_t pairs = 0;      // visible (query, key) pairs
  int64_t kv_tokens = 0;  // distinct keys read per kv head (each once)
  for (int64_t r = 0; r < num_reqs; ++r) {
    const Request& q = bc.requests[static_cast<size_t>(r)];
    const int64_t seq = q.context_len + q.query_len;
    for (int64_t b = first_kept_block(bc, q); b < (seq + bs - 1) / bs; ++b) {
      batch.block_table.at(r, b) = ids[next++];
    }
    for (int64_t i = 0; i < q.query_len; ++i) {
      const int64_t p = q.context_len + i;
      batch.slot_mapping.push_back(static_cast<int64_t>(batch.block_table.at(r, p / bs)) * bs + p % bs);
      pairs += bc.window > 0 ? std::min<int64_t>(bc.window, p + 1) : p + 1;
    }
    kv_tokens += seq - window_first_key(bc, q);
  }
  batch.num_actual_tokens = qsl.back();
  const int64_t t = batch.num_actual_tokens;

  // The cache in its storage dtype (1 byte for fp8/int8), per-token-head scales near 1/32 for int8
  // (its values are 32·N(0, 1)) and near 1 for fp8, so every case attends over O(1) data.
  const DType storage = kv_storage_dtype(bc.kv, config.dtype);
  const int64_t element_bytes = element_size(storage);
  const int64_t cache_elements = num_blocks * 2 * bs * hkv * d;
  DeviceBuffer query(static_cast<size_t>(t * hq * d * 2));
  DeviceBuffer output(static_cast<size_t>(t * hq * d * 2));
  const int64_t scale_elements = num_blocks * bs * hkv;
  DeviceBuffer k_scales(static_cast<size_t>(scale_elements * 4));
  DeviceBuffer v_scales(static_cast<size_t>(scale_elements * 4));
  if (element_bytes == 2) {
    bench::fill_normal_16bit(cache_arena, cache_elements, false, 3, stream);
  } else {
    const bench::ByteElement kind = storage == DType::kInt8         ? bench::ByteElement::kInt8
                                    : storage == DType::kFloat8E5M2 ? bench::ByteElement::kFp8E5M2
                                                                    : bench::ByteElement::kFp8E4M3;
    bench::fill_bytes(cache_arena, cache_elements, kind, 3, stream);
    const float per_token = storage == DType::kInt8 ? 1.0f / 32.0f : 1.0f;
    const std::vector<float> scales(static_cast<size_t>(scale_elements), per_token);
    HYBRIDTB_CUDA_CHECK(cudaMemcpy(k_scales.ptr, scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
    HYBRIDTB_CUDA_CHECK(cudaMemcpy(v_scales.ptr, scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
  }
  bench::fill_normal_16bit(query.ptr, t * hq * d, false, 4, stream);
  StepTensors tensors;
  tensors.query = TensorView(query.ptr, DType::kBFloat16, {t, hq, d}, Device::kCuda);
  tensors.kv_cache = TensorView(cache_arena, storage, {num_blocks, 2, bs, hkv, d}, Device::kCuda);
  if (is_per_token_head(bc.kv)) {
    tensors.k_scale_cache = TensorView(k_scales.ptr, DType::kFloat32, {num_blocks, bs, hkv}, Device::kCuda);
    tensors.v_scale_cache = TensorView(v_scales.ptr, DType::kFloat32, {num_blocks, bs, hkv}, Device::kCuda);
  } else if (is_quantized(bc.kv)) {
    tensors.k_scale = 0.5f;
    tensors.v_scale = 0.25f;
  }
  const TensorView out(output.ptr, DType::kBFloat16, {t, hq, d}, Device::kCuda);

  DeviceMemory memory;
  AttentionPathOverrides overrides;
  overrides.generic_prefill = bc.generic;
  overrides.prefill_variant = bc.variant;
  overrides.simt_decode = bc.simt_decode;
  overrides.separate_mixed = bc.separate_mixed;
  overrides.mma_decode_split = mma_decode_split;
  overrides.short_queries_as_prefill = bc.short_queries_as_prefill;
  AttentionRunner runner(config, memory, num_sms, overrides);
  runner.prepare(batch, tensors, out, stream);
  runner.launch(stream);  // warm-up
  runner.launch(stream);
  HYBRIDTB_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto flush_l2 = [&] { flusher.flush(stream); };
  const double once = bench::median_ms_after(1, stream, flush_l2, [&] { runner.launch(stream); });
  const int reps = std::clamp(static_cast<int>((quick ? 100.0 : 300.0) / std::max(once, 1e-3)), 5, 50);
  const double ms = bench::median_ms_after(reps, stream, flush_l2, [&] { runner.launch(stream); });

  const double bytes = static_cast<double>(kv_tokens) * static_cast<double>(hkv * d * 2 * element_bytes) +
                       2.0 * static_cast<double>(t * hq * d * 2);
  const double flops = 4.0 * static_cast<double>(d * hq) * static_cast<double>(pairs);
  nlohmann::json j;
  j["name"] = bc.name;
  j["kind"] = bc.kind;
  j["window"] = bc.window;
  j["pages"] = to_string(bc.pages);
  j["block_size"] = bc.block_size;
  j["head_size"] = bc.head_size;
  j["median_us"] = ms * 1e3;
  j["reps"] = reps;
  j["bytes"] = bytes;
  j["GBps"] = bytes / (ms * 1e-3) / 1e9;
  j["flops"] = flops;
  j["TFLOPs"] = flops / (ms * 1e-3) / 1e12;
  j["plan"] = runner.summary().describe();
  j["mixed_grid"] = runner.summary().mixed();
  if (bc.kind == "decode") {
    // The same bytes read by one launch of the read ceiling's kernel, timed the same way: what a
    // one-launch read of this size costs, launch, ramp and tail included (the 4 GiB ceiling hides them).
    const int64_t read_bytes = std::min(static_cast<int64_t>(bytes), cache_elements * element_bytes) / 16 * 16;
    const double read_ms =
        bench::median_ms_after(reps, stream, flush_l2, [&] { bench::enqueue_read(cache_arena, read_bytes, stream); });
    j["sized_read_us"] = read_ms * 1e3;
    j["pct_of_sized_read"] = 100.0 * read_ms / ms;
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  bool quick = false;
  std::string filter;
  std::optional<DecodeSplitPolicy> mma_decode_split;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--filter" && i + 1 < argc) {
      filter = argv[++i];
    } else if (arg == "--mma-decode-split" && i + 1 < argc) {
      DecodeSplitPolicy policy{};
      char tail = 0;
      const int fields =
          std::sscanf(argv[++i], "%ld,%ld,%ld%c", &policy.ctas_per_sm, &policy.min_keys, &policy.max_keys, &tail);
      if (fields != 3 ||
          policy.ctas_per_sm < 1 || policy.min_keys < 64 || policy.max_keys < policy.min_keys ||
          !std::has_single_bit(static_cast<uint64_t>(policy.min_keys)) ||
          !std::has_single_bit(static_cast<uint64_t>(policy.max_keys))) {
        std::cerr << "hybridtb_bench_attention: --mma-decode-split takes CTAS_PER_SM,MIN_KEYS,MAX_KEYS with "
                     "CTAS_PER_SM >= 1 and MIN_KEYS <= MAX_KEYS powers of two from 64, got '" << argv[i] << "'\n";
        return 2;
      }
      mma_decode_split = policy;
    } else {
      std::cerr << "usage: hybridtb_bench_attention [--out FILE.json] [--quick] [--filter REGEX] "
                   "[--mma-decode-split C,MIN,MAX]\n";
      return 2;
    }
  }
  try {
    cudaDeviceProp prop{};
    HYBRIDTB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream;
    HYBRIDTB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    nlohmann::json report;
    report["device"] = prop.name;
    report["sms"] = prop.multiProcessorCount;
    report["environment"] = run_environment();
    if (mma_decode_split) {
      report["mma_decode_split"] = {{"ctas_per_sm", mma_decode_split->ctas_per_sm},
                                    {"min_keys", mma_decode_split->min_keys},
                                    {"max_keys", mma_decode_split->max_keys}};
    }
    const double read = bench::measure_read_bandwidth(int64_t{4} << 30, 10, stream);
    const double copy = bench::measure_copy_bandwidth(int64_t{2} << 30, 10, stream);
    const double gemm = bench::measure_bf16_gemm_tflops(stream);
    report["ceilings"] = {{"read_GBps", read / 1e9}, {"copy_GBps", copy / 1e9}, {"bf16_gemm_TFLOPs", gemm}};
    std::vector<BenchCase> cases = {
        {"decode 64x4k", "decode", repeat(64, {4095, 1})},
        {"decode 256x4k", "decode", repeat(256, {4095, 1})},
        {"decode 64x4k w4096", "decode", repeat(64, {4095, 1}), 4096},
        {"decode 1x32k", "decode", repeat(1, {32767, 1})},
        {"decode 4x32k", "decode", repeat(4, {32767, 1})},
        {"decode 8x32k", "decode", repeat(8, {32767, 1})},
        {"decode 64x32k", "decode", repeat(64, {32767, 1})},
        {"decode 64x32k w4096", "decode", repeat(64, {32767, 1}), 4096},
        // The same steps with the pages in order, and with only the window's pages allocated: what
        // the scattered pages of a large cache cost the windowed rows (their keys are 256 pages of
        // 64 KiB per request, over an 8.6 GB cache at 32k; 1.1 GB with the window's pages alone).
        {.name = "decode 64x4k pages in order", .kind = "decode", .requests = repeat(64, {4095, 1}),
         .pages = PageLayout::kInOrder},
        {.name = "decode 64x32k w4096 pages in order", .kind = "decode", .requests = repeat(64, {32767, 1}),
         .window = 4096, .pages = PageLayout::kInOrder},
        {.name = "decode 64x32k w4096 window pages only", .kind = "decode", .requests = repeat(64, {32767, 1}),
         .window = 4096, .pages = PageLayout::kWindowOnly},
        {"prefill 1x2k", "prefill", repeat(1, {0, 2048})},
        {"prefill 1x4k", "prefill", repeat(1, {0, 4096})},
        {"prefill 1x4k generic", "prefill", repeat(1, {0, 4096}), 0, true},
        {"prefill 1x8k", "prefill", repeat(1, {0, 8192})},
        {"prefill 1x8k w4096", "prefill", repeat(1, {0, 8192}), 4096},
        {"prefill 1x32k", "prefill", repeat(1, {0, 32768})},
        // Pages of 32 and 64 tokens: the wgmma kernel's TMA copies 4 or 2 boxes per slab and K/V of a
        // tile, not 8.
        {"prefill 1x8k block32", "prefill", repeat(1, {0, 8192}), 0, false, -1, KvCacheDtype::kAuto, false, false, 32},
        {"prefill 1x8k block64", "prefill", repeat(1, {0, 8192}), 0, false, -1, KvCacheDtype::kAuto, false, false, 64},
        {"prefill 1x32k w4096", "prefill", repeat(1, {0, 32768}), 4096},
        // Head sizes 64 and 256 (32 query / 8 kv heads as above; FLOPs and bytes at that D): the
        // default (on Hopper the wgmma kernel: D 64 tiles of 128 keys in six stages, D 256 64 keys in
        // two) and, in the "mma.sync" rows, the mma.sync one-m-tile variant (the default elsewhere).
        {.name = "prefill 1x8k d64", .kind = "prefill", .requests = repeat(1, {0, 8192}), .head_size = 64},
        {.name = "prefill 1x8k d256", .kind = "prefill", .requests = repeat(1, {0, 8192}), .head_size = 256},
        {.name = "prefill 1x8k d64 mma.sync", .kind = "prefill", .requests = repeat(1, {0, 8192}),
         .variant = kPrefillOneMTile, .head_size = 64},
        {.name = "prefill 1x8k d256 mma.sync", .kind = "prefill", .requests = repeat(1, {0, 8192}),
         .variant = kPrefillOneMTile, .head_size = 256},
        // The other tile variants of the prefill kernel at D 128 (prefill_config in
        // attention_caps.h; the default is 1 = 2 m-tiles per warp, 128 rows × 32 keys): 0 = 64
        // rows × 64 keys, 2 = 64 rows × 32 keys at 3 CTAs per SM.
        {"prefill 1x4k v0", "prefill", repeat(1, {0, 4096}), 0, false, 0},
        {"prefill 1x4k v2", "prefill", repeat(1, {0, 4096}), 0, false, 2},
        {"prefill 1x8k v0", "prefill", repeat(1, {0, 8192}), 0, false, 0},
        // On a compute capability 9.0 device the default is the Hopper wgmma kernel (variant 3,
        // prefill_wgmma_kernel.cuh) above kWgmmaPrefillMinFlops; these rows time the mma.sync
        // default (1) beside it and both kernels pinned at 2k, the smallest prompt the threshold
        // was set from. Left out where wgmma is not built or not Hopper.
        {"prefill 1x2k wgmma", "prefill", repeat(1, {0, 2048}), 0, false, kPrefillWgmma},
        {"prefill 1x2k mma.sync", "prefill", repeat(1, {0, 2048}), 0, false, kPrefillTwoMTiles},
        {"prefill 1x4k mma.sync", "prefill", repeat(1, {0, 4096}), 0, false, kPrefillTwoMTiles},
        {"prefill 1x8k mma.sync", "prefill", repeat(1, {0, 8192}), 0, false, kPrefillTwoMTiles},
        {"prefill 1x8k w4096 mma.sync", "prefill", repeat(1, {0, 8192}), 4096, false, kPrefillTwoMTiles},
        {"prefill 1x32k mma.sync", "prefill", repeat(1, {0, 32768}), 0, false, kPrefillTwoMTiles},
        // 1-byte KV caches (per-tensor fp8 scales 0.5 / 0.25; per-token-head scale caches): bytes
        // counted at one per element; compare with the bf16-cache case of the same shape. On a
        // compute capability 9.0 device they run the wgmma kernel (its producer casts the bytes); the
        // "mma.sync" rows pin the mma.sync kernel's per-tile cast beside them.
        {"prefill 1x4k fp8_e4m3", "prefill", repeat(1, {0, 4096}), 0, false, -1, KvCacheDtype::kFp8E4M3},
        {"prefill 1x4k fp8_e5m2", "prefill", repeat(1, {0, 4096}), 0, false, -1, KvCacheDtype::kFp8E5M2},
        {"prefill 1x4k int8_pth", "prefill", repeat(1, {0, 4096}), 0, false, -1, KvCacheDtype::kInt8PerTokenHead},
        {"prefill 1x4k fp8_pth", "prefill", repeat(1, {0, 4096}), 0, false, -1, KvCacheDtype::kFp8PerTokenHead},
        {"prefill 1x8k fp8_e4m3", "prefill", repeat(1, {0, 8192}), 0, false, -1, KvCacheDtype::kFp8E4M3},
        {"prefill 1x8k fp8_e4m3 mma.sync", "prefill", repeat(1, {0, 8192}), 0, false, kPrefillTwoMTiles,
         KvCacheDtype::kFp8E4M3},
        {"prefill 1x4k int8_pth mma.sync", "prefill", repeat(1, {0, 4096}), 0, false, kPrefillTwoMTiles,
         KvCacheDtype::kInt8PerTokenHead},
        {"prefill 1x32k fp8_e4m3", "prefill", repeat(1, {0, 32768}), 0, false, -1, KvCacheDtype::kFp8E4M3},
        {"prefill 1x32k w4096 fp8_e4m3", "prefill", repeat(1, {0, 32768}), 4096, false, -1, KvCacheDtype::kFp8E4M3},
        {"decode 64x4k fp8_e4m3", "decode", repeat(64, {4095, 1}), 0, false, -1, KvCacheDtype::kFp8E4M3},
        {"decode 64x4k fp8_e4m3 simt", "decode", repeat(64, {4095, 1}), 0, false, -1, KvCacheDtype::kFp8E4M3, true},
        {"decode 64x4k int8_pth", "decode", repeat(64, {4095, 1}), 0, false, -1, KvCacheDtype::kInt8PerTokenHead},
        {"decode 64x4k fp8_pth", "decode", repeat(64, {4095, 1}), 0, false, -1, KvCacheDtype::kFp8PerTokenHead},
        {"decode 8x32k fp8_e4m3", "decode", repeat(8, {32767, 1}), 0, false, -1, KvCacheDtype::kFp8E4M3},
    };
    // Mixed steps as the planner runs them (one grid of the mixed kernel, or on Hopper, where the
    // prefill outweighs the decodes, the wgmma prefill and the decode apart: kMixedGridMaxFlopsPerByte),
    // the same steps with the prefill and decode kernels launched one after the other ("separate"),
    // and on Hopper with the mma.sync prefill variant pinned, which always takes the one grid.
    std::vector<Request> mixed = repeat(64, {4095, 1});
    mixed.push_back({0, 2048});
    std::vector<Request> chunk = repeat(64, {4095, 1});
    chunk.push_back({4096, 2048});
    for (const auto& [name, requests] : {std::pair{std::string("mixed 2048+64x4k"), mixed},
                                         std::pair{std::string("mixed 2048 chunk at context 4096 + 64x4k"), chunk}}) {
      BenchCase one_grid{name, "mixed", requests};
      BenchCase separate = one_grid;
      separate.name += " separate";
      separate.separate_mixed = true;
      BenchCase mma_sync = one_grid;
      mma_sync.name += " mma.sync";
      mma_sync.variant = kPrefillTwoMTiles;
      cases.push_back(one_grid);
      cases.push_back(separate);
      cases.push_back(mma_sync);
    }
    // Speculative decode steps (each request's 1 + num_speculative_tokens query rows; the standard
    // suite's s64x4@4k, and s64x2@8k beside 64 decodes at 8k): as planned, one decode row per query
    // token (kDecodeRowsMaxQueryLen), and as prefill items. Bytes count each request's keys once.
    std::vector<Request> speculative_8k = repeat(64, {8190, 2});
    for (const Request& r : repeat(64, {8191, 1})) speculative_8k.push_back(r);
    for (const auto& [name, requests] : {std::pair{std::string("speculative 64x4@4k"), repeat(64, {4092, 4})},
                                         std::pair{std::string("speculative 64x2@8k + 64x8k"), speculative_8k}}) {
      BenchCase decode_rows{name, "decode", requests};
      BenchCase prefill_items = decode_rows;
      prefill_items.name += " as prefill items";
      prefill_items.short_queries_as_prefill = true;
      cases.push_back(decode_rows);
      cases.push_back(prefill_items);
    }
    if (!prefill_wgmma_built() || prop.major != 9 || prop.minor != 0) {
      std::fprintf(stderr, "mma.sync and wgmma rows left out (the default rows run mma.sync): %s\n",
                   prefill_wgmma_built() ? "the device is not compute capability 9.0" : "no sm_90a code in this build");
      std::erase_if(cases, [](const BenchCase& bc) {
        return bc.name.ends_with(" mma.sync") || bc.name.ends_with(" wgmma");
      });
    }
    if (!filter.empty()) {
      const std::regex wanted(filter);
      std::erase_if(cases, [&](const BenchCase& bc) { return !std::regex_search(bc.name, wanted); });
    }
    // One KV cache for the whole run, allocated once (as a serving engine allocates its cache at start)
    // and sized for the largest case; each case lays its pages out from its start. A cache allocated
    // per case, after a larger one was freed, read up to 12% slower on the H200 with the same pages
    // (the bandwidth-bound decode rows at 84% of the read ceiling in one process, 94% in another).
    int64_t arena_bytes = 0;
    for (const BenchCase& bc : cases) arena_bytes = std::max(arena_bytes, cache_bytes(bc));
    const DeviceBuffer cache_arena(static_cast<size_t>(arena_bytes));
    const bench::ReadFlusher flusher;
    nlohmann::json results = nlohmann::json::array();
    // %sized: a decode row's time against one launch reading its bytes (sized_read_us).
    std::printf("%-22s %10s %9s %7s %7s %9s  %s\n", "case", "median_us", "GB/s", "%read", "%sized", "TFLOP/s", "plan");
    for (const BenchCase& bc : cases) {
      nlohmann::json j =
          run_case(bc, cache_arena.ptr, flusher, prop.multiProcessorCount, stream, quick, mma_decode_split);
      j["pct_of_read_ceiling"] = 100.0 * j["GBps"].get<double>() * 1e9 / read;
      j["pct_of_gemm_ceiling"] = 100.0 * j["TFLOPs"].get<double>() / gemm;
      const std::string sized =
          j.contains("pct_of_sized_read") ? detail::concat(std::lround(j["pct_of_sized_read"].get<double>()), "%") : "-";
      std::printf("%-22s %10.1f %9.1f %6.1f%% %7s %9.1f  %s\n", bc.name.c_str(), j["median_us"].get<double>(),
                  j["GBps"].get<double>(), j["pct_of_read_ceiling"].get<double>(), sized.c_str(),
                  j["TFLOPs"].get<double>(), j["plan"].get<std::string>().c_str());
      std::fflush(stdout);
      results.push_back(j);
    }
    report["cases"] = results;
    // The mixed step against the sum of its parts (target: at most 1.1x) and against its separate
    // launches.
    double mixed_us = 0, decode_us = 0, prefill_us = 0;
    for (const nlohmann::json& j : results) {
      if (j["name"] == "mixed 2048+64x4k") mixed_us = j["median_us"].get<double>();
      if (j["name"] == "decode 64x4k") decode_us = j["median_us"].get<double>();
      if (j["name"] == "prefill 1x2k") prefill_us = j["median_us"].get<double>();
    }
    if (mixed_us > 0 && decode_us > 0 && prefill_us > 0) {  // all three rows ran (--filter may leave some out)
      report["mixed_over_parts"] = mixed_us / (decode_us + prefill_us);
      std::printf("mixed step %.1f us = %.2fx (decode 64x4k %.1f + prefill 1x2k %.1f)\n", mixed_us,
                  mixed_us / (decode_us + prefill_us), decode_us, prefill_us);
    }
    // Each mixed row (as planned, and with mma.sync pinned) over its step's separate launches.
    nlohmann::json over_separate = nlohmann::json::object();
    for (const nlohmann::json& j : results) {
      const std::string name = j["name"].get<std::string>();
      if (j["kind"] != "mixed" || name.ends_with(" separate")) continue;
      const std::string step = name.ends_with(" mma.sync") ? name.substr(0, name.size() - 9) : name;
      for (const nlohmann::json& k : results) {
        if (k["name"] != step + " separate") continue;
        const double ratio = j["median_us"].get<double>() / k["median_us"].get<double>();
        over_separate[name] = ratio;
        std::printf("%s: %.1f us = %.2fx separate launches %.1f us (%s)\n", name.c_str(), j["median_us"].get<double>(),
                    ratio, k["median_us"].get<double>(), j["mixed_grid"].get<bool>() ? "one grid" : "apart");
      }
    }
    if (!over_separate.empty()) report["mixed_over_separate"] = over_separate;
    std::printf("ceilings: read %.0f GB/s, copy %.0f GB/s (read+write), bf16 GEMM %.0f TFLOP/s\n", read / 1e9,
                copy / 1e9, gemm);
    std::printf("note: each row's plan names its prefill kernel; 'mma.sync' rows pin the mma.sync one, 'generic' rows "
                "the SIMT kernel\n");
    if (!out_path.empty()) {
      std::ofstream(out_path) << report.dump(2) << "\n";
    }
    HYBRIDTB_CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::cerr << "hybridtb_bench_attention: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
