// hybridtb parity / replay: run a backend on batch files and compare its results with another
// backend's (parity) or with each file's recorded /expected (replay), through the one comparison
// component (hybridtb/compare.h). Prints the aligned table, then "N passed, M failed"; --report
// writes the JSON report. Tested by tests/compare (`ctest -L compare`).
//
// Exit status: 0 every comparable file passed; 1 some file mismatched; 2 bad input: a file that
// cannot be read or validated, a replay file without /expected, an unknown backend, a backend that
// rejected the batch (Error), or nothing comparable at all (every file NotSupported). Bad input
// takes precedence over a mismatch (the verdict is incomplete), and then no --report is written: a
// report must never pass for a complete verdict. A file the candidate backend does
// not support (NotSupported) is reported "not supported" and counted on its own line; it does not
// fail the run when other files were compared.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "commands.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
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
};

StepOutputs run_backend(const std::string& name, const BatchFile& file) {
  auto backend = create_backend(name, BackendSettings{file.config, file.builder});
  return run_step(*backend, file);
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
  std::vector<ComparisonReport> reports;
  int bad = 0;
  int not_supported = 0;
  ProgressBar progress(static_cast<int64_t>(opt.files.size()), !opt.quiet);
  for (size_t i = 0; i < opt.files.size(); ++i) {
    const std::string& path = opt.files[i];
    progress.update(static_cast<int64_t>(i), path);
    try {
      const BatchFile file = read_batch_file(path);
      if (replay) {
        HYBRIDTB_CHECK(file.expected.has_value(), path, " has no /expected to replay against (record it with `hybridtb record`)");
      }
      ComparisonReport report;
      try {
        const StepOutputs candidate = run_backend(opt.backend, file);
        const StepOutputs expected = replay ? *file.expected : run_backend(opt.against, file);
        CompareOptions options;
        options.check_expected_padding = !replay;
        report = compare_step(file, candidate, expected, options);
      } catch (const NotSupported& e) {
        report.candidate_backend = opt.backend;
        report.not_supported = e.what();
        ++not_supported;
      }
      report.file = path;
      reports.push_back(std::move(report));
    } catch (const Error& e) {
      progress.clear();
      std::cerr << "hybridtb " << (replay ? "replay" : "parity") << ": " << path << ": error: " << e.what() << "\n";
      ++bad;
    }
  }
  progress.clear();

  std::vector<ComparisonReport> compared;
  for (const ComparisonReport& r : reports) {
    if (r.not_supported.empty()) compared.push_back(r);
  }
  if (!reports.empty()) std::cout << format_report_table(reports, !opt.no_rationale) << "\n";
  std::cout << format_summary_line(compared) << "\n";
  if (not_supported > 0) std::cout << not_supported << " not supported by backend '" << opt.backend << "'\n";
  if (bad > 0) std::cout << bad << " bad input\n";

  if (!opt.report_path.empty() && bad > 0) {
    std::cerr << "hybridtb " << (replay ? "replay" : "parity") << ": no report written to " << opt.report_path
              << " (bad input)\n";
  } else if (!opt.report_path.empty()) {
    write_report(opt.report_path, report_to_json(reports, current_environment(replay ? "replay" : "parity")).dump(2));
  }

  const bool mismatch = std::any_of(compared.begin(), compared.end(), [](const ComparisonReport& r) { return !r.passed(); });
  if (bad > 0) return 2;
  if (mismatch) return 1;
  if (compared.empty()) return 2;
  return 0;
}

void add_common_options(CLI::App* cmd, Options& opt) {
  cmd->add_option("files", opt.files, "hybrid-batch HDF5 files")->required();
  cmd->add_option("--backend", opt.backend, "Backend under test (see `hybridtb backends`)")->required();
  cmd->add_option("--report", opt.report_path, "Also write a JSON report (metrics, tolerances, environment)");
  cmd->add_flag("--quiet", opt.quiet, "No progress bar");
  cmd->add_flag("--no-rationale", opt.no_rationale, "Omit the tolerance derivations after the table");
}

}  // namespace

Command add_parity_command(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "parity", "Run two backends on batch files and compare (exit 0 pass, 1 mismatch, 2 bad input)");
  add_common_options(cmd, *opt);
  cmd->add_option("--against", opt->against, "Backend giving the expected results")->capture_default_str();
  return {cmd, [opt] { return compare_files(*opt, false); }};
}

Command add_replay_command(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Run a backend on batch files and compare with their /expected (exit 0 pass, 1 mismatch, 2 bad input)");
  add_common_options(cmd, *opt);
  return {cmd, [opt] { return compare_files(*opt, true); }};
}

}  // namespace hybridtb::cli
