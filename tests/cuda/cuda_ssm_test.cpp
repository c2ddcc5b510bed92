// The SSM branch of the "cuda" backend against the reference, for every mode (zero,
// prefix_sum_flat, prefix_sum, ema, mamba1, mamba2, gdn) and every mamba_cache_mode (none, all, align) on mixed
// batches (decodes with context, a decode without context, continued chunks, fresh prefills, a
// long prefill crossing many scan chunks, CUDA-graph padding): the contribution, the fused output
// and every state pool within the tolerance table (compare_step, as `hybridtb parity`), padding
// rows never written, slots no request names untouched (byte for byte), a mode without a GPU
// implementation refused with NotSupported, chunked prefill == one-shot prefill on the GPU, and
// bitwise run-to-run reproducibility; for mamba1 also decode-only steps (the scan's single decode
// launch), long single requests of a length no chunk size divides, 16-bit pools on the vector
// state path and odd sizes (partial channel tiles and state quads) on the scalar one; for gdn also
// Qwen3-Next's head dims (128: prefills over many 64-token WY chunks, CUDA-graph decodes) and its 32
// value heads over 16 key heads (the prefill state pass's 32-row tiles, full and partial), a
// square 32 × 32 state (a transposed pool would be caught), dk ≠ dv both ways, odd dims on the
// scalar paths, 16-bit pools and every cache mode; for mamba2 also grouped B/C (8 heads, 2 groups),
// Mamba-2's head_dim 64 × state 128 (prefills over many 128-token SSD chunks, chunks cut at block
// boundaries, CUDA-graph decodes), two P tiles with a partial N tile, state 256, odd sizes on the
// scalar paths and 16-bit pools. Decode-only
// steps padded for a full CUDA graph (FULL_DECODE_ONLY, every mode and cache mode) run as the
// fixed-shape decode step (optimized/src/ssm/ssm_gpu_mode.h, FixedDecodeStep), checked here through
// the backend (parity, padding rows and padding requests' slots untouched, reproducible) and
// directly (CudaSsmFixedStep): a step re-prepared for batch B gives the bits of a fresh step for B,
// a captured CUDA graph replayed after prepare(B) too, the eager backend the same bits, skipped
// requests zeros, shared slots refused (and run in waves eagerly), shape/tensor changes refused.
// The chunked prefills with 16-bit product operands (mamba2, gdn) against the table's 16-bit row;
// both also with their mma.sync bodies asked for (CudaSsmMmaSyncPrefill: Mamba-2's chunk states and
// chunk scan, GDN's state pass), the bodies of every GPU but compute capability 9.0, where the
// default is the wgmma one.
// Skips with the reason on a machine without a CUDA device.
// Run: ctest --test-dir <build> -L cuda   (cases named Small* are the compute-sanitizer subset)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/device_memory.h"
#include "common/kernel_attributes.h"
#include "cuda_cases.h"
#include "cuda_compare.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"
#include "ssm/gdn_kernels.h"
#include "ssm/mamba2_kernels.h"
#include "ssm/ssm_gpu_mode.h"
#include "test_paths.h"

