// hybridtb parity / replay / tp: run a backend on batch files and compare its results with another
// backend's (parity) or with each file's recorded /expected (replay), through the one comparison
// component (hybridtb/compare.h). tp cuts each (unsharded) file into --tp N rank files
// (hybridtb/spec/tensor_parallel.h), runs them together — one thread and one backend per rank, the
// SSM branch's all-reduces between them (hybridtb/tensor_parallel_run.h) —, joins the ranks' results
// and compares them with the unsharded file run on --against: sharded == unsharded. Prints the aligned table, then "N passed, M failed"; --report
// writes the JSON report. Tested by tests/compare (`ctest -L compare`).
//
// Exit status: 0 every file was compared and passed; 1 some file mismatched, or some files were
// compared and others could not be (bad input: unreadable or invalid, a replay file without
// /expected, a backend that rejected the batch); 2 nothing could be judged (every file bad or not
// supported), an unknown backend, or a usage error; 3 a backend's device is not on this machine. --report is always written, with each bad file
// as an entry holding its error, so a FAIL is never lost behind a bad file. A file the candidate
// backend does not support (NotSupported) is reported "not supported" and counted on its own line;
// it does not fail the run when other files were compared.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <algorithm>
#include <memory>
#include <optional>

#include "commands.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/tensor_parallel.h"
#include "hybridtb/step.h"
#include "hybridtb/tensor_parallel_run.h"
#include "checks.h"
#include "progress.h"

