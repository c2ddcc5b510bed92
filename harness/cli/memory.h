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

// Throws Error (the CLI: exit 2, nothing written) when `bytes` exceed the memory available, e.g.
//   needs 13.2 GiB of host memory for the inputs, outputs and KV cache of the step, but 5.8 GiB is
//   available (cgroup memory.max); see --dry-run for the sizes
// `what` names what needs it.
void check_memory(int64_t bytes, const std::string& what);

}  // namespace hybridtb::cli