namespace hybridtb::testing {
namespace {

// mamba1 with I 20, N 6, K 3, R 5: partial channel tiles, partial state quads, unaligned B/C.
const std::map<std::string, int64_t> kMamba1Odd = {
    {"intermediate_size", 20}, {"state_size", 6}, {"conv_kernel", 3}, {"dt_rank", 5}};

// A case of this file: the SSM branch beside a small attention layer (4 query heads of 32 over 2
// KV heads), on its own slot table.
CudaCase ssm_case(CudaCase c) {
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_size = 32;
  c.ssm_block_table = true;
  return c;
}

// Decodes first (the Mamba builder requires it): with context, without context (fresh, one
// token); then a continued chunk, fresh prefills, and a long one (many scan chunks, block
// boundaries in every chunk).
const std::vector<RequestSpec> kMixed = {{40, 1}, {7, 1}, {0, 1}, {50, 30}, {0, 21}, {17, 300}};
const std::vector<RequestSpec> kSmall = {{20, 1}, {0, 1}, {5, 19}, {0, 9}};
const std::vector<RequestSpec> kDecodes = {{20, 1}, {3, 1}, {60, 1}, {31, 1}};
const std::vector<RequestSpec> kLong = {{0, 1}, {100, 700}};
// One long request alone: many scan chunks, a length that is no multiple of any chunk size.
const std::vector<RequestSpec> kLongSingle = {{37, 1001}};
// Decodes only (no prefill launch), more than one block of channels per request when I = 64.
const std::vector<RequestSpec> kManyDecodes = {{20, 1}, {3, 1}, {60, 1}, {31, 1}, {1, 1}, {90, 1}, {0, 1}};
// Decode-only steps for a full CUDA graph (capture sizes 1, 2, 4, 8): with context, without
// (fresh: starts from zeros), a token crossing into a new mamba block (context 16: mode all reads
// block 0 and writes block 1), a token ending a block (context 15); padded with 3 requests and 3
// token rows to the capture size 8. kGraphDecodesB has the same padded shape (batch B of a replay).
const std::vector<RequestSpec> kGraphDecodes = {{20, 1}, {0, 1}, {16, 1}, {15, 1}, {47, 1}};
const std::vector<RequestSpec> kGraphDecodesB = {{3, 1}, {33, 1}, {0, 1}, {64, 1}, {9, 1}};
// Small ones, padded with 1 request and 1 row to the capture size 4.
const std::vector<RequestSpec> kSmallGraph = {{20, 1}, {0, 1}, {16, 1}};
const std::vector<RequestSpec> kSmallGraphB = {{32, 1}, {7, 1}, {0, 1}};

std::vector<CudaCase> cases() {
  std::vector<CudaCase> all;
  const auto add = [&](CudaCase c) { all.push_back(ssm_case(std::move(c))); };
  const std::vector<std::pair<MambaCacheMode, const char*>> caches = {
      {MambaCacheMode::kNone, "None"}, {MambaCacheMode::kAll, "All"}, {MambaCacheMode::kAlign, "Align"}};
  const std::vector<std::pair<std::string, const char*>> modes = {{"zero", "Zero"},
                                                                   {"prefix_sum_flat", "PrefixSumFlat"},
                                                                   {"prefix_sum", "PrefixSum"},
                                                                   {"ema", "Ema"},
                                                                   {"mamba1", "Mamba1"},
                                                                   {"mamba2", "Mamba2"},
                                                                   {"gdn", "Gdn"}};
  for (const auto& [mode, mode_name] : modes) {
    // Small ones: the compute-sanitizer subset.
    add({.name = std::string("Small") + mode_name, .ssm_mode = mode, .cache = MambaCacheMode::kAll, .requests = kSmall,
         .padding_tokens = 2, .padding_requests = 1});
    for (const auto& [cache, cache_name] : caches) {
      add({.name = std::string(mode_name) + "Mixed" + cache_name + "Bf16", .ssm_mode = mode, .cache = cache,
           .requests = kMixed, .padding_tokens = 3, .padding_requests = 1, .seed = 3});
      add({.name = std::string(mode_name) + "Mixed" + cache_name + "Fp32", .ssm_mode = mode, .cache = cache,
           .dtype = DType::kFloat32, .requests = kMixed, .seed = 5});
    }
    add({.name = std::string(mode_name) + "DecodesPaddedFp16", .ssm_mode = mode, .dtype = DType::kFloat16,
         .requests = kDecodes, .padding_tokens = 4, .padding_requests = 4, .decode_graph = true, .seed = 7});
    add({.name = std::string(mode_name) + "LongAllBf16Pools", .ssm_mode = mode, .cache = MambaCacheMode::kAll,
         .pool_dtype = DType::kBFloat16, .requests = kLong, .seed = 9});
    // CUDA-graph-padded decode-only steps: the fixed-shape decode step (FixedDecodeStep).
    add({.name = std::string("SmallGraph") + mode_name, .ssm_mode = mode, .cache = MambaCacheMode::kAll,
         .requests = kSmallGraph, .padding_tokens = 1, .padding_requests = 1, .decode_graph = true, .seed = 41});
    for (const auto& [cache, cache_name] : caches) {
      add({.name = std::string(mode_name) + "GraphDecodes" + cache_name, .ssm_mode = mode, .cache = cache,
           .requests = kGraphDecodes, .padding_tokens = 3, .padding_requests = 3, .decode_graph = true, .seed = 43});
    }
    add({.name = std::string(mode_name) + "GraphDecodesAllFp32Bf16Pools", .ssm_mode = mode,
         .cache = MambaCacheMode::kAll, .pool_dtype = DType::kBFloat16, .dtype = DType::kFloat32,
         .requests = kGraphDecodesB, .padding_tokens = 3, .padding_requests = 3, .decode_graph = true, .seed = 45});
  }
  // mamba1's fixed step on the vector state path (N = 16) and on the scalar one (odd sizes).
  for (const auto& [cache, cache_name] : caches) {
    add({.name = std::string("Mamba1BigGraphDecodes") + cache_name, .ssm_mode = "mamba1", .cache = cache,
         .ssm_params = kMamba1Big, .requests = kGraphDecodes, .padding_tokens = 3, .padding_requests = 3,
         .decode_graph = true, .seed = 47});
  }
  add({.name = "SmallGraphMamba1OddFp16Pools", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll,
       .ssm_params = kMamba1Odd, .pool_dtype = DType::kFloat16, .dtype = DType::kFloat16, .requests = kSmallGraph,
       .padding_tokens = 1, .padding_requests = 1, .decode_graph = true, .seed = 49});
  add({.name = "SmallMamba1Big", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll, .ssm_params = kMamba1Big,
       .requests = kSmall, .seed = 11});
  for (const auto& [cache, cache_name] : caches) {
    add({.name = std::string("Mamba1BigMixed") + cache_name, .ssm_mode = "mamba1", .cache = cache,
         .ssm_params = kMamba1Big, .requests = kMixed, .padding_tokens = 2, .padding_requests = 1, .seed = 13});
  }
  // The scan's vector paths (N = 16: 16-byte float32 / 8-byte 16-bit state accesses) and its scalar
  // edge paths (odd sizes), decode-only steps, long single requests.
  add({.name = "SmallMamba1BigDecodesOnly", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll,
       .ssm_params = kMamba1Big, .requests = kManyDecodes, .seed = 17});
  add({.name = "SmallMamba1BigBf16Pools", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll, .ssm_params = kMamba1Big,
       .pool_dtype = DType::kBFloat16, .requests = kSmall, .padding_tokens = 2, .padding_requests = 1, .seed = 19});
  add({.name = "SmallMamba1Odd", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll, .ssm_params = kMamba1Odd,
       .requests = kSmall, .padding_tokens = 2, .padding_requests = 1, .seed = 23});
  add({.name = "Mamba1OddMixedAlign", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAlign, .ssm_params = kMamba1Odd,
       .dtype = DType::kFloat32, .requests = kMixed, .seed = 25});
  add({.name = "Mamba1BigDecodesOnlyGraph", .ssm_mode = "mamba1", .ssm_params = kMamba1Big, .dtype = DType::kFloat16,
       .requests = kManyDecodes, .padding_tokens = 1, .padding_requests = 1, .decode_graph = true, .seed = 27});
  add({.name = "Mamba1BigLongSingleAll", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll, .ssm_params = kMamba1Big,
       .dtype = DType::kFloat32, .requests = kLongSingle, .seed = 29});
  add({.name = "Mamba1BigLongSingleNoneBf16", .ssm_mode = "mamba1", .ssm_params = kMamba1Big, .requests = kLongSingle,
       .seed = 31});
  // The sequential scan (N = 16) with a partial channel tile (44 = 40 + 4 channels: in the second
  // block only the first warp holds channels below I), requests ending inside a chunk.
  add({.name = "Mamba1PartialTileMixedAll", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll,
       .ssm_params = {{"intermediate_size", 44}, {"state_size", 16}, {"conv_kernel", 4}, {"dt_rank", 8}},
       .requests = kMixed, .padding_tokens = 2, .padding_requests = 1, .seed = 51});
  add({.name = "Mamba1BigLongFp16Pools", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll, .ssm_params = kMamba1Big,
       .pool_dtype = DType::kFloat16, .dtype = DType::kFloat16, .requests = kLong, .seed = 15});
  // mamba2 at realistic shapes.
  // 8 heads of 16 channels, state 32, 2 groups (heads 0-3 read group 0's B and C, 4-7 group 1's);
  // Mamba-2's own head_dim 64 and state 128 (one group: B and C shared by every head; prefills
  // crossing many 128-token SSD chunks with mode none, chunks cut at every 16-token block boundary
  // with mode all); head_dim 80 and state 96 (two P tiles and a partial N tile of the chunk
  // kernels); state 256 (two state quads per lane in the decode update); odd sizes (head_dim 5,
  // state 6, conv_kernel 3: the scalar state path, partial tiles everywhere).
  const auto mamba2 = [](int64_t heads, int64_t head_dim, int64_t state, int64_t groups, int64_t conv_kernel) {
    return std::map<std::string, int64_t>{{"num_ssm_heads", heads},
                                          {"head_dim", head_dim},
                                          {"state_size", state},
                                          {"n_groups", groups},
                                          {"conv_kernel", conv_kernel}};
  };
  add({.name = "SmallMamba2Heads8", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAll,
       .ssm_params = mamba2(8, 16, 32, 2, 4), .requests = kSmall, .padding_tokens = 2, .padding_requests = 1,
       .seed = 101});
  add({.name = "SmallGraphMamba2Heads8", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAll,
       .ssm_params = mamba2(8, 16, 32, 2, 4), .requests = kSmallGraph, .padding_tokens = 1, .padding_requests = 1,
       .decode_graph = true, .seed = 103});
  add({.name = "SmallMamba2OddBf16Pools", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAll,
       .ssm_params = mamba2(3, 5, 6, 1, 3), .pool_dtype = DType::kBFloat16, .requests = kSmall, .padding_tokens = 2,
       .padding_requests = 1, .seed = 105});
  add({.name = "SmallGraphMamba2OddFp16Pools", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAll,
       .ssm_params = mamba2(3, 5, 6, 1, 3), .pool_dtype = DType::kFloat16, .dtype = DType::kFloat16,
       .requests = kSmallGraph, .padding_tokens = 1, .padding_requests = 1, .decode_graph = true, .seed = 107});
  for (const auto& [cache, cache_name] : caches) {
    add({.name = std::string("Mamba2Heads8Mixed") + cache_name + "Bf16", .ssm_mode = "mamba2", .cache = cache,
         .ssm_params = mamba2(8, 16, 32, 2, 4), .requests = kMixed, .padding_tokens = 3, .padding_requests = 1,
         .seed = 109});
    add({.name = std::string("Mamba2Head64State128GraphDecodes") + cache_name, .ssm_mode = "mamba2", .cache = cache,
         .ssm_params = mamba2(4, 64, 128, 1, 4), .requests = kGraphDecodes, .padding_tokens = 3, .padding_requests = 3,
         .decode_graph = true, .seed = 111});
  }
  add({.name = "Mamba2Head64State128LongNoneFp32", .ssm_mode = "mamba2", .ssm_params = mamba2(4, 64, 128, 1, 4),
       .dtype = DType::kFloat32, .requests = kLong, .seed = 113});
  add({.name = "Mamba2Head64State128LongAllBf16Pools", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAll,
       .ssm_params = mamba2(4, 64, 128, 1, 4), .pool_dtype = DType::kBFloat16, .requests = kLong, .seed = 115});
  add({.name = "Mamba2Head64State128MixedAlignFp32", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAlign,
       .ssm_params = mamba2(4, 64, 128, 1, 4), .dtype = DType::kFloat32, .requests = kMixed, .padding_tokens = 2,
       .padding_requests = 1, .seed = 117});
  add({.name = "Mamba2Head64State128GraphDecodesAllFp16Pools", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAll,
       .ssm_params = mamba2(4, 64, 128, 1, 4), .pool_dtype = DType::kFloat16, .dtype = DType::kFloat16,
       .requests = kGraphDecodesB, .padding_tokens = 3, .padding_requests = 3, .decode_graph = true, .seed = 119});
  add({.name = "Mamba2Heads8LongSingleAllFp32", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAll,
       .ssm_params = mamba2(8, 16, 32, 2, 4), .dtype = DType::kFloat32, .requests = kLongSingle, .seed = 121});
  add({.name = "Mamba2Head80State96MixedNoneFp32", .ssm_mode = "mamba2", .ssm_params = mamba2(4, 80, 96, 2, 4),
       .dtype = DType::kFloat32, .requests = kMixed, .seed = 123});
  add({.name = "Mamba2State256MixedAllBf16", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAll,
       .ssm_params = mamba2(2, 32, 256, 1, 4), .requests = kMixed, .padding_tokens = 2, .padding_requests = 1,
       .seed = 125});
  add({.name = "Mamba2State256GraphDecodesNone", .ssm_mode = "mamba2", .ssm_params = mamba2(2, 32, 256, 1, 4),
       .requests = kGraphDecodes, .padding_tokens = 3, .padding_requests = 3, .decode_graph = true, .seed = 127});
  add({.name = "Mamba2OddMixedAlignFp16Pools", .ssm_mode = "mamba2", .cache = MambaCacheMode::kAlign,
       .ssm_params = mamba2(3, 5, 6, 1, 3), .pool_dtype = DType::kFloat16, .requests = kMixed, .padding_tokens = 2,
       .padding_requests = 1, .seed = 129});
  // gdn at realistic shapes.
  // Two value heads per key head (Qwen3-Next's ratio) with head dims 32 (a square state: a
  // transposed pool would be caught), 128 (Qwen3-Next's; prefills crossing many 64-token chunks
  // with mode none, chunks cut at every 16-token block boundary with mode all), unequal key and
  // value dims both ways (partial state tiles, fewer lanes per state row), and odd ones (dk 6, dv 10,
  // conv_kernel 3: the scalar state and activation paths).
  const auto gdn = [](int64_t dk, int64_t dv, int64_t conv_kernel) {
    return std::map<std::string, int64_t>{{"num_k_heads", 2},
                                          {"num_v_heads", 4},
                                          {"head_k_dim", dk},
                                          {"head_v_dim", dv},
                                          {"conv_kernel", conv_kernel}};
  };
  add({.name = "SmallGdnHeads32", .ssm_mode = "gdn", .cache = MambaCacheMode::kAll, .ssm_params = gdn(32, 32, 4),
       .requests = kSmall, .padding_tokens = 2, .padding_requests = 1, .seed = 61});
  add({.name = "SmallGraphGdnHeads32", .ssm_mode = "gdn", .cache = MambaCacheMode::kAll, .ssm_params = gdn(32, 32, 4),
       .requests = kSmallGraph, .padding_tokens = 1, .padding_requests = 1, .decode_graph = true, .seed = 63});
  add({.name = "SmallGdnOddBf16Pools", .ssm_mode = "gdn", .cache = MambaCacheMode::kAll, .ssm_params = gdn(6, 10, 3),
       .pool_dtype = DType::kBFloat16, .requests = kSmall, .padding_tokens = 2, .padding_requests = 1, .seed = 65});
  for (const auto& [cache, cache_name] : caches) {
    add({.name = std::string("GdnHeads32Mixed") + cache_name + "Bf16", .ssm_mode = "gdn", .cache = cache,
         .ssm_params = gdn(32, 32, 4), .requests = kMixed, .padding_tokens = 3, .padding_requests = 1, .seed = 67});
    add({.name = std::string("GdnHeads128GraphDecodes") + cache_name, .ssm_mode = "gdn", .cache = cache,
         .ssm_params = gdn(128, 128, 4), .requests = kGraphDecodes, .padding_tokens = 3, .padding_requests = 3,
         .decode_graph = true, .seed = 69});
  }
  add({.name = "GdnHeads128LongNoneFp32", .ssm_mode = "gdn", .ssm_params = gdn(128, 128, 4), .dtype = DType::kFloat32,
       .requests = kLong, .seed = 71});
  add({.name = "GdnHeads128LongAllBf16Pools", .ssm_mode = "gdn", .cache = MambaCacheMode::kAll,
       .ssm_params = gdn(128, 128, 4), .pool_dtype = DType::kBFloat16, .requests = kLong, .seed = 73});
  add({.name = "GdnHeads128MixedAlignFp32", .ssm_mode = "gdn", .cache = MambaCacheMode::kAlign,
       .ssm_params = gdn(128, 128, 4), .dtype = DType::kFloat32, .requests = kMixed, .padding_tokens = 2,
       .padding_requests = 1, .seed = 75});
  add({.name = "GdnHeads128GraphDecodesAllFp16Pools", .ssm_mode = "gdn", .cache = MambaCacheMode::kAll,
       .ssm_params = gdn(128, 128, 4), .pool_dtype = DType::kFloat16, .dtype = DType::kFloat16,
       .requests = kGraphDecodesB, .padding_tokens = 3, .padding_requests = 3, .decode_graph = true, .seed = 77});
  add({.name = "GdnWideKeysMixedAllFp32", .ssm_mode = "gdn", .cache = MambaCacheMode::kAll,
       .ssm_params = gdn(64, 32, 4), .dtype = DType::kFloat32, .requests = kMixed, .seed = 79});
  add({.name = "GdnWideValuesLongSingleNone", .ssm_mode = "gdn", .ssm_params = gdn(16, 48, 4), .requests = kLongSingle,
       .seed = 81});
  add({.name = "GdnOddMixedAlignFp16Pools", .ssm_mode = "gdn", .cache = MambaCacheMode::kAlign,
       .ssm_params = gdn(6, 10, 3), .pool_dtype = DType::kFloat16, .requests = kMixed, .padding_tokens = 2,
       .padding_requests = 1, .seed = 83});
  // Qwen3-Next's 32 value heads over 16 key heads: the prefill state pass takes the fewest of 8, 16
  // or 32 rows of M per block whose grid fits on the SMs at once, else 32 (gdn_prefill.cu); one
  // block per SM with float32 operands, two at 8 or 16 rows with 16-bit ones. On a 132-SM H100 or
  // H200: dv 128 with one prefill, 4 tiles × 32 heads = 128 blocks of 32 rows with float32 operands,
  // 256 of 16 rows with 16-bit ones; dv 70 with one prefill, 3 tiles (32, 32 and 6 rows: a partial
  // group, U loaded a float at a time) × 32 = 96 blocks of 32 rows, or with 16-bit operands 5 tiles
  // (16, 16, 16, 16, 6) × 32 = 160 of 16; dv 72 with three prefills (continued and fresh), 3 tiles
  // (32, 32, 8) × 32 × 3 = 288 blocks of 32 rows with either operands (16-row: 480, more than fit),
  // so the widest — the case runs again with a float16 model for the 16-bit 32-row blocks. dk 64
  // leaves half the warps without columns of M.
  const auto gdn32 = [](int64_t dk, int64_t dv) {
    return std::map<std::string, int64_t>{{"num_k_heads", 16},
                                          {"num_v_heads", 32},
                                          {"head_k_dim", dk},
                                          {"head_v_dim", dv},
                                          {"conv_kernel", 4}};
  };
  add({.name = "GdnValueHeads32LongAllBf16", .ssm_mode = "gdn", .cache = MambaCacheMode::kAll,
       .ssm_params = gdn32(128, 128), .requests = kLong, .seed = 85});
  add({.name = "GdnValueHeads32Dv70LongSingleNone", .ssm_mode = "gdn", .ssm_params = gdn32(128, 70),
       .requests = kLongSingle, .seed = 87});
  add({.name = "GdnValueHeads32Dk64Dv72MixedAlignFp32", .ssm_mode = "gdn", .cache = MambaCacheMode::kAlign,
       .ssm_params = gdn32(64, 72), .dtype = DType::kFloat32, .requests = kMixed, .padding_tokens = 2,
       .padding_requests = 1, .seed = 89});
  return all;
}

std::string report_text(const ComparisonReport& report) { return format_report_table({report}); }

// Every slot of every pool that the reference left byte for byte as it was (`before`) is so in
// `actual` too: slots of padding requests (the builder gives them PAD_SLOT_ID), of skipped
// requests, and spare slots no request names.
void expect_untouched_slots(const std::map<std::string, Tensor>& before, const std::map<std::string, Tensor>& expected,
                            const std::map<std::string, Tensor>& actual) {
  for (const auto& [name, pool] : before) {
    const Tensor& after = actual.at(name);
    const Tensor& ref_after = expected.at(name);
    const int64_t slots = pool.size(0);
    const int64_t slot_bytes = pool.nbytes() / slots;
    ASSERT_EQ(after.nbytes(), pool.nbytes()) << "pool " << name;
    for (int64_t s = 0; s < slots; ++s) {
      const auto* b = static_cast<const char*>(pool.data()) + s * slot_bytes;
      const auto* r = static_cast<const char*>(ref_after.data()) + s * slot_bytes;
      const auto* a = static_cast<const char*>(after.data()) + s * slot_bytes;
      if (std::memcmp(b, r, static_cast<size_t>(slot_bytes)) == 0) {
        EXPECT_EQ(std::memcmp(b, a, static_cast<size_t>(slot_bytes)), 0)
            << "pool " << name << " slot " << s << " (untouched by the reference) was written";
      }
    }
  }
}

class CudaSsmTest : public CudaParamFixture<CudaCase> {};

// Parity within `options`' tolerance rows (contribution, fused output, every pool, attention,
// metadata), no padding row or unnamed slot written, and every pool the reference leaves unchanged
// (slots of padding requests, spare slots) keeping its bytes.
void expect_matches_reference(const BatchFile& step, const StepOutputs& actual, const StepOutputs& expected,
                              const CompareOptions& options) {
  const ComparisonReport report = compare_step(step, actual, expected, options);
  EXPECT_TRUE(report.passed()) << report_text(report);
  for (const QuantityReport& q : report.quantities) {
    EXPECT_EQ(q.padding_written, 0) << q.name << ": padding rows written";
    EXPECT_EQ(q.untouched_written, 0) << q.name << ": a slot no request names was written";
  }
  expect_untouched_slots(step.inputs.ssm_state, expected.ssm_state, actual.ssm_state);
}

// Bitwise reproducible from run to run (fixed orders, no atomics, cuBLAS on one stream + workspace):
// the contribution and every pool (and the fused output where `with_output`).
void expect_repeats_bit_for_bit(Backend& cuda, const BatchFile& step, const StepOutputs& actual, bool with_output) {
  const StepOutputs again = run_step(cuda, step);
  EXPECT_TRUE(bitwise_equal(actual.ssm_output, again.ssm_output)) << "ssm_output differs between two runs";
  if (with_output) {
    EXPECT_TRUE(bitwise_equal(actual.output, again.output)) << "output differs between two runs";
  }
  for (const auto& [name, pool] : actual.ssm_state) {
    EXPECT_TRUE(bitwise_equal(pool, again.ssm_state.at(name))) << "pool " << name << " differs between two runs";
  }
}

// Parity (contribution, fused output, every pool, attention, metadata, padding, untouched slots)
// and bitwise reproducibility.
TEST_P(CudaSsmTest, MatchesReference) {
  const BatchFile step = make_step(GetParam());
  const BackendSettings settings{step.config, step.builder};
  auto reference = create_backend("reference", settings);
  auto cuda = create_backend("cuda", settings);
  const StepOutputs expected = run_step(*reference, step);
  const StepOutputs actual = run_step(*cuda, step);
  expect_matches_reference(step, actual, expected, {});
  expect_repeats_bit_for_bit(*cuda, step, actual, /*with_output=*/true);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaSsmTest, ::testing::ValuesIn(cases()), CaseName());

// --- the chunked prefills with 16-bit product operands (mamba2, gdn) -------------------------------

// The cases of this file in `mode` with a prefill (the CUDA-graph decode-only ones have none to
// run), and the named ones again with a float16 model (float16 operands; the others are bfloat16
// or float32 models).
std::vector<CudaCase> prefill_cases(const std::string& mode, const std::vector<std::string>& with_fp16_model) {
  std::vector<CudaCase> selected;
  for (const CudaCase& c : cases()) {
    if (c.ssm_mode != mode || c.decode_graph) continue;
    selected.push_back(c);
    if (std::find(with_fp16_model.begin(), with_fp16_model.end(), c.name) != with_fp16_model.end()) {
      CudaCase fp16 = c;
      fp16.name += "Fp16Model";
      fp16.dtype = DType::kFloat16;
      selected.push_back(fp16);
    }
  }
  return selected;
}
// mamba2: fresh, continued and long prefills, varlen batches, initial states from the pools,
// block-boundary states of mamba_cache_mode all and align, grouped B/C, partial and odd tiles.
std::vector<CudaCase> mamba2_prefill_cases() {
  return prefill_cases("mamba2", {"Mamba2Heads8MixedAllBf16", "Mamba2Head64State128LongAllBf16Pools",
                                  "Mamba2State256MixedAllBf16"});
}
// gdn: fresh, continued and long prefills over many 64-token chunks, varlen batches, initial states
// from the pools, block-boundary states of mamba_cache_mode all and align, head dims 128/128,
// 32/32, 64/32, 16/48 and the odd 6/10, 32 value heads with 128/128, 128/70 and 64/72 (64/72 also
// with a float16 model: 16-bit operands in the state pass's 32-row blocks).
std::vector<CudaCase> gdn_prefill_cases() {
  return prefill_cases("gdn", {"GdnHeads32MixedAllBf16", "GdnHeads128LongAllBf16Pools", "GdnValueHeads32LongAllBf16",
                               "GdnValueHeads32Dk64Dv72MixedAlignFp32"});
}

// The product operands the backend runs with ssm_prefill_operands model: the model dtype when it is
// 16-bit, else float32 (mamba2.cpp, gdn.cpp).
DType model_operands(const AttentionConfig& config) {
  return config.dtype == DType::kFloat16 || config.dtype == DType::kBFloat16 ? config.dtype : DType::kFloat32;
}

// Twice the tolerance row of the SSM quantity q stored as `stored` (with product operands of
// `operand_dtype`: ParityKey::ssm_operand_dtype) for `file`: two runs of its step, each within the
// row of the exact value, agree within it.
Tolerance twice_the_row(const BatchFile& file, Quantity q, DType stored, DType operand_dtype) {
  ParityKey key = parity_key(file, q, stored);
  key.ssm_operand_dtype = operand_dtype;
  const Tolerance t = parity_tolerance(key);
  return Tolerance{2 * t.atol, 2 * t.rtol, "2 × (" + t.rationale + "): two runs, each within the row"};
}

// Settings for `step` with BackendSettings::ssm_prefill_operands model.
BackendSettings model_operand_settings(const BatchFile& step) {
  BackendSettings settings{step.config, step.builder};
  settings.ssm_prefill_operands = SsmPrefillOperands::kModel;
  return settings;
}

// Runs `step` on the reference and on the cuda backend with `settings` (ssm_prefill_operands model
// and whatever else the caller set) and checks the cuda outputs against the reference within the
// table's SSM row of the model's product operands (contribution, fused output, every pool), padding
// and untouched slots as the float32 path, bitwise reproducible. Returns the cuda outputs.
StepOutputs expect_model_operands_match_reference(const BatchFile& step, const BackendSettings& settings) {
  auto reference = create_backend("reference", BackendSettings{step.config, step.builder});
  auto cuda = create_backend("cuda", settings);
  const StepOutputs expected = run_step(*reference, step);
  const StepOutputs actual = run_step(*cuda, step);
  CompareOptions options;
  options.ssm_operand_dtype = model_operands(step.config);
  expect_matches_reference(step, actual, expected, options);
  expect_repeats_bit_for_bit(*cuda, step, actual, /*with_output=*/false);
  return actual;
}

class CudaSsmModelOperands : public CudaParamFixture<CudaCase> {};

// BackendSettings::ssm_prefill_operands model against the reference, within the table's
// 16-bit-operand SSM row (contribution, fused output, every pool), padding and untouched slots
// as the float32 path, bitwise reproducible; a float32 model runs the float32 products (the same
// bits as the default setting).
TEST_P(CudaSsmModelOperands, MatchesReferenceWithinThe16BitRow) {
  const BatchFile step = make_step(GetParam());
  const StepOutputs actual = expect_model_operands_match_reference(step, model_operand_settings(step));
  if (model_operands(step.config) == DType::kFloat32) {
    auto default_cuda = create_backend("cuda", BackendSettings{step.config, step.builder});
    const StepOutputs float32 = run_step(*default_cuda, step);
    EXPECT_TRUE(bitwise_equal(actual.ssm_output, float32.ssm_output))
        << "a float32 model's ssm_prefill_operands model differs from float32";
  }
}

INSTANTIATE_TEST_SUITE_P(Mamba2, CudaSsmModelOperands, ::testing::ValuesIn(mamba2_prefill_cases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Gdn, CudaSsmModelOperands, ::testing::ValuesIn(gdn_prefill_cases()), CaseName());

// The prefill cases of a 16-bit model (ssm_prefill_operands model then rounds the operands to it).
std::vector<CudaCase> sixteen_bit(const std::vector<CudaCase>& cases) {
  std::vector<CudaCase> selected;
  for (const CudaCase& c : cases) {
    if (c.dtype == DType::kFloat16 || c.dtype == DType::kBFloat16) selected.push_back(c);
  }
  return selected;
}

// Whether the backend's prefill of `mode` runs its 16-bit wgmma bodies here by default (Mamba-2's
// chunk states and chunk scan, GDN's state pass): a build with their sm_90a code on a compute
// capability 9.0 device (mamba2.cpp, gdn.cpp).
bool prefill_wgmma_runs_here(const std::string& mode) {
  const bool built = mode == "gdn" ? cuda::ssm::gdn_wgmma_built() : cuda::ssm::mamba2_wgmma_built();
  return built && cuda::current_compute_capability().is_hopper();
}

// Two runs of `step` agree within twice each SSM quantity's 16-bit-operand row: the contribution's
// rows [0, num_actual_tokens) and every pool, element by element.
void expect_within_twice_the_row(const BatchFile& step, const StepOutputs& a, const StepOutputs& b,
                                 DType operand_dtype, const std::string& what) {
  const Tensor& out = a.ssm_output;
  const Tolerance out_tol = twice_the_row(step, Quantity::kSsmOutput, out.dtype(), operand_dtype);
  const int64_t width = out.numel() / out.size(0);
  for (int64_t i = 0; i < step.batch.num_actual_tokens * width; ++i) {
    const double x = load_as_double(out.data(), out.dtype(), i);
    const double y = load_as_double(b.ssm_output.data(), b.ssm_output.dtype(), i);
    ASSERT_TRUE(out_tol.allows(x, y)) << what << ": ssm_output token " << i / width << " element " << i % width
                                      << ": " << x << " vs " << y << " (" << out_tol.rationale << ")";
  }
  for (const auto& [name, pool] : a.ssm_state) {
    const Tolerance tol = twice_the_row(step, Quantity::kSsmState, pool.dtype(), operand_dtype);
    const Tensor& other = b.ssm_state.at(name);
    for (int64_t i = 0; i < pool.numel(); ++i) {
      const double x = load_as_double(pool.data(), pool.dtype(), i);
      const double y = load_as_double(other.data(), other.dtype(), i);
      ASSERT_TRUE(tol.allows(x, y)) << what << ": pool " << name << " element " << i << ": " << x << " vs " << y
                                    << " (" << tol.rationale << ")";
    }
  }
}

class CudaSsmMmaSyncPrefill : public CudaParamFixture<CudaCase> {};

// BackendSettings::ssm_prefill_wgmma false: Mamba-2's 16-bit chunk states and chunk scan and GDN's
// 16-bit state pass on mma.sync, the bodies of every GPU but compute capability 9.0 (where the wgmma
// bodies run by default and the cases above take them), against the reference exactly as CudaSsmModelOperands
// checks the default (the 16-bit row, padding, untouched slots, bitwise reproducible). Where the
// wgmma bodies run by default the two runs agree within twice the row; elsewhere asking for
// mma.sync changes no bit.
TEST_P(CudaSsmMmaSyncPrefill, MatchesReferenceWithinThe16BitRow) {
  const BatchFile step = make_step(GetParam());
  BackendSettings mma_sync = model_operand_settings(step);
  mma_sync.ssm_prefill_wgmma = false;
  const StepOutputs actual = expect_model_operands_match_reference(step, mma_sync);

  auto by_default = create_backend("cuda", model_operand_settings(step));
  const StepOutputs default_body = run_step(*by_default, step);
  if (prefill_wgmma_runs_here(GetParam().ssm_mode)) {
    expect_within_twice_the_row(step, default_body, actual, model_operands(step.config), "wgmma vs mma.sync");
  } else {
    EXPECT_TRUE(bitwise_equal(actual.ssm_output, default_body.ssm_output))
        << "ssm_output: mma.sync asked for differs from the default body (also mma.sync here)";
    for (const auto& [name, pool] : actual.ssm_state) {
      EXPECT_TRUE(bitwise_equal(pool, default_body.ssm_state.at(name)))
          << "pool " << name << ": mma.sync asked for differs from the default body (also mma.sync here)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Mamba2, CudaSsmMmaSyncPrefill, ::testing::ValuesIn(sixteen_bit(mamba2_prefill_cases())),
                         CaseName());
INSTANTIATE_TEST_SUITE_P(Gdn, CudaSsmMmaSyncPrefill, ::testing::ValuesIn(sixteen_bit(gdn_prefill_cases())),
                         CaseName());

class CudaSsmFusedStatePass : public CudaParamFixture<CudaCase> {};

// BackendSettings::ssm_prefill_fused_state_pass false: Mamba-2's chunk states and state passing as
// two kernels. Where the fused kernel runs (the 16-bit wgmma bodies; every case here but the odd N,
// which takes the two kernels either way) it does the same float32 arithmetic on the same operands,
// so the outputs and every pool are the same bits.
TEST_P(CudaSsmFusedStatePass, SameBitsAsTheTwoKernelsApart) {
  if (!prefill_wgmma_runs_here("mamba2")) {
    GTEST_SKIP() << "the fused state pass is a wgmma kernel: needs a compute capability 9.0 device and sm_90a code";
  }
  const BatchFile step = make_step(GetParam());
  auto fused = create_backend("cuda", model_operand_settings(step));
  BackendSettings apart_settings = model_operand_settings(step);
  apart_settings.ssm_prefill_fused_state_pass = false;
  auto apart = create_backend("cuda", apart_settings);
  const StepOutputs a = run_step(*fused, step);
  const StepOutputs b = run_step(*apart, step);
  EXPECT_TRUE(bitwise_equal(a.ssm_output, b.ssm_output)) << "ssm_output: fused state pass vs the two kernels apart";
  for (const auto& [name, pool] : a.ssm_state) {
    EXPECT_TRUE(bitwise_equal(pool, b.ssm_state.at(name))) << "pool " << name << ": fused vs apart";
  }
}

INSTANTIATE_TEST_SUITE_P(Mamba2, CudaSsmFusedStatePass, ::testing::ValuesIn(sixteen_bit(mamba2_prefill_cases())),
                         CaseName());

// --- chunked prefill == one-shot prefill, on the GPU ---------------------------------------------

// Rows [begin, end) of a [T, Hq, D] tensor.
Tensor rows_of(const Tensor& t, int64_t begin, int64_t end) {
  Tensor out = Tensor::host(t.dtype(), {end - begin, t.size(1), t.size(2)});
  const int64_t row = t.nbytes() / t.size(0);
  std::memcpy(out.data(), static_cast<const char*>(t.data()) + begin * row, static_cast<size_t>((end - begin) * row));
  return out;
}

// One request of L tokens as one fresh prefill, and as a fresh chunk of `split` tokens followed by
// a continued chunk of the rest (same query rows, same slot, the second step starting from the
// pools the first left). The contributions and the final state agree within twice the row of the
// tolerance table (each run is within that row of the exact value): the float32 row, or for
// ssm_prefill_operands model with a 16-bit model dtype the 16-bit-operand row.
void expect_chunked_equals_one_shot(const std::string& mode, int64_t length, int64_t split, MambaCacheMode cache,
                                    DType dtype = DType::kFloat32,
                                    SsmPrefillOperands operands = SsmPrefillOperands::kFloat32) {
  CudaCase c = ssm_case({.name = "chunked", .ssm_mode = mode, .cache = cache, .dtype = dtype});
  if (mode == "mamba1") c.ssm_params = kMamba1Big;
  const AttentionConfig config = make_config(c);
  SyntheticOptions options;
  options.seed = 21;
  options.ssm_block_table = true;
  BatchFile whole = make_synthetic_batch(config, {}, {{0, length}}, options);
  BatchFile first = make_synthetic_batch(config, {}, {{0, split}}, options);
  BatchFile second = make_synthetic_batch(config, {}, {{split, length - split}}, options);
  // Same hidden rows; the same SSM slot table (one row: the whole request's slots).
  first.inputs.query = rows_of(whole.inputs.query, 0, split);
  second.inputs.query = rows_of(whole.inputs.query, split, length);
  first.batch.ssm_block_table = whole.batch.ssm_block_table;
  second.batch.ssm_block_table = whole.batch.ssm_block_table;
  auto tensors = reference::ssm::make_random_ssm_tensors(config, ssm_slots_needed(whole.batch), 22);
  whole.inputs.ssm_state = tensors.ssm_state;
  whole.inputs.weights = tensors.weights;
  first.inputs.ssm_state = tensors.ssm_state;
  first.inputs.weights = tensors.weights;
  BackendSettings settings{config, {}};
  settings.ssm_prefill_operands = operands;
  auto cuda = create_backend("cuda", settings);
  const StepOutputs one_shot = run_step(*cuda, whole);
  const StepOutputs a = run_step(*cuda, first);
  second.inputs.ssm_state = a.ssm_state;
  second.inputs.weights = tensors.weights;
  const StepOutputs b = run_step(*cuda, second);

  const DType operand_dtype = operands == SsmPrefillOperands::kModel ? model_operands(config) : DType::kFloat32;
  const Tolerance out_tol = twice_the_row(whole, Quantity::kSsmOutput, one_shot.ssm_output.dtype(), operand_dtype);
  const int64_t width = config.num_heads * config.head_size;
  for (int64_t t = 0; t < length; ++t) {
    const Tensor& part = t < split ? a.ssm_output : b.ssm_output;
    const int64_t row = t < split ? t : t - split;
    for (int64_t e = 0; e < width; ++e) {
      const double x = load_as_double(part.data(), part.dtype(), row * width + e);
      const double y = load_as_double(one_shot.ssm_output.data(), one_shot.ssm_output.dtype(), t * width + e);
      ASSERT_TRUE(out_tol.allows(x, y)) << mode << ": token " << t << " element " << e << ": chunked " << x
                                        << " vs one-shot " << y << " (" << out_tol.rationale << ")";
    }
  }
  for (const auto& [name, pool] : one_shot.ssm_state) {
    const Tolerance tol = twice_the_row(whole, Quantity::kSsmState, pool.dtype(), operand_dtype);
    const Tensor& chunked = b.ssm_state.at(name);
    for (int64_t i = 0; i < pool.numel(); ++i) {
      const double x = load_as_double(chunked.data(), chunked.dtype(), i);
      const double y = load_as_double(pool.data(), pool.dtype(), i);
      ASSERT_TRUE(tol.allows(x, y)) << mode << ": pool " << name << " element " << i << ": chunked " << x
                                    << " vs one-shot " << y;
    }
  }
}

TEST(CudaSsm, ChunkedPrefillEqualsOneShot) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  for (const std::string mode : {"prefix_sum", "ema", "mamba1", "mamba2", "gdn"}) {
    for (const MambaCacheMode cache : {MambaCacheMode::kNone, MambaCacheMode::kAll}) {
      SCOPED_TRACE(mode + " cache " + std::string(to_string(cache)));
      expect_chunked_equals_one_shot(mode, 400, 1, cache);
      expect_chunked_equals_one_shot(mode, 400, 37, cache);
      expect_chunked_equals_one_shot(mode, 400, 256, cache);
    }
  }
}

// Chunked == one-shot for `mode` with its 16-bit product operands (ssm_prefill_operands model),
// bfloat16 and float16 models, each of `splits` as the first step's length.
void expect_chunked_equals_one_shot_16bit(const std::string& mode, std::initializer_list<int64_t> splits) {
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const MambaCacheMode cache : {MambaCacheMode::kNone, MambaCacheMode::kAll}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " cache " + std::string(to_string(cache)));
      for (const int64_t split : splits) {
        expect_chunked_equals_one_shot(mode, 400, split, cache, dtype, SsmPrefillOperands::kModel);
      }
    }
  }
}

// mamba2: splits inside a chunk, at a chunk's end and across several.
TEST(CudaSsm, ChunkedPrefillEqualsOneShotWith16BitOperands) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  expect_chunked_equals_one_shot_16bit("mamba2", {1, 37, 128, 256});
}

