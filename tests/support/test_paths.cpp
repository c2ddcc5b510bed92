#include "test_paths.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <sys/wait.h>

namespace hybridtb::testing {

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
