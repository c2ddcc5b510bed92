// The rank files of one tensor-parallel step, run together (tensor_parallel_run.h).
#include "hybridtb/tensor_parallel_run.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "hybridtb/tensor.h"

namespace hybridtb {

namespace {

// Checks that `ranks` is one whole group of one step (rank order).
void check_group(const std::vector<BatchFile>& ranks) {
  const auto tp = static_cast<int64_t>(ranks.size());
  HYBRIDTB_CHECK(tp >= 1, "tensor parallel: no rank files to run");
  for (int64_t r = 0; r < tp; ++r) {
    const AttentionConfig& c = ranks[static_cast<size_t>(r)].config;
    HYBRIDTB_CHECK(c.tp_size == tp && c.tp_rank == r, "tensor parallel: rank file ", r, " of ", tp, " has /config tp_rank ",
                   c.tp_rank, " of tp_size ", c.tp_size, " (pass the whole group, in rank order)");
    HYBRIDTB_CHECK(ranks[static_cast<size_t>(r)].batch == ranks.front().batch, "tensor parallel: rank ", r,
                   " has another batch than rank 0 (the ranks of one step share its batch description)");
  }
}

// What the ranks of one run share about failures: every rank's group handle (as its thread gets
// it), whether the run was aborted, and the failure that aborted it. The first rank to fail (in
// time) aborts the host group and every handle; a rank whose handle comes later aborts it itself
// and does not start. Errors after the abort (TensorParallelAborted, or an NCCL or CUDA error of a
// collective the abort interrupted) are its consequences and are not kept.
class RankFailures {
 public:
  RankFailures(HostThreadGroup& host_group, int64_t tp) : host_group_(host_group), handles_(static_cast<size_t>(tp)) {}

  // Records rank r's handle; TensorParallelAborted (after aborting it) when the run was aborted.
  void add_handle(int64_t r, const std::shared_ptr<TensorParallelGroup>& handle) {
    bool late = false;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      handles_[static_cast<size_t>(r)] = handle;
      late = aborted_.load(std::memory_order_relaxed);
    }
    if (late) {
      if (handle) handle->abort();
      throw_aborted();
    }
  }

  // TensorParallelAborted when the run was aborted (a rank about to start need not).
  void check() const {
    if (aborted_.load(std::memory_order_acquire)) throw_aborted();
  }

  // Rank r failed with `error`: the first failure aborts the run; later ones are consequences.
  void fail(int64_t r, std::exception_ptr error) {
    std::vector<std::shared_ptr<TensorParallelGroup>> to_abort;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_.load(std::memory_order_relaxed)) return;
      aborted_.store(true, std::memory_order_release);
      first_rank_ = r;
      first_ = std::move(error);
      for (const auto& handle : handles_) {
        if (handle) to_abort.push_back(handle);
      }
    }
    // Outside the lock: an abort may take a while (NCCL waits for its kernels to quit).
    host_group_.abort();
    for (const auto& handle : to_abort) {
      try {
        handle->abort();
      } catch (...) {  // NOLINT(bugprone-empty-catch): the first failure is the one to report
      }
    }
  }

  // Rethrows the first failure with its rank named (after the threads were joined).
  void rethrow_first(int64_t tp) const {
    if (!first_) return;
    try {
      std::rethrow_exception(first_);
    } catch (const NotSupported& e) {
      throw NotSupported(detail::concat("rank ", first_rank_, " of ", tp, ": ", e.what()));
    } catch (const std::exception& e) {
      throw Error(detail::concat("rank ", first_rank_, " of ", tp, ": ", e.what()));
    } catch (...) {
      throw Error(detail::concat("rank ", first_rank_, " of ", tp, ": unknown exception"));
    }
  }

 private:
  [[noreturn]] static void throw_aborted() {
    throw TensorParallelAborted("tensor parallel: another rank of the group failed");
  }

  HostThreadGroup& host_group_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<TensorParallelGroup>> handles_;
  std::atomic<bool> aborted_{false};
  int64_t first_rank_ = -1;
  std::exception_ptr first_;
};

// Runs `body(rank, backend, host_group)` on one thread per rank, each with its group handle and then
// its backend created there (after options.on_rank_thread) with the group. A rank that throws aborts
// the host group and every rank's group handle (RankFailures); the first failure in time is
// rethrown with the rank named.
template <typename Body>
void on_rank_threads(const std::vector<BatchFile>& ranks, const RankRunOptions& options, Body body) {
  const auto tp = static_cast<int64_t>(ranks.size());
  HostThreadGroup host_group(tp);
  RankFailures failures(host_group, tp);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      // Outlives the try: a failed rank aborts the others before its backend is destroyed (a GPU
      // backend's destructor waits for its stream, which may hold a collective of the others).
      std::unique_ptr<Backend> backend;
      try {
        // The handle first, so that every rank's group is aborted whichever rank fails, and when.
        std::shared_ptr<TensorParallelGroup> group =
            options.group_of_rank ? options.group_of_rank(r) : host_group.rank(r);
        failures.add_handle(r, group);
        if (options.on_rank_thread) options.on_rank_thread(r);
        const BatchFile& file = ranks[static_cast<size_t>(r)];
        BackendSettings settings;
        settings.attention = file.config;
        settings.builder = file.builder;
        settings.tp_group = std::move(group);
        backend = create_backend(options.backend, settings);
        failures.check();
        body(r, *backend, host_group);
      } catch (...) {
        failures.fail(r, std::current_exception());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  failures.rethrow_first(tp);
}

}  // namespace

std::vector<StepOutputs> run_rank_steps(const std::vector<BatchFile>& ranks, const RankRunOptions& options) {
  check_group(ranks);
  std::vector<std::optional<StepOutputs>> outputs(ranks.size());
  on_rank_threads(ranks, options, [&](int64_t r, Backend& backend, HostThreadGroup& /*group*/) {
    outputs[static_cast<size_t>(r)] = run_step(backend, ranks[static_cast<size_t>(r)]);
  });
  std::vector<StepOutputs> result;
  for (std::optional<StepOutputs>& out : outputs) result.push_back(std::move(*out));
  return result;
}

std::vector<double> time_rank_steps(const std::vector<BatchFile>& ranks, int64_t repetitions,
                                    const RankRunOptions& options) {
  check_group(ranks);
  HYBRIDTB_CHECK(repetitions >= 1, "tensor parallel: repetitions must be at least 1, got ", repetitions);
  // The ranks meet at a barrier (a one-element all-reduce of the host group) before and after each
  // run; rank 0 reads the clock at both.
  std::vector<double> seconds;
  on_rank_threads(ranks, options, [&](int64_t r, Backend& backend, HostThreadGroup& group) {
    const BatchFile& file = ranks[static_cast<size_t>(r)];
    const LayerBuffers buffers(backend, file);
    const HybridMetadata metadata = backend.build_metadata(file.batch);
    const std::shared_ptr<TensorParallelGroup> meeting = group.rank(r);
    const auto barrier = [&] {
      double token = 0;
      meeting->all_reduce_sum(TensorView(&token, DType::kFloat64, {1}));
    };
    for (int64_t i = 0; i <= repetitions; ++i) {  // run 0 is the warm-up
      barrier();
      const auto start = std::chrono::steady_clock::now();
      buffers.run(backend, metadata, file.batch);
      backend.synchronize();
      barrier();
      if (r == 0 && i > 0) {
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
  });
  return seconds;
}

}  // namespace hybridtb
