// A progress bar for the multi-file subcommands (record, parity, replay) and for the work inside one
// step (run, record: StepProgress below): a `\r`-redrawn line on stderr — never stdout, which may
// carry a table or JSON — shown only when stderr is a terminal and the run has lasted more than a
// second, redrawn at most ~10 times a second, with done/total, elapsed time, ETA and a label.
// Silent under --quiet. Forced (--progress) it is shown from the start whatever stderr is; on a
// stream that is not a terminal each drawing is a line of its own (no `\r`), the last one with
// done == total. Tested by tests/compare and tests/cli.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "hybridtb/progress.h"

namespace hybridtb::cli {

class ProgressBar {
 public:
  // `enabled` = false (or stderr not a terminal, unless `forced`) makes every call a no-op.
  ProgressBar(int64_t total, bool enabled, std::FILE* stream = stderr, bool forced = false);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Starting work on item `current` (0-based) named `label`.
  // `work_fraction` (>= 0) is the fraction of the work done, for the ETA; by default done/total.
  // Updates marked `stage_end` (and, on a forced bar, done == total) are drawn even when throttled.
  void update(int64_t done, const std::string& label, double work_fraction = -1, bool stage_end = false);
  void set_total(int64_t total) { total_ = total; }
  // A new stage of work begins now: the ETA extrapolates from its time alone (what came before it,
  // reading the file, say, does not predict it).
  void start_stage() { stage_start_ = std::chrono::steady_clock::now(); }
  // Clears the line (before printing anything else to the terminal, and at the end).
  void clear();

  // The line for a state, without the leading `\r` (exposed for tests): "[3/10] 1.2s ETA 2.8s  file.h5".
  // The ETA extrapolates `eta_elapsed_s` (default: elapsed_s) over the work left.
  static std::string format_line(int64_t done, int64_t total, double elapsed_s, const std::string& label,
                                 int width = 24, double work_fraction = -1, double eta_elapsed_s = -1);

 private:
  int64_t total_;
  bool active_;
  bool forced_;
  bool terminal_;
  std::FILE* stream_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  std::chrono::steady_clock::time_point stage_start_;
};

// The progress of one step's computation (ProgressSink, for StepOptions::progress) drawn on a bar:
// "[####....] 1536/8192  12.3s  ETA 30.1s  <prefix>attention (query tokens)".
class StepProgress final : public ProgressSink {
 public:
  StepProgress(ProgressBar& bar, std::string prefix = "") : bar_(bar), prefix_(std::move(prefix)) {}
  void report(const std::string& stage, int64_t done, int64_t total, double work_fraction) override {
    bar_.set_total(total);
    // A new stage and the end of one are always drawn, so a long stage after a short one (the SSM
    // branch after the attention) shows its name at once.
    const bool boundary = stage != stage_ || done == total;
    if (stage != stage_) bar_.start_stage();
    stage_ = stage;
    bar_.update(done, prefix_ + stage + " (query tokens)", work_fraction, boundary);
  }

 private:
  ProgressBar& bar_;
  std::string prefix_;
  std::string stage_;
};

}  // namespace hybridtb::cli
