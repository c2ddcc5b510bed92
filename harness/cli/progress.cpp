// The stderr progress bar (progress.h).
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

namespace hybridtb::cli {

namespace {
constexpr double kShowAfterSeconds = 1.0;
constexpr double kRedrawIntervalSeconds = 0.1;
}  // namespace

ProgressBar::ProgressBar(int64_t total, bool enabled, std::FILE* stream, bool forced)
    : total_(total),
      active_(enabled && stream != nullptr && (forced || isatty(fileno(stream)) != 0)),
      forced_(forced),
      terminal_(stream != nullptr && isatty(fileno(stream)) != 0),
      stream_(stream),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_),
      stage_start_(start_) {}

ProgressBar::~ProgressBar() { clear(); }

std::string ProgressBar::format_line(int64_t done, int64_t total, double elapsed_s, const std::string& label,
                                     int width, double work_fraction, double eta_elapsed_s) {
  const double fraction = total > 0 ? std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(std::lround(fraction * width));
  std::ostringstream line;
  line << "[" << std::string(static_cast<size_t>(filled), '#') << std::string(static_cast<size_t>(width - filled), '.')
       << "] " << done << "/" << total << "  " << std::fixed << std::setprecision(1) << elapsed_s << "s";
  const double work = work_fraction >= 0 ? work_fraction : fraction;
  if (done > 0 && done < total && work > 0 && work < 1) {
    line << "  ETA " << (eta_elapsed_s >= 0 ? eta_elapsed_s : elapsed_s) / work * (1 - work) << "s";
  }
  if (!label.empty()) line << "  " << label;
  return line.str();
}

void ProgressBar::update(int64_t done, const std::string& label, double work_fraction, bool stage_end) {
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (!forced_ && elapsed < kShowAfterSeconds) return;
  // Throttled, except for stage boundaries (and, on a forced bar, the end of a count).
  const bool last = stage_end || (forced_ && done == total_);
  if (drawn_ && !last && std::chrono::duration<double>(now - last_draw_).count() < kRedrawIntervalSeconds) return;
  last_draw_ = now;
  drawn_ = true;
  const std::string line = format_line(done, total_, elapsed, label, 24, work_fraction,
                                       std::chrono::duration<double>(now - stage_start_).count());
  if (terminal_) {
    std::fprintf(stream_, "\r\033[K%s", line.c_str());
  } else {
    std::fprintf(stream_, "%s\n", line.c_str());  // a log file or pipe: one line per drawing
  }
  std::fflush(stream_);
}

void ProgressBar::clear() {
  if (!active_ || !drawn_ || !terminal_) return;
  std::fprintf(stream_, "\r\033[K");
  std::fflush(stream_);
  drawn_ = false;
}

}  // namespace hybridtb::cli
