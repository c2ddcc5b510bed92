// Running the rank files of one tensor-parallel step together (hybridtb/spec/tensor_parallel.h cuts
// them; /config tp_size N, tp_rank r): one thread per rank in this process, each on its own backend
// of the same kind, created with its rank's handle of the group its SSM branch all-reduces through.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/tensor_parallel_group.h"

namespace hybridtb {

// How each rank's thread gets its backend and group. By default every rank creates `backend` from
// create_backend and the ranks share one HostThreadGroup (host memory: the reference).
struct RankRunOptions {
  std::string backend = "reference";
  // Rank r's group handle, asked for first on rank r's thread; empty: a HostThreadGroup of the ranks.
  std::function<std::shared_ptr<TensorParallelGroup>(int64_t rank)> group_of_rank;
  // Called on rank r's thread before its backend is created (a GPU launcher selects r's device).
  std::function<void(int64_t rank)> on_rank_thread;
};

// The outputs of every rank (rank order) of one step. `ranks` must be a whole group: ranks[r] has
// /config tp_rank r and tp_size ranks.size(), and every rank the same batch. Error naming the rank
// otherwise. A rank that fails aborts every rank's group (TensorParallelGroup::abort: the others
// leave their all-reduces, and a rank not started yet does not start); the first failure in time is
// rethrown here, with the rank named (the other ranks' errors after it are its consequences).
std::vector<StepOutputs> run_rank_steps(const std::vector<BatchFile>& ranks, const RankRunOptions& options = {});

// Wall-clock seconds of `repetitions` runs of the step (after one untimed warm-up), one entry per
// run: from the moment every rank is ready (inputs in its backend's memory, metadata built) until
// the last rank's backend has finished (Backend::synchronize). Each rank runs its calls of the step
// (write_kv_cache + hybrid_forward) on the same buffers every time, so the caches and pools advance
// from run to run; the times are what they are for. Same rules and errors as run_rank_steps.
std::vector<double> time_rank_steps(const std::vector<BatchFile>& ranks, int64_t repetitions,
                                    const RankRunOptions& options = {});

}  // namespace hybridtb
