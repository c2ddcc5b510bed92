// Host-memory detection and the pre-allocation check (memory.h).
#include "memory.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

#include "hybridtb/batch_file.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"

namespace hybridtb::cli {

namespace {

// A file holding one number ("max" = no limit), or nullopt.
std::optional<int64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    size_t used = 0;
    const long long value = std::stoll(word, &used);
    if (used != word.size() || value < 0) return std::nullopt;
    return static_cast<int64_t>(value);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<int64_t> mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

struct Available {
  std::optional<int64_t> bytes;
  std::string source;
};

Available detect() {
  if (const char* env = std::getenv("HYBRIDTB_MEMORY_AVAILABLE"); env != nullptr && *env != '\0') {
    try {
      size_t used = 0;
      const long long value = std::stoll(env, &used);
      if (used == std::string(env).size() && value >= 0) return {value, "HYBRIDTB_MEMORY_AVAILABLE"};
    } catch (const std::exception&) {
    }
    throw Error(std::string("HYBRIDTB_MEMORY_AVAILABLE must be a byte count (a non-negative integer), got '") + env +
                "'");
  }
  Available best{mem_available(), "MemAvailable"};
  const auto consider = [&](std::optional<int64_t> limit, std::optional<int64_t> usage, const char* source) {
    if (!limit || *limit >= std::numeric_limits<int64_t>::max() / 2) return;  // v1 "no limit" is a huge number
    const int64_t left = *limit - usage.value_or(0);
    if (!best.bytes || left < *best.bytes) best = {std::max<int64_t>(left, 0), source};
  };
  consider(read_number("/sys/fs/cgroup/memory.max"), read_number("/sys/fs/cgroup/memory.current"),
           "cgroup memory.max");
  consider(read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
           read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes"), "cgroup memory.limit_in_bytes");
  return best;
}

}  // namespace

std::optional<int64_t> available_memory_bytes() { return detect().bytes; }

std::string available_memory_source() { return detect().source; }

std::string human_bytes(int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (bytes >= (int64_t{1} << 30)) {
    out << static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30) << " GiB";
  } else if (bytes >= (int64_t{1} << 20)) {
    out << static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 20) << " MiB";
  } else if (bytes >= 1024) {
    out << static_cast<double>(bytes) / 1024.0 << " KiB";
  } else {
    out << bytes << " B";
  }
  return out.str();
}

namespace {
// Byte counts of hostile files (a few kilobytes declaring 2^60-element datasets) must not overflow:
// sums and products saturate at int64's maximum, which no memory check lets through.
constexpr int64_t kSaturated = std::numeric_limits<int64_t>::max();
int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kSaturated : r;
}
int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? kSaturated : r;
}
}  // namespace

StepEstimate estimate_step(const std::string& path) {
  int64_t all = 0, old_outputs = 0, tensors = 0, kv = 0, pools = 0, tokens = 0, attention_row = 0, linear_row = 0;
  for (const FileEntry& entry : list_file_entries(path)) {
    if (entry.kind != "dataset") continue;
    int64_t numel = 1;
    for (const int64_t d : entry.shape) numel = mul(numel, std::max<int64_t>(d, 0));
    int64_t size = 8;  // an unlabelled or unknown type: assume the widest
    try {
      size = element_size(dtype_from_string(entry.dtype_name));
    } catch (const Error&) {
    }
    const int64_t bytes = mul(numel, size);
    all = add(all, bytes);
    const auto under = [&](const char* prefix) { return entry.path.rfind(prefix, 0) == 0; };
    if (under("/outputs/")) old_outputs = add(old_outputs, bytes);
    if (under("/inputs/") || under("/weights/")) tensors = add(tensors, bytes);
    if (entry.path == "/inputs/kv_cache" || entry.path == "/inputs/k_scale_cache" ||
        entry.path == "/inputs/v_scale_cache") {
      kv = add(kv, bytes);
    }
    if (under("/inputs/ssm/")) pools = add(pools, bytes);
    if (entry.path == "/batch/slot_mapping" && entry.shape.size() == 1) tokens = entry.shape[0];
    if (entry.path == "/inputs/query" && entry.shape.size() == 3) attention_row = mul(entry.shape[1], entry.shape[2]);
    if (under("/inputs/") && !under("/inputs/ssm/") && entry.shape.size() == 2) {
      linear_row = std::max(linear_row, entry.shape[1]);  // a linear layer's output is at most its widest input
    }
  }
  // output, attn_output and ssm_output of an attention layer; output alone of a linear one.
  const int64_t outputs = mul(mul(tokens, attention_row > 0 ? 3 * attention_row : linear_row), 8);
  const int64_t after = add(add(outputs, kv), pools);  // /outputs: the outputs, the KV cache and pools after
  StepEstimate e;
  e.input_file_bytes = all;
  e.output_file_bytes = add(all == kSaturated ? all : all - old_outputs, after);
  e.outputs_only_bytes = after;
  // The file read, the inputs copied into the backend (host memory for the reference), the output
  // buffers, and the host copies of everything /outputs holds.
  e.peak_memory_bytes = add(add(add(add(all, tensors), outputs), after), kProcessOverheadBytes);
  // The reader accepts at most 4096:1 between a dataset's declared and stored bytes (compressed;
  // uncompressed data must be stored whole), so a file declaring more than that over its whole size
  // is invalid whatever the memory, and the reader's error names the dataset.
  std::error_code error;
  const auto file_bytes = std::filesystem::file_size(path, error);
  e.holds_its_data = !error && all / 4096 <= static_cast<int64_t>(file_bytes);
  return e;
}

void check_memory(int64_t bytes, const std::string& what) {
  const Available available = detect();
  if (!available.bytes || bytes <= *available.bytes) return;
  throw Error("needs " + human_bytes(bytes) + " of host memory for " + what + ", but " +
              human_bytes(*available.bytes) + " is available (" + available.source +
              "); --dry-run prints the sizes without computing");
}

}  // namespace hybridtb::cli
