// A progress bar for the multi-file subcommands (record, parity, replay) and for the work inside one
// step (run, record: StepProgress below): a `\r`-redrawn line on stderr — never stdout, which may
// carry a table or JSON — shown only when stderr is a terminal and the run has lasted more than a
// second, redrawn at most ~10 times a second, with done/total, elapsed time, ETA and a label.
// Silent under --quiet. Forced (--progress) it is shown from the start whatever stderr is; on a
// stream that is not a terminal each drawing is a line of its own (no `\r`), the last one with
// done == total. On a terminal a ticker thread redraws the last state once a second while no
// update comes, so the elapsed time keeps moving through a long stretch of work without a count
// (one request's long prefill in the SSM branch). Tested by tests/compare and tests/cli.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
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
  void set_total(int64_t total);
  // A new stage of work begins now: the ETA extrapolates from its time alone (what came before it,
  // reading the file, say, does not predict it).
  void start_stage();
  // Clears the line (before printing anything else to the terminal, and at the end).
  void clear();

  // The line for a state, without the leading `\r` (exposed for tests): "[3/10] 1.2s ETA 2.8s  file.h5".
  // The ETA extrapolates `eta_elapsed_s` (default: elapsed_s) over the work left.
  static std::string format_line(int64_t done, int64_t total, double elapsed_s, const std::string& label,
                                 int width = 24, double work_fraction = -1, double eta_elapsed_s = -1);

 private:
  void draw_locked(std::chrono::steady_clock::time_point now);  // the last state, mutex_ held
  void tick();                                                   // the ticker thread's loop

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  // The last update, redrawn by the ticker; none after clear() until the next update.
  bool has_state_ = false;
  int64_t last_done_ = 0;
  std::string last_label_;
  double last_work_fraction_ = -1;
  int64_t total_;
  bool active_;
  bool forced_;
  bool terminal_;
  std::FILE* stream_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  std::chrono::steady_clock::time_point stage_start_;
  std::thread ticker_;  // last: started once every other member is initialised
};

// Progress reports (ProgressSink: a step's computation through StepOptions::progress, a file's
// read or write through FileProgress, a generator's fill) drawn on a bar, labelled with the stage
// and its unit: "[####....] 1536/8192  12.3s  ETA 30.1s  <prefix>attention (query tokens)",
// "[##......] 310/1100  0.9s  ETA 2.4s  writing out.h5 (MiB)". Several sinks may share one bar,
// one after the other.
class StepProgress final : public ProgressSink {
 public:
  StepProgress(ProgressBar& bar, std::string prefix = "", std::string unit = "query tokens")
      : bar_(bar), prefix_(std::move(prefix)), unit_(std::move(unit)) {}
  void report(const std::string& stage, int64_t done, int64_t total, double work_fraction) override {
    bar_.set_total(total);
    // A new stage and the end of one are always drawn, so a long stage after a short one (the SSM
    // branch after the attention) shows its name at once.
    const bool boundary = stage != stage_ || done == total;
    if (stage != stage_) bar_.start_stage();
    stage_ = stage;
    bar_.update(done, prefix_ + stage + " (" + unit_ + ")", work_fraction, boundary);
  }

 private:
  ProgressBar& bar_;
  std::string prefix_;
  std::string unit_;
  std::string stage_;
};

}  // namespace hybridtb::cli
