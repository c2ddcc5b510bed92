// A progress bar for the multi-file subcommands (record, parity, replay): a `\r`-redrawn line on
// stderr — never stdout, which may carry a table or JSON — shown only when stderr is a terminal and
// the run has lasted more than a second, redrawn at most ~10 times a second, with done/total,
// elapsed time, ETA and the current file. Silent under --quiet. Tested by tests/compare.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace hybridtb::cli {

class ProgressBar {
 public:
  // `enabled` = false (or stderr not a terminal) makes every call a no-op.
  ProgressBar(int64_t total, bool enabled, std::FILE* stream = stderr);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Starting work on item `current` (0-based) named `label`.
  void update(int64_t done, const std::string& label);
  // Clears the line (before printing anything else to the terminal, and at the end).
  void clear();

  // The line for a state, without the leading `\r` (exposed for tests): "[3/10] 1.2s ETA 2.8s  file.h5".
  static std::string format_line(int64_t done, int64_t total, double elapsed_s, const std::string& label,
                                 int width = 24);

 private:
  int64_t total_;
  bool active_;
  std::FILE* stream_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace hybridtb::cli
