// The rank files of one tensor-parallel step, run together (tensor_parallel_run.h).
#include "hybridtb/tensor_parallel_run.h"

#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/step.h"

namespace hybridtb {

std::vector<StepOutputs> run_rank_steps(const std::vector<BatchFile>& ranks, const RankRunOptions& options) {
  const auto tp = static_cast<int64_t>(ranks.size());
  HYBRIDTB_CHECK(tp >= 1, "tensor parallel: no rank files to run");
  for (int64_t r = 0; r < tp; ++r) {
    const AttentionConfig& c = ranks[static_cast<size_t>(r)].config;
    HYBRIDTB_CHECK(c.tp_size == tp && c.tp_rank == r, "tensor parallel: rank file ", r, " of ", tp, " has /config tp_rank ",
                   c.tp_rank, " of tp_size ", c.tp_size, " (pass the whole group, in rank order)");
    HYBRIDTB_CHECK(ranks[static_cast<size_t>(r)].batch == ranks.front().batch, "tensor parallel: rank ", r,
                   " has another batch than rank 0 (the ranks of one step share its batch description)");
  }
  HostThreadGroup host_group(tp);
  std::vector<std::optional<StepOutputs>> outputs(static_cast<size_t>(tp));
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
        outputs[static_cast<size_t>(r)] = run_step(*backend, file);
      } catch (...) {
        failures[static_cast<size_t>(r)] = std::current_exception();
        host_group.abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The first rank that failed on its own account: the others may only report the abort it caused.
  for (int64_t r = 0; r < tp; ++r) {
    if (!failures[static_cast<size_t>(r)]) continue;
    try {
      std::rethrow_exception(failures[static_cast<size_t>(r)]);
    } catch (const NotSupported& e) {
      throw NotSupported(detail::concat("rank ", r, " of ", tp, ": ", e.what()));
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("another rank of the group failed") != std::string::npos) continue;
      throw Error(detail::concat("rank ", r, " of ", tp, ": ", e.what()));
    }
  }
  std::vector<StepOutputs> result;
  for (int64_t r = 0; r < tp; ++r) {
    HYBRIDTB_CHECK(outputs[static_cast<size_t>(r)].has_value(), "tensor parallel: rank ", r,
                   " stopped because another rank failed");
    result.push_back(std::move(*outputs[static_cast<size_t>(r)]));
  }
  return result;
}

}  // namespace hybridtb
