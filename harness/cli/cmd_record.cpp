// hybridtb record: run a trusted backend (the reference) on batch files and store its results as
// /expected, atomically (temporary file + rename). Tested by tests/compare (`ctest -L compare`).
// Exit status: 0 every file recorded, 2 bad input (unreadable or invalid file, unknown backend,
// the backend rejected the batch) — the other files are still recorded; 3 the backend's device is
// not on this machine. A file whose step would not fit in the memory available is refused before
// it is read (memory.h), like a bad file. Progress (the file, and within it the query tokens
// computed, with an ETA) goes to stderr when it is a terminal, or always with --progress; never
// with --quiet.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "commands.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "checks.h"
#include "memory.h"
#include "progress.h"

namespace hybridtb::cli {

namespace {

// Progress inside the multi-file bar: the bar counts files, the label carries how far the current
// file got ("step.h5  attention 1536/4672 query tokens", "reading step.h5 310/1100 MiB").
class FileStepProgress final : public ProgressSink {
 public:
  FileStepProgress(ProgressBar& bar, int64_t file_index, std::string prefix, std::string unit)
      : bar_(bar), file_index_(file_index), prefix_(std::move(prefix)), unit_(std::move(unit)) {}
  void report(const std::string& stage, int64_t done, int64_t total, double /*work_fraction*/) override {
    bar_.update(file_index_, prefix_ + stage + " " + std::to_string(done) + "/" + std::to_string(total) + " " + unit_,
                -1, done == total);
  }

 private:
  ProgressBar& bar_;
  int64_t file_index_;
  std::string prefix_;
  std::string unit_;
};

}  // namespace

Command add_record_command(CLI::App& app) {
  struct Options {
    std::vector<std::string> files;
    std::string backend = "reference";
    bool in_place = false;
    std::string out_dir;
    bool quiet = false;
    bool progress = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "record", "Run a trusted backend on batch files and store its results as /expected (exit 0 ok, 2 bad input)");
  cmd->add_option("files", opt->files, "hybrid-batch HDF5 files")->required();
  cmd->add_option("--backend", opt->backend, "Backend whose results become /expected")->capture_default_str();
  auto* in_place = cmd->add_flag("--in-place", opt->in_place, "Rewrite each file in place (the default)");
  cmd->add_option("--out-dir", opt->out_dir, "Write <out-dir>/<file name> instead of rewriting the inputs")
      ->excludes(in_place);
  cmd->add_flag("--quiet", opt->quiet, "Print only errors");
  cmd->add_flag("--progress", opt->progress,
                "Show progress on stderr even when it is not a terminal (one line per update)");
  return {cmd, [opt] {
            if (const int status = check_backends("record", {opt->backend}); status != 0) return status;
            int bad = 0;
            if (!opt->out_dir.empty()) std::filesystem::create_directories(opt->out_dir);
            ProgressBar progress(static_cast<int64_t>(opt->files.size()), !opt->quiet, stderr, opt->progress);
            for (size_t i = 0; i < opt->files.size(); ++i) {
              const std::string& path = opt->files[i];
              progress.update(static_cast<int64_t>(i), path);
              const std::string target =
                  opt->out_dir.empty() ? path
                                       : (std::filesystem::path(opt->out_dir) / std::filesystem::path(path).filename()).string();
              try {
                if (const StepEstimate estimate = estimate_step(path); estimate.holds_its_data) {
                  check_memory(estimate.peak_memory_bytes,
                               "reading " + path + " and running its step (outputs, KV cache and state pools before "
                               "and after)");
                }
                FileStepProgress transfer_progress(progress, static_cast<int64_t>(i), "", "MiB");
                BatchFile file = read_batch_file(path, FileProgress{&transfer_progress});
                progress.clear();
                print_file_warnings("record", path, file);
                progress.update(static_cast<int64_t>(i), path + "  preparing the step (metadata, inputs on the backend)",
                                -1, true);
                auto backend = create_backend(opt->backend, BackendSettings{file.config, file.builder});
                FileStepProgress step_progress(progress, static_cast<int64_t>(i), path + "  ", "query tokens");
                StepOutputs expected = run_step(*backend, file, StepOptions{&step_progress});
                expected.backend = opt->backend;
                file.expected = std::move(expected);
                write_batch_file(target, file, FileProgress{&transfer_progress});
                progress.clear();
                if (!opt->quiet) std::cout << "recorded " << target << " (backend " << opt->backend << ")\n";
              } catch (const Error& e) {
                progress.clear();
                std::cerr << "hybridtb record: " << path << ": error: " << e.what() << "\n";
                ++bad;
              }
            }
            progress.update(static_cast<int64_t>(opt->files.size()), "");
            progress.clear();
            return bad > 0 ? 2 : 0;
          }};
}

}  // namespace hybridtb::cli