// gdn: splits inside the first 64-token chunk, at its end and across several (the second step's
// chunks then start off the first's grid and from the state it left).
TEST(CudaSsm, GdnChunkedPrefillEqualsOneShotWith16BitOperands) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  expect_chunked_equals_one_shot_16bit("gdn", {1, 37, 64, 200});
}

// A mode (descriptor + reference math) without a GPU implementation is refused by name, never run
// on the CPU.
TEST(CudaSsm, ModeWithoutGpuImplementationIsNotSupported) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  class CpuOnlySpec final : public spec::ssm::ModeSpec {
   public:
    std::string name() const override { return "cpu_only_test_mode"; }
    std::string description() const override { return "test-only mode without a GPU implementation"; }
    std::vector<spec::ssm::TensorSpec> state_specs(const spec::ssm::ModeShape&) const override { return {}; }
    std::vector<spec::ssm::TensorSpec> weight_specs(const spec::ssm::ModeShape&) const override { return {}; }
  };
  class CpuOnlyMode final : public reference::ssm::Mode {
   public:
    std::string name() const override { return "cpu_only_test_mode"; }
    void advance(const reference::ssm::Weights&, reference::ssm::State&, const reference::ssm::Matrix& x,
                 reference::ssm::Matrix& y, bool) const override {
      y.setZero(x.rows(), x.cols());
    }
  };
  auto& specs = spec::ssm::ModeSpecRegistry::instance();
  if (!specs.contains("cpu_only_test_mode")) specs.add(std::make_unique<CpuOnlySpec>());
  auto& registry = reference::ssm::ModeRegistry::instance();
  if (!registry.contains("cpu_only_test_mode")) registry.add(std::make_unique<CpuOnlyMode>());
  const CudaCase c = ssm_case({.name = "cpu_only", .ssm_mode = "cpu_only_test_mode", .requests = kSmall});
  const BatchFile step = make_step(c);
  auto cuda = create_backend("cuda", {step.config, step.builder});
  try {
    run_step(*cuda, step);
    ADD_FAILURE() << "ssm_mode cpu_only_test_mode ran on the cuda backend";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_only_test_mode"), std::string::npos) << e.what();
  }
}

