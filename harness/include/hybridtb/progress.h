// Progress reports from inside a long backend call. The reference computes a long prefill in tens
// of seconds; a caller that wants to show how far it got (the CLI's progress bar) passes a sink
// through run_step's StepOptions, which puts it into StepTensors::progress for the backend calls.
// Backends may ignore it (the CUDA backend does: its calls are asynchronous and short).
#pragma once

#include <cstdint>
#include <string>

namespace hybridtb {

class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // `done` of `total` units of `stage` finished ("attention": query tokens). `work_fraction` in
  // [0, 1] is the estimated fraction of the stage's arithmetic done, for an ETA (a query token of
  // a long causal prefill costs more than one near its start). Within a stage, calls come one at a
  // time (never concurrently), with non-decreasing `done`, and the last call has done == total.
  virtual void report(const std::string& stage, int64_t done, int64_t total, double work_fraction) = 0;
};

}  // namespace hybridtb
