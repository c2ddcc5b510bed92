// Paths and tools the tests need: the source tree, a fresh scratch directory per test, the
// hybridtb executable and a python3 that can import h5py (for interoperability tests).
#pragma once

#include <filesystem>
#include <string>

namespace hybridtb::testing {

std::filesystem::path source_dir();
// A new empty directory under the build tree, unique to the running test; removed when the test
// ends if it passed (left behind for inspection otherwise).
std::filesystem::path scratch_dir();
// Absolute path of a python3 with h5py and numpy, or "" if none was found at configure time.
std::string python_with_h5py();

// Runs a shell command, returning its exit status; stdout+stderr are captured into `output`.
int run_command(const std::string& command, std::string* output = nullptr);

}  // namespace hybridtb::testing