// The shipped SSM example batches, through the same step runner and comparison as `hybridtb parity`.
TEST(CudaSsmExamples, MatchReference) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  int ran = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() / "datasets" / "examples")) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".h5" || name.rfind("hybrid_", 0) != 0) continue;
    SCOPED_TRACE(name);
    const BatchFile step = read_batch_file(entry.path().string());
    const BackendSettings settings{step.config, step.builder};
    auto cuda = create_backend("cuda", settings);
    auto reference = create_backend("reference", settings);
    const StepOutputs actual = run_step(*cuda, step);
    const StepOutputs expected = run_step(*reference, step);
    const ComparisonReport report = compare_step(step, actual, expected, {});
    EXPECT_TRUE(report.passed()) << report_text(report);
    ++ran;
  }
  EXPECT_EQ(ran, 5) << "expected the five hybrid_*.h5 examples";
}


// --- the fixed-shape decode step, directly (optimized/src/ssm/ssm_gpu_mode.h) --------------------------

namespace gpu = ::hybridtb::cuda::ssm;

// What a step leaves: the contribution and the pools, on the host.
struct SsmResult {
  Tensor ssm_output;
  std::map<std::string, Tensor> ssm_state;
};

// `expected` holds the bits of `actual`: the contribution and every pool.
void expect_same_bits(const SsmResult& actual, const SsmResult& expected, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(actual.ssm_output, expected.ssm_output)) << what << ": the contributions differ";
  for (const auto& [name, pool] : expected.ssm_state) {
    EXPECT_TRUE(bitwise_equal(actual.ssm_state.at(name), pool)) << what << ": pool " << name << " differs";
  }
}

