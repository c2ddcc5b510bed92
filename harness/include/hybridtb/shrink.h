// `hybridtb shrink`: reduces a batch on which a backend fails parity (or throws) to a minimal
// batch that still fails the same way, for a bug report.
//
// The search is greedy and repeats until nothing more can be removed (or the time limit): switch
// features off one at a time (soft cap, sinks, ALiBi, the sliding window, mm-prefix ranges, the
// SSM branch, fp8 output, CUDA-graph padding), drop requests (halves, then quarters, …, then one
// at a time, as delta debugging does), shorten each request's query (to 1 token, else by halves),
// drop whole blocks from the start of each request's context, keep fewer KV heads (with their
// query heads), and at the end renumber the KV blocks (and the state slots that index by them) so
// that the file holds only the blocks the batch references. Every candidate is a valid batch
// (whatever does not validate is skipped) and is kept only if it still fails the same way: the
// same backend error, or a mismatch in at least one of the quantities that mismatched at first.
//
// The reductions are plain functions on a BatchFile, exposed for the tests; each returns
// std::nullopt where it does not apply. None of them keeps /outputs or /expected: both describe
// the original batch.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hybridtb/batch_file.h"

namespace hybridtb::shrink {

// How a batch fares under the predicate.
struct Verdict {
  bool valid = true;           // false: the candidate is not a batch both backends accept
  bool fails = false;          // a mismatch, or the candidate backend threw Error
  bool backend_error = false;  // the candidate backend threw Error (message in `detail`)
  std::vector<std::string> quantities;  // the mismatching quantities ("output", "kv_cache", …)
  std::string detail;          // one line for the log
};

// Runs `candidate` and `against` (two registered backend names) on the batch and compares them as
// `hybridtb parity` does. An Error or NotSupported from `against`, or a batch that fails
// validation, makes the verdict invalid; NotSupported from the candidate is not a failure.
Verdict judge_parity(const BatchFile& file, const std::string& candidate, const std::string& against);

// Whether `now` fails in the way `original` did (see the file comment).
bool fails_the_same_way(const Verdict& original, const Verdict& now);

struct Options {
  double time_limit_s = 600.0;                         // stop searching after this long (keep the best)
  std::function<void(const std::string&)> on_step;     // one line per kept reduction (progress)
};

struct Step {
  std::string reduction;  // "drop requests 2..3", "truncate query of request 0 to 1", …
  std::string batch;      // the batch after it: "R=2 T=3 blocks=4 heads=8/2"
};

struct Result {
  BatchFile minimal;
  Verdict original;
  Verdict final_verdict;
  std::vector<Step> kept;   // the reductions kept, in order
  int64_t tried = 0;        // candidates judged
  double seconds = 0.0;
  bool timed_out = false;
};

using Judge = std::function<Verdict(const BatchFile&)>;

// Shrinks `file`, which must fail under `judge` (else Error). Deterministic for a deterministic judge.
Result shrink_batch(const BatchFile& file, const Judge& judge, const Options& options = {});

// "R=2 T=3 (actual 3) blocks/request<=2 heads=8/2 cache blocks=5": what a step leaves.
std::string describe(const BatchFile& file);
// Blocks of the KV cache a request spans: ceil(seq_len / block_size).
int64_t blocks_of_request(const BatchFile& file, int64_t request);

// --- the reductions --------------------------------------------------------------------------------
// Keeps the requests `kept` (increasing indices), with their token rows; padding rows stay.
std::optional<BatchFile> keep_requests(const BatchFile& file, const std::vector<int64_t>& kept);
// Keeps the first `query_len` (≥ 1) tokens of request `r`'s query (its seq_len shrinks with it).
std::optional<BatchFile> truncate_query(const BatchFile& file, int64_t r, int64_t query_len);
// Removes the first `blocks` blocks of request `r`'s context (its positions move down by
// blocks·block_size; the cached values keep their slots). Decoder layers without mm-prefix ranges,
// and without an SSM prefix cache, whose state blocks follow the positions.
std::optional<BatchFile> drop_context_blocks(const BatchFile& file, int64_t r, int64_t blocks);
// Keeps KV heads first … first+count−1 and their query heads, sinks and ALiBi slopes (layers
// without an SSM branch: its weights are sized by the query heads).
std::optional<BatchFile> keep_kv_heads(const BatchFile& file, int64_t first, int64_t count);
// Switches one feature off: "soft_cap", "sinks", "alibi", "sliding_window", "mm_prefix", "ssm",
// "fp8_output", "padding". nullopt where the batch does not use it.
std::optional<BatchFile> remove_feature(const BatchFile& file, const std::string& feature);
const std::vector<std::string>& feature_names();
// Renumbers the referenced KV blocks (block 0, vLLM's null block, stays 0) and drops the rest of
// the cache; state pools indexed by the same block table are renumbered with it.
std::optional<BatchFile> compact_blocks(const BatchFile& file);

}  // namespace hybridtb::shrink