namespace hybridtb::cli {

namespace {

struct Options {
  std::vector<std::string> files;
  std::string backend;
  std::string against = "reference";
  std::string report_path;
  bool quiet = false;
  bool no_rationale = false;
  int64_t tp = 0;  // tp: the ranks each file is cut into
  std::string placement = "auto";  // tp: auto | host | devices
  int64_t time_runs = 0;           // tp: > 0 times the sharded and the unsharded step this many runs
  bool rank_files = false;         // tp: read the ranks from gen --tp's files beside each file
  // parity / replay: BackendSettings::ssm_prefill_operands of the backends run ("float32" | "model").
  std::string ssm_prefill_operands = "float32";
};

StepOutputs run_backend(const std::string& name, const BatchFile& file,
                        SsmPrefillOperands operands = SsmPrefillOperands::kFloat32) {
  BackendSettings settings{file.config, file.builder};
  settings.ssm_prefill_operands = operands;
  auto backend = create_backend(name, settings);
  return run_step(*backend, file);
}

// Where `tp` ranks of `backend` run (--placement): the backend's own placement (devices: one rank
// per GPU over NCCL for cuda), or one place meeting through host memory (host). auto takes the
// backend's where it has one that fits this machine, else host. Prints where the ranks run.
RankRunOptions rank_placement(const std::string& backend, int64_t tp, const std::string& placement) {
  RankRunOptions options;
  options.backend = backend;
  std::string where = "one place, meeting through host memory";
  if (placement != "host") {
    register_builtin_backends();
    try {
      const BackendRegistry::RankPlacement placed = BackendRegistry::instance().place_ranks(backend, tp);
      options.group_of_rank = [groups = placed.groups](int64_t r) { return groups[static_cast<size_t>(r)]; };
      options.on_rank_thread = placed.on_rank_thread;
      where = placed.description;
    } catch (const NotSupported& e) {
      if (placement == "devices") throw;
      where += detail::concat(" (", e.what(), ")");
    }
  }
  std::cout << "hybridtb tp: " << tp << " ranks on " << backend << ": " << where << "\n";
  return options;
}

// The `tp` ranks of the step in `file` (at `path`): cut here, or read from the rank files beside it
// (--rank-files: gen --tp's, or any written by the same rules).
std::vector<BatchFile> rank_files(const std::string& path, const BatchFile& file, int64_t tp, bool from_disk) {
  std::vector<BatchFile> ranks;
  for (int64_t r = 0; r < tp; ++r) {
    if (!from_disk) {
      ranks.push_back(spec::shard_batch_file(file, spec::tp_shard(file.config, tp, r)));
      continue;
    }
    const std::string rank_path = spec::tp_rank_file_path(path, tp, r);
    HYBRIDTB_CHECK(std::filesystem::exists(rank_path), "--rank-files: no rank file ", rank_path, " (rank ", r, " of ", tp,
                   "; `hybridtb gen --tp ", tp, "` writes them beside the step)");
    ranks.push_back(read_batch_file(rank_path));
  }
  return ranks;
}

// The step's ranks run together as `options` place them, their results joined.
StepOutputs run_sharded(const BatchFile& file, const std::vector<BatchFile>& ranks, const RankRunOptions& options) {
  const auto tp = static_cast<int64_t>(ranks.size());
  StepOutputs joined = spec::join_step_outputs(file.config, run_rank_steps(ranks, options));
  joined.backend = detail::concat(options.backend, " tp ", tp);
  return joined;
}

// Median, min and max milliseconds of step times in seconds.
nlohmann::ordered_json milliseconds(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return {{"median", 1e3 * seconds[seconds.size() / 2]}, {"min", 1e3 * seconds.front()}, {"max", 1e3 * seconds.back()}};
}

// --time: the unsharded step on the candidate backend (one rank, default device) and the step
// sharded over `placed`, each timed `runs` times after a warm-up (time_rank_steps); printed, and
// returned for the report.
nlohmann::ordered_json time_step(const std::string& path, const BatchFile& file, const std::vector<BatchFile>& ranks,
                                 const RankRunOptions& placed, int64_t runs) {
  const auto tp = static_cast<int64_t>(ranks.size());
  RankRunOptions alone;
  alone.backend = placed.backend;
  const nlohmann::ordered_json whole = milliseconds(time_rank_steps({file}, runs, alone));
  const nlohmann::ordered_json sharded = milliseconds(time_rank_steps(ranks, runs, placed));
  std::cout << "hybridtb tp: " << path << ": step time over " << runs << " runs (median ms): tp 1 "
            << whole["median"].get<double>() << ", tp " << tp << " " << sharded["median"].get<double>() << " ("
            << whole["median"].get<double>() / sharded["median"].get<double>() << "x)\n";
  return {{"file", path}, {"backend", placed.backend}, {"tp", tp}, {"runs", runs}, {"tp1_ms", whole}, {"sharded_ms", sharded}};
}

// Written to a temporary file and renamed, so a failed write never leaves a partial report.
void write_report(const std::string& path, const std::string& json) {
  const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(temporary);
    HYBRIDTB_CHECK(out.good(), "--report ", path, ": cannot open ", temporary, " for writing");
    out << json << "\n";
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw Error(detail::concat("--report ", path, ": write failed"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw Error(detail::concat("--report ", path, ": cannot rename ", temporary, ": ", ec.message()));
  }
}

int compare_files(const Options& opt, bool replay) {
  const char* command = replay ? "replay" : opt.tp > 0 ? "tp" : "parity";
  const std::vector<std::string> backends =
      replay ? std::vector<std::string>{opt.backend} : std::vector<std::string>{opt.backend, opt.against};
  if (const int status = check_backends(command, backends); status != 0) return status;
  std::optional<RankRunOptions> placed;
  if (opt.tp > 0) {
    try {
      placed = rank_placement(opt.backend, opt.tp, opt.placement);
    } catch (const Error& e) {
      std::cerr << "hybridtb tp: --placement " << opt.placement << ": " << e.what() << "\n";
      return 2;
    }
  }
  std::vector<ComparisonReport> reports;
  nlohmann::ordered_json timings = nlohmann::ordered_json::array();
  ProgressBar progress(static_cast<int64_t>(opt.files.size()), !opt.quiet);
  for (size_t i = 0; i < opt.files.size(); ++i) {
    const std::string& path = opt.files[i];
    progress.update(static_cast<int64_t>(i), path);
    ComparisonReport report;
    try {
      const BatchFile file = read_batch_file(path);
      print_file_warnings(command, path, file);
      if (replay) {
        HYBRIDTB_CHECK(file.expected.has_value(), path, " has no /expected to replay against (record it with `hybridtb record`)");
      }
      try {
        const std::vector<BatchFile> ranks =
            placed ? rank_files(path, file, opt.tp, opt.rank_files) : std::vector<BatchFile>{};
        const SsmPrefillOperands operands = parse_ssm_prefill_operands(opt.ssm_prefill_operands);
        const StepOutputs candidate =
            placed ? run_sharded(file, ranks, *placed) : run_backend(opt.backend, file, operands);
        const StepOutputs expected = replay ? *file.expected : run_backend(opt.against, file, operands);
        CompareOptions options;
        // 16-bit product operands (a 16-bit model with --ssm-prefill-operands model): the table's
        // 16-bit-operand SSM row.
        const DType model = file.config.dtype;
        if (operands == SsmPrefillOperands::kModel && (model == DType::kFloat16 || model == DType::kBFloat16)) {
          options.ssm_operand_dtype = model;
        }
        options.check_expected_padding = !replay;
        // parity: both backends use the shared builders; tp: the ranks' metadata is theirs (their kv heads).
        options.compare_metadata = replay;
        report = compare_step(file, candidate, expected, options);
        if (placed && opt.time_runs > 0) timings.push_back(time_step(path, file, ranks, *placed, opt.time_runs));
      } catch (const NotSupported& e) {
        report.candidate_backend = opt.backend;
        report.not_supported = e.what();
      }
    } catch (const Error& e) {
      progress.clear();
      std::cerr << "hybridtb " << command << ": " << path << ": error: " << e.what() << "\n";
      report = ComparisonReport{};
      report.candidate_backend = opt.backend;
      report.error = e.what();
    }
    report.file = path;
    reports.push_back(std::move(report));
  }
  progress.clear();

  std::vector<ComparisonReport> compared;
  int64_t not_supported = 0, bad = 0;
  for (const ComparisonReport& r : reports) {
    if (r.compared()) compared.push_back(r);
    not_supported += r.not_supported.empty() ? 0 : 1;
    bad += r.error.empty() ? 0 : 1;
  }
  if (!reports.empty()) std::cout << format_report_table(reports, !opt.no_rationale) << "\n";
  std::cout << format_summary_line(compared) << "\n";
  if (not_supported > 0) std::cout << not_supported << " not supported by backend '" << opt.backend << "'\n";
  if (bad > 0) std::cout << bad << " bad input (not compared; listed in the report)\n";

  // The report is written whatever the verdict: a FAIL next to a bad file is what one needs most.
  if (!opt.report_path.empty()) {
    nlohmann::ordered_json json = report_to_json(reports, current_environment(command));
    if (!timings.empty()) json["tensor_parallel_timing"] = timings;
    write_report(opt.report_path, json.dump(2));
  }

  const bool mismatch = std::any_of(compared.begin(), compared.end(), [](const ComparisonReport& r) { return !r.passed(); });
  if (mismatch) return 1;
  if (compared.empty()) return 2;  // nothing could be judged
  if (bad > 0) return 1;           // a verdict on some files only
  return 0;
}

void add_common_options(CLI::App* cmd, Options& opt) {
  cmd->add_option("files", opt.files, "hybrid-batch HDF5 files")->required();
  cmd->add_option("--backend", opt.backend, "Backend under test (see `hybridtb backends`)")->required();
  cmd->add_option("--report", opt.report_path, "Also write a JSON report (metrics, tolerances, environment)");
  cmd->add_flag("--quiet", opt.quiet, "No progress bar");
  cmd->add_flag("--no-rationale", opt.no_rationale, "Omit the tolerance derivations after the table");
}

// parity and replay: BackendSettings::ssm_prefill_operands of the backends they run.
void add_ssm_prefill_operands_option(CLI::App* cmd, Options& opt) {
  cmd->add_option("--ssm-prefill-operands", opt.ssm_prefill_operands,
                  "Operands of the SSM chunked-prefill products (cuda: Mamba-2, GDN): float32 (float32-accurate) "
                  "or model (rounded to a 16-bit model dtype; compared with the tolerance table's 16-bit-operand "
                  "row)")
      ->check(CLI::IsMember({"float32", "model"}))
      ->capture_default_str();
}

}  // namespace

Command add_parity_command(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "parity", "Run two backends on batch files and compare (exit 0 pass, 1 mismatch, 2 bad input)");
  add_common_options(cmd, *opt);
  add_ssm_prefill_operands_option(cmd, *opt);
  cmd->add_option("--against", opt->against, "Backend giving the expected results")->capture_default_str();
  return {cmd, [opt] { return compare_files(*opt, false); }};
}

Command add_replay_command(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Run a backend on batch files and compare with their /expected (exit 0 pass, 1 mismatch, 2 bad input)");
  add_common_options(cmd, *opt);
  add_ssm_prefill_operands_option(cmd, *opt);
  return {cmd, [opt] { return compare_files(*opt, true); }};
}

Command add_tp_command(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tp", "Cut batch files into tensor-parallel ranks, run them together, join and compare with the unsharded "
            "step (exit 0 pass, 1 mismatch, 2 bad input)");
  add_common_options(cmd, *opt);
  cmd->add_option("--tp", opt->tp, "Tensor-parallel size: the ranks each file is cut into (vLLM's rules)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--against", opt->against, "Backend running the unsharded step")->capture_default_str();
  cmd->add_option("--placement", opt->placement,
                  "Where the ranks run: devices (the backend's own placement: cuda puts one rank per GPU, over "
                  "NCCL), host (one place, meeting through host memory), auto (devices where the backend has them "
                  "for --tp ranks, else host)")
      ->check(CLI::IsMember({"auto", "host", "devices"}))
      ->capture_default_str();
  cmd->add_option("--time", opt->time_runs,
                  "Also time the step N runs (after a warm-up) sharded and unsharded on --backend; printed, and in "
                  "--report as tensor_parallel_timing (median/min/max ms)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--rank-files", opt->rank_files,
                "Read the ranks from the rank files beside each FILE (FILE.tpN-rankR.h5, as gen --tp writes them) "
                "instead of cutting FILE here; FILE is the unsharded step they are compared with");
  cmd->footer("\nEach rank runs on its own thread with its own backend; a mamba1 branch all-reduces x_proj's "
              "product and its contribution between them (datasets/SCHEMA.md 5.2.2). A file that does not split "
              "over --tp ranks is bad input, naming the constraint.");
  return {cmd, [opt] { return compare_files(*opt, false); }};
}

}  // namespace hybridtb::cli