// The reference SSM driver on the host, with the given Mamba metadata (possibly edited by a test).
SsmResult reference_result(const BatchFile& file, const MambaAttentionMetadata& metadata) {
  BatchInputs host = file.inputs;  // shares buffers: the pools are updated in place, so copy them
  for (auto& [name, pool] : host.ssm_state) pool = clone_host(pool);
  Tensor contribution = Tensor::host(DType::kFloat64, file.inputs.query.shape());
  fill_host(contribution, kOutputPoison);
  reference::ssm::ssm_forward(file.config, metadata, file.batch, host.views(), contribution);
  return {contribution, host.ssm_state};
}

// `actual` against the reference's `expected` for `file`: rows [0, num_actual_tokens) of the
// contribution and every pool within the tolerance table, padding rows still NaN, slots the
// reference left unchanged unchanged byte for byte.
void expect_matches_reference(const BatchFile& file, const SsmResult& actual, const SsmResult& expected) {
  const Tolerance tol = parity_tolerance(parity_key(file, Quantity::kSsmOutput, actual.ssm_output.dtype()));
  const int64_t width = file.config.num_heads * file.config.head_size;
  const int64_t rows = file.batch.num_actual_tokens;
  for (int64_t i = 0; i < actual.ssm_output.numel(); ++i) {
    const double x = load_as_double(actual.ssm_output.data(), actual.ssm_output.dtype(), i);
    if (i >= rows * width) {
      ASSERT_TRUE(std::isnan(x)) << "padding row " << i / width << " was written (element " << i % width << ")";
      continue;
    }
    const double y = load_as_double(expected.ssm_output.data(), expected.ssm_output.dtype(), i);
    ASSERT_TRUE(tol.allows(x, y)) << "contribution token " << i / width << " element " << i % width << ": " << x
                                  << " vs reference " << y << " (" << tol.rationale << ")";
  }
  for (const auto& [name, pool] : expected.ssm_state) {
    const Tensor& got = actual.ssm_state.at(name);
    const Tolerance pool_tol = parity_tolerance(parity_key(file, Quantity::kSsmState, pool.dtype()));
    for (int64_t i = 0; i < pool.numel(); ++i) {
      const double x = load_as_double(got.data(), got.dtype(), i);
      const double y = load_as_double(pool.data(), pool.dtype(), i);
      ASSERT_TRUE(pool_tol.allows(x, y)) << "pool " << name << " element " << i << ": " << x << " vs reference " << y;
    }
  }
  expect_untouched_slots(file.inputs.ssm_state, expected.ssm_state, actual.ssm_state);
}

