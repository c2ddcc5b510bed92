// The attention plan as a value: which kernel every row of a step takes, the work lists the kernels
// read, the decode split sizes, the CTA counts and the layout of the one metadata upload — computed
// on the host from the layer configuration and the batch description by pure functions (no CUDA
// call; this header and attention_work_plan.cpp compile with the host compiler alone), so a plan can
// be printed (`hybridtb run --explain`) and unit-tested without a GPU (tests/attention_plan).
//
// The split of the work follows FlashInfer's plan/run: plan_attention() decides everything that
// depends on the batch; AttentionRunner (attention_plan.h) uploads the plan's staging bytes in one
// copy and launches the kernels the plan names, with the grids the plan sized.
//
// Routing, per request (the rules the kernels' capabilities impose, attention_launch.h):
//   - query_len 0: a padding request (CUDA-graph padding), no work, nothing written;
//   - query_len 1 of a decoder layer whose cache the decode kernels read: the tensor-core decode
//     kernel (16-bit cache = model dtype, D 64/128/256) unless its mm_prefix ranges add keys, else
//     the SIMT decode kernel; long key ranges split across CTAs (the split policy below) and are
//     finished by the combine kernel. A short query (query_len ≤ kDecodeRowsMaxQueryLen: a
//     speculative step's draft tokens) runs the same way, one decode row per query token, its rows
//     packed into the tensor-core decode's MMA columns (query heads × tokens ≤ 8 or 16 per CTA), so
//     a CTA reads the request's keys once for all of them;
//   - other rows: the tensor-core prefill kernel where it applies (16-bit model dtype = cache
//     element, D 64/128/256, aligned rows), else the generic SIMT kernel.
// A step with both tensor-core prefill items and tensor-core decode items runs them in one grid of
// the mixed kernel where it applies (mixed_supported, attention_caps.h), in the interleaved order
// of AttentionPlan::mixed (plan_mixed_order in attention_work_plan.cpp); split decode rows are
// still finished by the combine kernel after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attention/attention_params.h"
#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/metadata.h"

