// The rank files of one tensor-parallel step, run together (tensor_parallel_run.h).
#include "hybridtb/tensor_parallel_run.h"

#include <chrono>
#include <exception>
#include <optional>
#include <thread>
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

// Runs `body(rank, backend, host_group)` on one thread per rank, each with its backend created there
// (after options.on_rank_thread) with its group. A rank that throws aborts the host group (the others
// leave their all-reduces and `barrier` waits); the first rank that failed on its own account is
// rethrown with the rank named.
template <typename Body>
void on_rank_threads(const std::vector<BatchFile>& ranks, const RankRunOptions& options, Body body) {
  const auto tp = static_cast<int64_t>(ranks.size());
  HostThreadGroup host_group(tp);
  std::vector<std::exception_ptr> failures(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (options.on_rank_thread) options.on_rank_thread(r);
        const BatchFile& file = ranks[static_cast<size_t>(r)];
        BackendSettings settings;
        settings.attention = file.config;
        settings.builder = file.builder;
        settings.tp_group = options.group_of_rank ? options.group_of_rank(r) : host_group.rank(r);
        const std::unique_ptr<Backend> backend = create_backend(options.backend, settings);
        body(r, *backend, host_group);
      } catch (...) {
        failures[static_cast<size_t>(r)] = std::current_exception();
        host_group.abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  bool aborted_only = false;
  for (int64_t r = 0; r < tp; ++r) {
    if (!failures[static_cast<size_t>(r)]) continue;
    try {
      std::rethrow_exception(failures[static_cast<size_t>(r)]);
    } catch (const TensorParallelAborted&) {
      aborted_only = true;  // stopped because of another rank: report that one
    } catch (const NotSupported& e) {
      throw NotSupported(detail::concat("rank ", r, " of ", tp, ": ", e.what()));
    } catch (const std::exception& e) {
      throw Error(detail::concat("rank ", r, " of ", tp, ": ", e.what()));
    }
  }
  HYBRIDTB_CHECK(!aborted_only, "tensor parallel: a rank stopped because another rank failed");
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