// Device tensors shaped like one batch file (query, pools, weights, a contribution buffer), held by
// the cuda backend's memory, and an SsmContext of our own on our own stream — what the backend
// holds when it captures a step. load() puts another batch of the same shape into the same tensors.
class FixedStepSession {
 public:
  explicit FixedStepSession(const BatchFile& file)
      : backend_(create_backend("cuda", {file.config, file.builder})), config_(file.config) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    context_ = std::make_unique<gpu::SsmContext>(memory_, stream_);
    device_ = upload_inputs(*backend_, file.inputs);
    contribution_ = backend_->allocate(backend_->output_dtype(), file.inputs.query.shape());
    load(file);
  }
  ~FixedStepSession() {
    cudaStreamSynchronize(stream_);  // NOLINT: best effort in a destructor
    context_.reset();
    cudaStreamDestroy(stream_);  // NOLINT
  }
  FixedStepSession(const FixedStepSession&) = delete;
  FixedStepSession& operator=(const FixedStepSession&) = delete;

  // `file`'s query rows and pools into the device tensors, the contribution poisoned (NaN).
  void load(const BatchFile& file) {
    synchronize();
    backend_->copy(device_.query, file.inputs.query);
    for (const auto& [name, pool] : file.inputs.ssm_state) backend_->copy(device_.ssm_state.at(name), pool);
    Tensor poison = Tensor::host(backend_->output_dtype(), file.inputs.query.shape());
    fill_host(poison, kOutputPoison);
    backend_->copy(contribution_, poison);
  }
  SsmResult read() {
    synchronize();
    SsmResult out;
    out.ssm_output = Tensor::host(contribution_.dtype(), contribution_.shape());
    backend_->copy(out.ssm_output, contribution_);
    for (const auto& [name, pool] : device_.ssm_state) {
      out.ssm_state[name] = Tensor::host(pool.dtype(), pool.shape());
      backend_->copy(out.ssm_state[name], pool);
    }
    return out;
  }
  void synchronize() { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  // A fresh step for `file`'s batch (metadata as given), prepared and launched; its result.
  SsmResult run_fresh(const BatchFile& file, const MambaAttentionMetadata& metadata) {
    load(file);
    gpu::FixedDecodeStep step(config_, *context_);
    step.prepare(metadata, file.batch, tensors(), contribution_);
    step.launch();
    return read();
  }

  Backend& backend() { return *backend_; }
  gpu::SsmContext& context() { return *context_; }
  cudaStream_t stream() const { return stream_; }
  StepTensors tensors() const { return device_.views(); }
  const Tensor& contribution() const { return contribution_; }

 private:
  std::unique_ptr<Backend> backend_;
  AttentionConfig config_;
  ::hybridtb::cuda::DeviceMemory memory_;  // before context_: outlives it
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<gpu::SsmContext> context_;
  BatchInputs device_;
  Tensor contribution_;
};

