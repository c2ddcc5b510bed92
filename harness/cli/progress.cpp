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
constexpr double kTickSeconds = 1.0;  // the ticker's redraw of an unchanged state
}  // namespace

ProgressBar::ProgressBar(int64_t total, bool enabled, std::FILE* stream, bool forced)
    : total_(total),
      active_(enabled && stream != nullptr && (forced || isatty(fileno(stream)) != 0)),
      forced_(forced),
      terminal_(stream != nullptr && isatty(fileno(stream)) != 0),
      stream_(stream),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_),
      stage_start_(start_) {
  if (active_ && terminal_) ticker_ = std::thread([this] { tick(); });
}

ProgressBar::~ProgressBar() {
  if (ticker_.joinable()) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    ticker_.join();
  }
  clear();
}

void ProgressBar::set_total(int64_t total) {
  const std::lock_guard<std::mutex> lock(mutex_);
  total_ = total;
}

void ProgressBar::start_stage() {
  const std::lock_guard<std::mutex> lock(mutex_);
  stage_start_ = std::chrono::steady_clock::now();
}

void ProgressBar::tick() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stopping_; })) {
    const auto now = std::chrono::steady_clock::now();
    if (!has_state_ || std::chrono::duration<double>(now - start_).count() < kShowAfterSeconds) continue;
    if (drawn_ && std::chrono::duration<double>(now - last_draw_).count() < kTickSeconds) continue;
    draw_locked(now);
  }
}

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
  const std::lock_guard<std::mutex> lock(mutex_);
  has_state_ = true;
  last_done_ = done;
  last_label_ = label;
  last_work_fraction_ = work_fraction;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (!forced_ && elapsed < kShowAfterSeconds) return;
  // Throttled, except for stage boundaries (and, on a forced bar, the end of a count).
  const bool last = stage_end || (forced_ && done == total_);
  if (drawn_ && !last && std::chrono::duration<double>(now - last_draw_).count() < kRedrawIntervalSeconds) return;
  draw_locked(now);
}

void ProgressBar::draw_locked(std::chrono::steady_clock::time_point now) {
  last_draw_ = now;
  drawn_ = true;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::string line = format_line(last_done_, total_, elapsed, last_label_, 24, last_work_fraction_,
                                       std::chrono::duration<double>(now - stage_start_).count());
  if (terminal_) {
    std::fprintf(stream_, "\r\033[K%s", line.c_str());
  } else {
    std::fprintf(stream_, "%s\n", line.c_str());  // a log file or pipe: one line per drawing
  }
  std::fflush(stream_);
}

void ProgressBar::clear() {
  const std::lock_guard<std::mutex> lock(mutex_);
  has_state_ = false;
  if (!active_ || !drawn_ || !terminal_) return;
  std::fprintf(stream_, "\r\033[K");
  std::fflush(stream_);
  drawn_ = false;
}

}  // namespace hybridtb::cli
