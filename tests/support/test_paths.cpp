#include "test_paths.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <sys/wait.h>
#include <system_error>
#include <utility>

namespace hybridtb::testing {
namespace {

// Removes the scratch directory of a test that passed when the test ends (some tests write batch
// files of hundreds of MB, and a CI machine's disk is small); a failed test's stays for inspection.
class ScratchCleaner : public ::testing::EmptyTestEventListener {
 public:
  void set(std::filesystem::path dir) { dir_ = std::move(dir); }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (dir_.empty()) return;
    if (info.result() != nullptr && info.result()->Passed()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
    dir_.clear();
  }

 private:
  std::filesystem::path dir_;
};

// Registered on the first scratch_dir() call; GoogleTest owns the listener from then on.
ScratchCleaner& cleaner() {
  static ScratchCleaner* const instance = [] {
    auto* c = new ScratchCleaner;
    ::testing::UnitTest::GetInstance()->listeners().Append(c);
    return c;
  }();
  return *instance;
}

}  // namespace

std::filesystem::path source_dir() { return HYBRIDTB_SOURCE_DIR; }

std::filesystem::path scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "no_test";
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  const std::filesystem::path dir = std::filesystem::path(HYBRIDTB_BINARY_DIR) / "test_scratch" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  if (info != nullptr) cleaner().set(dir);
  return dir;
}

std::string python_with_h5py() { return HYBRIDTB_PYTHON_WITH_H5PY; }

int run_command(const std::string& command, std::string* output) {
  const std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buffer{};
  std::string captured;
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) captured.append(buffer.data(), n);
  const int status = pclose(pipe);
  if (output != nullptr) *output = captured;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace hybridtb::testing