// The Mamba metadata the builder makes for a batch file.
MambaAttentionMetadata mamba_metadata(Backend& backend, const BatchFile& file) {
  const HybridMetadata metadata = backend.build_metadata(file.batch);
  if (!metadata.mamba) throw Error("no Mamba metadata");
  return *metadata.mamba;
}

// Batches A and B of one padded decode shape for `c` (B: kGraphDecodesB-like requests from
// c.requests' twin), with the same weights and pools of the same number of slots.
std::pair<BatchFile, BatchFile> graph_pair(const CudaCase& c, const std::vector<RequestSpec>& b_requests) {
  CudaCase cb = c;
  cb.requests = b_requests;
  cb.seed = c.seed + 1;
  const int64_t slots = std::max(ssm_slots_needed(make_step(c).batch), ssm_slots_needed(make_step(cb).batch)) + 2;
  BatchFile a = make_step(c, slots);
  BatchFile b = make_step(cb, slots);
  b.inputs.weights = a.inputs.weights;  // one model: the weights stay in their device buffers
  return {std::move(a), std::move(b)};
}

// Every GPU mode × cache mode, small graph-padded decode shapes (mamba1 also with N = 16).
std::vector<CudaCase> fixed_step_cases() {
  std::vector<CudaCase> all;
  const auto add = [&](CudaCase c) { all.push_back(ssm_case(std::move(c))); };
  for (const std::string& mode : gpu::GpuModeRegistry::instance().names()) {
    for (const MambaCacheMode cache : {MambaCacheMode::kNone, MambaCacheMode::kAll, MambaCacheMode::kAlign}) {
      add({.name = mode + " cache " + std::string(to_string(cache)), .ssm_mode = mode, .cache = cache,
           .requests = kSmallGraph, .padding_tokens = 1, .padding_requests = 1, .decode_graph = true, .seed = 51});
    }
  }
  add({.name = "mamba1 (N 16) cache all", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll, .ssm_params = kMamba1Big,
       .requests = kSmallGraph, .padding_tokens = 1, .padding_requests = 1, .decode_graph = true, .seed = 53});
  return all;
}

// Host only (runs without a GPU): the routing predicate.
TEST(CudaSsmFixedStep, IsFixedDecodeStep) {
  AttentionConfig config;
  config.ssm_mode = "ema";
  MambaAttentionMetadata metadata;
  const BatchDescription batch;
  EXPECT_TRUE(gpu::is_fixed_decode_step(config, metadata, batch));
  metadata.num_prefills = 1;
  EXPECT_FALSE(gpu::is_fixed_decode_step(config, metadata, batch)) << "a step with prefills";
  metadata.num_prefills = 0;
  config.num_speculative_tokens = 1;
  EXPECT_FALSE(gpu::is_fixed_decode_step(config, metadata, batch)) << "speculative decoding";
  config.num_speculative_tokens = 0;
  config.ssm_mode = "no_such_gpu_mode";
  EXPECT_FALSE(gpu::is_fixed_decode_step(config, metadata, batch)) << "a mode without a GPU implementation";
  for (const std::string& mode : gpu::GpuModeRegistry::instance().names()) {
    config.ssm_mode = mode;
    EXPECT_TRUE(gpu::is_fixed_decode_step(config, metadata, batch)) << mode;
  }
}

// The graph-replay property without the graph: one step prepared for batch A and launched, then
// re-prepared for batch B (same padded shape, B's values copied into the same tensors) and
// launched, leaves exactly the bits of a fresh step for B; that result matches the reference, and
// the eager backend (ssm_forward routes decode steps through a temporary fixed step) gives the
// same bits.
TEST(CudaSsmFixedStep, SmallReprepareEqualsFresh) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  for (const CudaCase& c : fixed_step_cases()) {
    SCOPED_TRACE(c.name);
    const auto [a, b] = graph_pair(c, kSmallGraphB);
    FixedStepSession session(a);
    const MambaAttentionMetadata meta_a = mamba_metadata(session.backend(), a);
    const MambaAttentionMetadata meta_b = mamba_metadata(session.backend(), b);
    ASSERT_EQ(meta_a.cudagraph_padded, 1) << "the builder did not pad A for a CUDA graph";
    ASSERT_EQ(meta_b.cudagraph_padded, 1) << "the builder did not pad B for a CUDA graph";

    gpu::FixedDecodeStep step(a.config, session.context());
    step.prepare(meta_a, a.batch, session.tensors(), session.contribution());
    step.launch();
    const SsmResult after_a = session.read();
    ASSERT_NO_FATAL_FAILURE(expect_matches_reference(a, after_a, reference_result(a, meta_a)));
    EXPECT_EQ(step.num_tokens(), a.batch.num_tokens());
    EXPECT_EQ(step.num_reqs(), a.batch.num_reqs());

    session.load(b);
    step.prepare(meta_b, b.batch, session.tensors(), session.contribution());
    step.launch();
    const SsmResult reprepared = session.read();
    const SsmResult fresh = session.run_fresh(b, meta_b);
    expect_same_bits(reprepared, fresh, "re-prepared vs fresh step for B");
    ASSERT_NO_FATAL_FAILURE(expect_matches_reference(b, fresh, reference_result(b, meta_b)));

    // The eager backend: the same launches, so the same bits.
    const StepOutputs eager = run_step(session.backend(), b);
    expect_same_bits(SsmResult{eager.ssm_output, eager.ssm_state}, fresh, "eager backend vs fixed step for B");
  }
}