namespace hybridtb::cuda {

// How a decode kernel's key ranges are cut into CTAs (split_decode_rows): keys per split the power
// of two that gives the kernel's grid about ctas_per_sm CTAs per SM, within [min_keys, max_keys]
// (powers of two, at least 64); each row then splits evenly.
struct DecodeSplitPolicy {
  int64_t ctas_per_sm;
  int64_t min_keys;
  int64_t max_keys;
};
// The SIMT decode kernel: several waves of resident CTAs even for one long row (1×32k: 128 splits
// of 256 keys).
inline constexpr DecodeSplitPolicy kSimtDecodeSplit{16, 256, 8192};
// The tensor-core decode kernel streams a split at the bandwidth once its ring is full, and each
// CTA's start (block-table entries, the first tiles) and each split's share of the combine cost
// the time of a few hundred keys, so its splits are long: at least 1024 keys, at most 4096 (a
// 4k-context row stays whole), about 4 CTAs per SM: the best of the benchmark's --mma-decode-split
// sweep on an H200 across its decode cases (experiments/results/README.md).
inline constexpr DecodeSplitPolicy kMmaDecodeSplit{4, 1024, 4096};

// Where the wgmma prefill is the default (Hopper), a step whose tensor-core prefill items hold fewer
// FLOPs than this (tokens × heads × key span × 4·D, summed over the items) runs the mma.sync kernel
// instead: at one CTA of 384 threads per SM (230 KiB of shared memory) the wgmma kernel's start and
// its waves cost as much as its faster MMAs gain on short items. Measured on an H200
// (experiments/results/README.md, b49df0e): a fresh 2048-token prompt (35 GFLOP by this count) took
// 166.6 µs on mma.sync and 122.6 on wgmma, a 4096-token one (138 GFLOP) 591.9 and 362.0 µs; the
// threshold sits just below the 2k prompt (where the two cross, below it, was not measured).
inline constexpr double kWgmmaPrefillMinFlops = 32e9;

// Requests with at most this many query tokens run one decode row per token (each row sees its own
// causal keys) instead of prefill items. A speculative decode step verifies a few draft tokens per
// request: as prefill items, 64 such requests at 4k keys are 64 CTAs per kv head of 16-row tiles
// that are mostly padding, each reading its request's whole context; as decode rows, the decode
// kernels split the reads over the GPU as for any decode, and the tensor-core decode packs a
// request's rows into the columns its kv head's query heads leave (decode_mma_columns), so that one
// CTA reads the keys once for as many rows as fit (16 columns: 4 rows of Llama-3's 4 heads per kv
// head, 2 of 8). Rows that do not fit read the keys again, so the reads grow with the query length:
// past a handful of tokens the prefill tiles' reuse of a K/V tile by every row wins. The standard
// suite's speculative cases (s8x4, s64x4, s64x2 beside 64 decodes) have 2 to 4 query tokens (1 to 3
// draft tokens); 8 is a choice the benchmark's "as prefill items" rows measure.
inline constexpr int64_t kDecodeRowsMaxQueryLen = 8;

// A step with both tensor-core prefill items and tensor-core decode CTAs runs them in one grid of
// the mixed kernel, whose prefill body is the mma.sync one. Where the wgmma prefill is the default
// (Hopper) and the step's prefill takes it (kWgmmaPrefillMinFlops), the step takes that grid only
// while the prefill's FLOPs per byte of the decode's K/V reads stay at or below this; above it the
// prefill's time dominates the step, and the faster wgmma kernel launched on its own beats hiding
// the decode's reads under a slower prefill. Measured on an H200 (experiments/results/README.md):
// a 2048-token chunk at context 4096 beside 64 decodes at 4k keys (160 FLOP per byte) took 1049.1
// µs in one grid and 744.4 apart; a fresh 2048-token prompt beside the same decodes (32 FLOP per
// byte, and below kWgmmaPrefillMinFlops) 411.6 µs in one grid and 477.2 apart. The threshold sits
// between the two; where exactly they cross was not measured.
inline constexpr double kMixedGridMaxFlopsPerByte = 80.0;

// Debugging and comparison switches: force rows onto a path other than the one the planner would
// choose. Production code passes the defaults; benchmarks and tests pass what they compare.
struct AttentionPathOverrides {
  // Every row on the generic SIMT kernel (no decode kernel, no tensor-core prefill).
  bool force_generic = false;
  // Decode rows on the SIMT decode kernel even where the tensor-core decode kernel applies.
  bool simt_decode = false;
  // Non-decode rows on the generic SIMT kernel instead of the tensor-core prefill kernel (the
  // benchmark's "prefill 1x4k generic" row).
  bool generic_prefill = false;
  // Tile variant of the tensor-core prefill kernel (prefill_config in attention_caps.h); −1: the
  // default (on a device that runs the wgmma variant, AttentionPlanInput::hopper_wgmma, that
  // variant where it applies, the step's prefill has at least kWgmmaPrefillMinFlops and the step
  // runs no mixed grid; else the head size's mma.sync
  // default). The other variants exist for head size 128 (the benchmark's "v0", "v2" and "mma.sync"
  // rows). Variant 3 (wgmma, Hopper) needs an sm_90a build (an error otherwise)
  // and runs layers of head size 128 with a 16-bit cache of the model dtype or a 1-byte cache (fp8
  // e4m3 / e5m2 per tensor, int8 / fp8 per token-head); any other layer runs the default variant,
  // and the plan summary says why (prefill_variant_fallback).
  int prefill_variant = -1;
  // Key split of the tensor-core decode kernel in place of kMmaDecodeSplit (the benchmark's
  // --mma-decode-split, for tuning the policy); fixed-shape capacities follow it too.
  std::optional<DecodeSplitPolicy> mma_decode_split;
  // Tensor-core prefill and decode items of one step in separate launches even where the mixed
  // kernel applies (the benchmark's "separate" rows; the tests' bitwise comparison of the two).
  bool separate_mixed = false;
  // Short queries (kDecodeRowsMaxQueryLen) as prefill items, not one decode row per token (the
  // benchmark's "as prefill items" rows; the tests' comparison of the two routes).
  bool short_queries_as_prefill = false;
};

// What the bound tensors allow (decided by the runner from the device pointers and strides; the
// explain path assumes the contiguous, aligned tensors the backend allocates itself).
struct TensorLayoutFacts {
  bool cache_vectorisable = true;  // KV cache rows in 16-byte chunks: the decode kernels' loads, cp.async
  bool rows_aligned = true;        // query/output/cache rows as the tensor-core prefill needs them
};

// The kernels a layer's rows may take, with the reason when one is out (empty string: it applies).
struct LayerRoutes {
  bool decode_ok = false;      // decode rows can take a decode kernel
  std::string decode_mma_why;  // why decode rows cannot take the tensor-core decode kernel
  std::string prefill_why;     // why non-decode rows cannot take the tensor-core prefill kernel
};
LayerRoutes route_layer(const AttentionConfig& config, const AttentionPathOverrides& overrides,
                        const TensorLayoutFacts& facts);
// A CUDA-graph decode step (fix_shape): the decode kernels, the cache's alignment checked at launch.
LayerRoutes route_graph_step(const AttentionConfig& config, const AttentionPathOverrides& overrides);

// Fixed-shape mode (CUDA graphs): the padded shape and the work-list capacities that bound every
// batch of that shape; the plan pads its lists to them with sentinel items the kernels skip.
struct FixedShapeCapacity {
  int64_t num_reqs = 0;
  int64_t block_columns = 0;
  bool mm_prefix = false;
  int64_t mm_ranges = 0;
  int64_t decode_capacity = 0;      // SIMT decode items
  int64_t decode_mma_capacity = 0;  // tensor-core decode items
};
// Throws NotSupported if the layer or the batch cannot run on the decode kernels.
FixedShapeCapacity fixed_shape_capacity(const AttentionConfig& config, const AttentionPathOverrides& overrides,
                                        const BatchDescription& batch, int num_sms);

struct AttentionPlanSummary {
  int64_t decode_rows = 0;     // rows on the decode fast path
  int64_t decode_ctas = 0;     // their CTAs along the key axis (× kv heads × head passes in the grid)
  int64_t split_rows = 0;      // decode rows split across CTAs (finished by the combine kernel)
  int64_t decode_mma_rows = 0;  // of decode_rows: on the tensor-core decode kernel (the rest: SIMT)
  int64_t decode_mma_ctas = 0;  // of decode_ctas: the tensor-core kernel's
  std::string decode_fallback;  // why decode rows took the SIMT decode kernel ("" if none did)
  // The tensor-core decode's product operands where its 1-byte cache takes the float16 route
  // (decode_float16_products: a float16 model's, a bfloat16 model's per-tensor), "" otherwise.
  std::string decode_operands;
  int64_t prefill_rows = 0;    // query rows (tokens) on the tensor-core prefill path
  int64_t prefill_items = 0;   // CTAs of the prefill kernel
  std::string prefill_fallback;  // why non-decode rows took the generic path ("" if none did)
  // The tile variant of the tensor-core prefill (AttentionPlan::prefill_variant; the mixed grid's
  // prefill CTAs run the head size's mma.sync default).
  int prefill_variant = -1;
  // Why the requested prefill_variant was not taken and the head size's default ran instead ("" if
  // it was): the wgmma variant's head size limit (prefill_wgmma_unsupported).
  std::string prefill_variant_fallback;
  // The wgmma prefill's K/V tiles of whole pages by TMA (prefill_wgmma_kernel.cuh): set by the
  // runner that launches it once it holds the cache's tensor map; otherwise why every tile takes
  // cp.async (empty where the runner did not say: plan_attention leaves both unset).
  bool prefill_kv_tma = false;
  std::string prefill_kv_tma_fallback;
  // The wgmma prefill's product operands where they are not the model dtype's
  // (wgmma_float16_products: a 1-byte cache with plain logits), "" otherwise.
  std::string prefill_operands;
  int64_t generic_items = 0;   // CTAs of the generic kernel
  int64_t generic_rows = 0;    // query rows on the generic path
  int64_t mixed_prefill_ctas = 0;  // CTAs of the mixed kernel that run prefill items (0: no mixed grid)
  int64_t mixed_decode_ctas = 0;   // CTAs of the mixed kernel that run tensor-core decode CTAs
  std::string mixed_fallback;  // why a step with both kinds launched them separately ("" otherwise)
  bool mixed() const { return mixed_prefill_ctas + mixed_decode_ctas > 0; }
  std::string describe() const;
};

enum class RowPath { kPadding, kDecodeMma, kDecodeSimt, kPrefillMma, kGeneric };
const char* to_string(RowPath path);

// One request's route: its path, and for decode rows the visible keys and their split.
struct RequestRoute {
  int64_t request = 0;
  int64_t query_len = 0;
  RowPath path = RowPath::kPadding;
  int64_t key_begin = 0;  // decode rows: the keys the row reads, [key_begin, key_end)
  int64_t key_end = 0;
  int64_t splits = 0;     // decode rows: CTAs along the key axis; other rows: work items
};

// The one upload, in order, each array at a 16-byte boundary: byte offsets and the total.
struct StagingLayout {
  size_t query_start_loc = 0;
  size_t seq_lens = 0;
  size_t block_table = 0;
  size_t mm_prefix = 0;
  size_t generic_items = 0;
  size_t prefill_items = 0;
  size_t decode_items = 0;
  size_t decode_mma_items = 0;
  size_t combine_items = 0;
  size_t mixed_items = 0;
  size_t bytes = 0;
};

struct AttentionPlan {
  std::vector<RequestRoute> requests;
  // The work lists, as the kernels read them (fixed-shape mode: padded with sentinels).
  std::vector<GenericItem> generic;
  std::vector<GenericItem> prefill;     // longest key spans first
  std::vector<DecodeItem> decode;       // SIMT decode kernel
  std::vector<DecodeItem> decode_mma;   // tensor-core decode kernel
  std::vector<CombineItem> combine;
  // The mixed kernel's CTAs (empty: prefill and decode items in their own launches); then the
  // prefill and tensor-core decode lists above are what its CTAs index, and no other kernel runs them.
  std::vector<MixedItem> mixed;
  // Kernel shapes.
  int heads_per_pass = 1;           // SIMT decode: query heads per CTA
  int mma_columns = 8;              // tensor-core decode: MMA N columns per CTA (decode_mma_columns)
  int64_t decode_chunk = 0;         // SIMT decode: keys per split (0: no rows)
  int64_t decode_mma_chunk = 0;     // tensor-core decode: keys per split (0: no rows)
  int prefill_variant = 0;          // tensor-core prefill tile variant
  int64_t prefill_rows_per_item = 0;
  int64_t decode_grid_ctas = 0;     // items × kv heads × head passes
  int64_t decode_mma_grid_ctas = 0;
  int64_t combine_grid_ctas = 0;    // items × query heads
  // Workspace: split partials ([slots, Hq, D] numerators, [slots, Hq, 2] max/denominator, float).
  int64_t partial_slots = 0;
  size_t partial_acc_bytes = 0;
  size_t partial_ml_bytes = 0;
  // The upload: query_start_loc, seq_lens, block table (stride below), mm ranges, work lists.
  int64_t block_table_stride = 0;
  int32_t num_mm_ranges = 0;
  StagingLayout staging;
  AttentionPlanSummary summary;
  // Context for the text form.
  int num_sms = 0;
  bool fixed_shape = false;
  std::optional<TritonAttentionMetadata> engine;  // vLLM's metadata of the same step, if given
};

struct AttentionPlanInput {
  const AttentionConfig* config = nullptr;
  const BatchDescription* batch = nullptr;
  int num_sms = 1;
  // The device runs the Hopper wgmma prefill variant (compute capability 9.0 and a build with sm_90a
  // code): it is then the default for the layers it takes (choose_prefill_variant).
  bool hopper_wgmma = false;
  AttentionPathOverrides overrides;
  LayerRoutes routes;
  const FixedShapeCapacity* fixed = nullptr;         // fixed-shape mode, else nullptr
  const TritonAttentionMetadata* engine = nullptr;   // optional: checked against the batch, reported
};

// The checks of a batch that need no tensor (fixed: the captured shape, or nullptr).
void check_attention_batch(const AttentionConfig& config, const BatchDescription& batch,
                           const FixedShapeCapacity* fixed);
// Checks the block table's entries for every block the requests need against [0, cache_blocks);
// returns how many blocks the batch spans (the largest id + 1; 0 for none).
int64_t referenced_blocks(const AttentionConfig& config, const BatchDescription& batch, int64_t cache_blocks);

// The plan of one step (throws Error on an invalid batch, naming the field). `recycled`: a plan no
// longer needed (the runner's previous one), whose vectors' storage the new plan reuses, so that
// steps of about one size allocate nothing; its contents play no part.
AttentionPlan plan_attention(const AttentionPlanInput& input, AttentionPlan recycled = {});
// The bytes of the one upload, laid out as plan.staging says, into `bytes` (plan.staging.bytes long:
// the runner's pinned upload buffer, so each byte is written once, the gaps between arrays zero). A
// decoder layer's block ids are checked on the way as referenced_blocks checks them against
// cache_blocks (one pass over a block table of megabytes, staged every step). Returns the blocks the
// batch spans (the largest id + 1; 0 for an encoder-only layer, which has no cache).
int64_t stage_plan(const AttentionPlan& plan, const AttentionConfig& config, const BatchDescription& batch,
                   int64_t cache_blocks, std::span<unsigned char> bytes);
// The same into a new buffer, the ids checked against no cache size.
std::vector<unsigned char> stage_plan(const AttentionPlan& plan, const AttentionConfig& config,
                                      const BatchDescription& batch);
// Human-readable text, one line per fact ("request 0: decode, tensor-core decode, ...").
std::string describe_plan(const AttentionPlan& plan, const AttentionConfig& config);

}  // namespace hybridtb::cuda
