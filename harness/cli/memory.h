// Host-memory estimates and the check made before a large allocation: `gen` and `run` compute what
// they will need (the file sizes and the peak host memory, printed by --dry-run) and refuse to start
// when the peak exceeds the memory available, with a message naming the size and what needs it,
// instead of dying in std::bad_alloc half-way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace hybridtb::cli {

// What the process needs besides its data: the binary, the HDF5 library and its buffers (measured
// at ~12 MiB resident for `hybridtb backends`, and ~15 MiB above the data for `run`); added to
// every peak estimate.
inline constexpr int64_t kProcessOverheadBytes = int64_t{32} << 20;

// Bytes of host memory this process may still use: the lower of /proc/meminfo's MemAvailable and
// the cgroup's limit minus its usage (cgroup v2 memory.max / memory.current, or v1
// memory.limit_in_bytes / memory.usage_in_bytes), when either is known. The environment variable
// HYBRIDTB_MEMORY_AVAILABLE (bytes) replaces the detection (to test the check, or to keep a run
// below a budget of one's own). nullopt if nothing is known (not Linux).
std::optional<int64_t> available_memory_bytes();
// Where available_memory_bytes() came from, for messages ("MemAvailable", "cgroup memory.max", ...).
std::string available_memory_source();

// "1.3 GiB", "12.0 MiB", "512 B".
std::string human_bytes(int64_t bytes);

// What running a batch file's step (run, record) will read, hold and write, from the dataset
// shapes of the input file alone (no data read; list_file_entries). Outputs are counted at 8 bytes an element (the reference's float64, the widest any backend
// writes) and as if the layer had an SSM branch, so the estimate is an upper bound up to HDF5's
// own overhead and the builder metadata (integers per request and token, small by comparison); the
// peak includes kProcessOverheadBytes.
struct StepEstimate {
  int64_t input_file_bytes = 0;    // the tensors of the input file
  int64_t output_file_bytes = 0;   // the inputs (without an old /outputs) + the new /outputs
  int64_t outputs_only_bytes = 0;  // /outputs alone (run --outputs-only)
  int64_t peak_memory_bytes = 0;   // host memory at the peak of read + run
  // false: the tensors declared exceed what the file can hold (more than the reader's 4096:1
  // expansion limit over the file's size): a broken file, for the reader to reject by name, not a
  // large one. The memory check is skipped then, and --dry-run says so.
  bool holds_its_data = true;
};

StepEstimate estimate_step(const std::string& batch_path);

// Throws Error (the CLI: exit 2, nothing written) when `bytes` exceed the memory available, e.g.
//   needs 16.2 GiB of host memory for generating llama3-8b d64@64k, but 6.0 GiB is available
//   (cgroup memory.max); --dry-run prints the sizes without computing
// `what` names what needs it.
void check_memory(int64_t bytes, const std::string& what);

}  // namespace hybridtb::cli