// launch() captured into a CUDA graph (relaxed mode, as the backend captures; the step's first
// launch, so its scratch is allocated during the capture — and, run alone, the process's first SSM
// kernels and cuBLAS calls), replayed for A and, after prepare(B), for B: the bits of fresh steps
// for A and B.
TEST(CudaSsmFixedStep, SmallCapturedGraphReplaysNewBatch) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  for (const CudaCase& c : fixed_step_cases()) {
    SCOPED_TRACE(c.name);
    const auto [a, b] = graph_pair(c, kSmallGraphB);
    FixedStepSession session(a);
    const MambaAttentionMetadata meta_a = mamba_metadata(session.backend(), a);
    const MambaAttentionMetadata meta_b = mamba_metadata(session.backend(), b);
    gpu::FixedDecodeStep step(a.config, session.context());
    step.prepare(meta_a, a.batch, session.tensors(), session.contribution());
    CapturedGraph g;
    ASSERT_EQ(cudaStreamBeginCapture(session.stream(), cudaStreamCaptureModeRelaxed), cudaSuccess);
    std::string launch_error;
    try {
      step.launch();
    } catch (const std::exception& e) {
      launch_error = e.what();
    }
    const cudaError_t ended = cudaStreamEndCapture(session.stream(), &g.graph);
    ASSERT_TRUE(launch_error.empty()) << "launch() during a capture threw: " << launch_error;
    ASSERT_EQ(ended, cudaSuccess) << "cudaStreamEndCapture: " << cudaGetErrorString(ended);
    ASSERT_EQ(cudaGraphInstantiate(&g.exec, g.graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(g.exec, session.stream()), cudaSuccess);
    const SsmResult replayed_a = session.read();
    expect_same_bits(replayed_a, session.run_fresh(a, meta_a), "graph replayed for A vs fresh step for A");

    session.load(b);
    step.prepare(meta_b, b.batch, session.tensors(), session.contribution());
    ASSERT_EQ(cudaGraphLaunch(g.exec, session.stream()), cudaSuccess);
    const SsmResult replayed_b = session.read();
    const SsmResult fresh_b = session.run_fresh(b, meta_b);
    expect_same_bits(replayed_b, fresh_b, "graph replayed after prepare(B) vs fresh step for B");
    ASSERT_NO_FATAL_FAILURE(expect_matches_reference(b, replayed_b, reference_result(b, meta_b)));
  }
}

// A request whose state slot is PAD_SLOT_ID (vLLM's padding slot on a real token) is skipped:
// zero contribution rows, no slot read or written — as the reference does.
TEST(CudaSsmFixedStep, SmallSkippedRequestGetsZeros) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  for (const CudaCase& c : fixed_step_cases()) {
    SCOPED_TRACE(c.name);
    const BatchFile file = make_step(c);
    FixedStepSession session(file);
    MambaAttentionMetadata metadata = mamba_metadata(session.backend(), file);
    IntArray& rows = metadata.state_indices_tensor_d;
    for (int64_t col = 0; col < rows.size(1); ++col) rows.at(0, col) = kPadSlotId;  // request 0: 1 token
    const SsmResult actual = session.run_fresh(file, metadata);
    ASSERT_NO_FATAL_FAILURE(expect_matches_reference(file, actual, reference_result(file, metadata)));
    if (c.ssm_mode == "prefix_sum_flat") continue;  // whole-step: ignores the slots
    const int64_t width = file.config.num_heads * file.config.head_size;
    for (int64_t e = 0; e < width; ++e) {
      ASSERT_EQ(load_as_double(actual.ssm_output.data(), actual.ssm_output.dtype(), e), 0.0)
          << "row 0 (a skipped request) element " << e;
    }
  }
}

// Two requests sharing a state slot need two waves: prepare refuses the step (NotSupported naming
// the slot), and the eager backend still runs it (the wave driver) as the reference does.
TEST(CudaSsmFixedStep, SmallSharedSlotIsRefusedAndRunsEagerly) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  for (const CudaCase& c : fixed_step_cases()) {
    if (gpu::GpuModeRegistry::instance().find(c.ssm_mode)->whole_step()) continue;  // no slots
    SCOPED_TRACE(c.name);
    const BatchFile file = make_step(c);
    FixedStepSession session(file);
    HybridMetadata hybrid = session.backend().build_metadata(file.batch);
    MambaAttentionMetadata& metadata = *hybrid.mamba;
    // Request 2 (context 16) reads and writes what request 0 (context 20) writes.
    IntArray& rows = metadata.state_indices_tensor_d;
    const int64_t col0 = c.cache == MambaCacheMode::kAll ? (*metadata.block_idx_last_scheduled_token)[0] : 0;
    const int64_t slot = rows.at(0, col0);
    for (int64_t col = 0; col < rows.size(1); ++col) rows.at(2, col) = static_cast<int32_t>(slot);
    gpu::FixedDecodeStep step(file.config, session.context());
    try {
      step.prepare(metadata, file.batch, session.tensors(), session.contribution());
      ADD_FAILURE() << "prepare accepted requests sharing slot " << slot;
    } catch (const NotSupported& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("share state slot " + std::to_string(slot)), std::string::npos) << what;
    }
    session.load(file);
    session.backend().ssm_forward(hybrid, file.batch, session.tensors(), session.contribution());
    session.backend().synchronize();
    const SsmResult eager = session.read();
    ASSERT_NO_FATAL_FAILURE(expect_matches_reference(file, eager, reference_result(file, metadata)));
  }
}

// prepare refuses another shape, other tensors, prefills and bad slots with the item named, and a
// refused prepare leaves the step's last plan in place.
TEST(CudaSsmFixedStep, SmallPrepareRefusesChanges) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  const auto expect_error = [](const std::function<void()>& call, const std::string& needle, bool not_supported) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
    } catch (const NotSupported& e) {
      EXPECT_TRUE(not_supported) << "NotSupported where Error was expected: " << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    } catch (const Error& e) {
      EXPECT_FALSE(not_supported) << "Error where NotSupported was expected: " << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  for (const std::string mode : {"ema", "mamba1", "prefix_sum_flat"}) {
    SCOPED_TRACE(mode);
    const CudaCase c = ssm_case({.name = mode, .ssm_mode = mode, .cache = MambaCacheMode::kAll,
                                 .requests = kGraphDecodes, .padding_tokens = 3, .padding_requests = 3,
                                 .decode_graph = true, .seed = 55});
    const BatchFile file = make_step(c);
    FixedStepSession session(file);
    const MambaAttentionMetadata metadata = mamba_metadata(session.backend(), file);
    const SsmResult fresh = session.run_fresh(file, metadata);
    session.load(file);
    gpu::FixedDecodeStep step(file.config, session.context());
    step.prepare(metadata, file.batch, session.tensors(), session.contribution());

    // Another padded size (4 rows and requests instead of 8), on the same tensors.
    CudaCase small = c;
    small.requests = kSmallGraph;
    small.padding_tokens = 1;
    small.padding_requests = 1;
    const int64_t slots = file.inputs.ssm_state.empty() ? 0 : file.inputs.ssm_state.begin()->second.size(0);
    const BatchFile other = make_step(small, slots);
    const MambaAttentionMetadata other_meta = mamba_metadata(session.backend(), other);
    expect_error([&] { step.prepare(other_meta, other.batch, session.tensors(), session.contribution()); },
                 "token rows", false);
    // Another contribution buffer.
    const Tensor elsewhere = session.backend().allocate(session.contribution().dtype(), session.contribution().shape());
    expect_error([&] { step.prepare(metadata, file.batch, session.tensors(), elsewhere); }, "the SSM contribution",
                 false);
    // Prefills.
    MambaAttentionMetadata with_prefill = metadata;
    with_prefill.num_prefills = 1;
    expect_error([&] { step.prepare(with_prefill, file.batch, session.tensors(), session.contribution()); },
                 "prefills", true);
    if (mode != "prefix_sum_flat") {
      // A slot outside the pools: the driver's error, naming the metadata entry.
      MambaAttentionMetadata bad_slot = metadata;
      bad_slot.state_indices_tensor_d.at(0, (*bad_slot.block_idx_last_scheduled_token)[0]) = 1000000;
      expect_error([&] { step.prepare(bad_slot, file.batch, session.tensors(), session.contribution()); },
                   "mamba/state_indices_tensor_d[0]", false);
    }
    // The refused calls left the first plan: launching it gives the fresh step's bits.
    session.load(file);
    step.launch();
    expect_same_bits(session.read(), fresh, "launch after refused prepares vs fresh step");
  }
}

#undef SKIP_WITHOUT_CUDA

}  // namespace
}  // namespace hybridtb::testing
