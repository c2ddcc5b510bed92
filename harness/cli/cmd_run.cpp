// hybridtb run: compute a batch file's step on a backend and write it with /outputs.
// Exit status: 0 success; 3 the backend's device is not on this machine; 2 bad input (the file cannot be read or validated, an unknown backend, or
// the backend rejected the batch), as for record/parity/replay; 1 a failed run (the backend does
// not support the batch, or the output cannot be written). --out is checked before the run (not a
// directory, in an existing directory, not the input; an existing file only with --force). No
// output file is left on failure, nor a temporary one on SIGINT/SIGTERM (temporary_files.h).
// Before reading the batch, the sizes are estimated from the file's dataset shapes alone: --dry-run
// prints them and exits 0, and a peak above the memory available is refused (exit 2, memory.h).
// Progress of the computation (per block of query tokens, with an ETA) goes to stderr when it is a
// terminal, or always with --progress; never with --quiet.
// --explain prints the backend's plan of the step (BackendRegistry::explain: which kernel each row
// takes, the splits, the CTAs, the workspace) and exits 0 without computing or writing; it needs no
// device, since planning is host-only.
#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>

#include "commands.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/metadata_builders.h"
#include "hybridtb/step.h"
#include "checks.h"
#include "memory.h"
#include "progress.h"
#include "summary.h"

namespace hybridtb::cli {

namespace {

// run --explain: the step's builder metadata (the spec's builders, which every backend shares) and
// the backend's plan of it, printed. Exit 0, or 2 for a file or backend that cannot be read.
int explain_step(const std::string& backend, const std::string& batch_path) {
  register_builtin_backends();
  const BackendRegistry& registry = BackendRegistry::instance();
  if (!registry.contains(backend)) {
    std::cerr << "hybridtb run: error: unknown backend '" << backend << "' (see `hybridtb backends`)\n";
    return 2;
  }
  try {
    const BatchFile file = read_batch_file(batch_path);
    print_file_warnings("run", batch_path, file);
    const BackendSettings settings{file.config, file.builder};
    const HybridMetadata metadata = spec::build_hybrid_metadata(file.config, file.builder, file.batch);
    const std::string plan = registry.explain(backend, settings, file.batch, metadata);
    std::cout << "hybridtb run --explain: " << batch_path << " on backend '" << backend
              << "' (its plan of the step; nothing computed or written)\n"
              << plan;
  } catch (const NotSupported&) {
    throw;  // a limit of the backend, not of the file: main() reports it, exit 1
  } catch (const Error& e) {
    std::cerr << "hybridtb run: " << batch_path << ": error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  struct Options {
    std::string backend = "reference";
    std::string batch_path;
    std::string out_path;
    bool quiet = false;
    bool force = false;
    bool progress = false;
    bool dry_run = false;
    bool outputs_only = false;
    bool explain = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("run", "Run a batch file's step on a backend and write a file with /outputs");
  cmd->add_option("--backend", opt->backend, "Backend name (see `hybridtb backends`)")->capture_default_str();
  cmd->add_option("--batch", opt->batch_path, "Input hybrid-batch HDF5 file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", opt->out_path,
                  "Output HDF5 file (inputs + /outputs); written atomically; required unless --dry-run or --explain");
  cmd->add_flag("--quiet", opt->quiet, "Print nothing on success");
  cmd->add_flag("--force", opt->force, "Overwrite --out if it exists (never the input)");
  cmd->add_flag("--progress", opt->progress,
                "Show the progress of the computation on stderr even when it is not a terminal (one line per update)");
  cmd->add_flag("--outputs-only", opt->outputs_only,
                "Write /outputs alone, with root attributes naming the batch file (an outputs file: SCHEMA.md §5.7; "
                "`hybridtb info OUT` reads the pair)");
  cmd->add_flag("--dry-run", opt->dry_run,
                "Print the input and output file sizes and the peak host memory, then exit without computing or "
                "writing");
  cmd->add_flag("--explain", opt->explain,
                "Print the backend's plan of the step (which kernel each row takes, splits, CTAs, workspace bytes), "
                "then exit without computing or writing; needs no GPU");
  return {cmd, [opt] {
            if (opt->explain) return explain_step(opt->backend, opt->batch_path);
            const auto start = std::chrono::steady_clock::now();
            BatchFile file;
            StepOutputs outputs;
            // One bar for the whole command: reading the file (MiB), the step (query tokens), writing.
            ProgressBar bar(0, !opt->quiet, stderr, opt->progress);
            StepProgress transfer_progress(bar, "", "MiB");
            try {
              if (opt->out_path.empty() && !opt->dry_run) {
                std::cerr << "hybridtb run: --out is required (except with --dry-run or --explain)\n";
                return 2;
              }
              if (!opt->out_path.empty()) check_output_file("--out", opt->out_path, {opt->batch_path}, opt->force);
              if (const int status = check_backends("run", {opt->backend}); status != 0) return status;
              const StepEstimate estimate = estimate_step(opt->batch_path);
              const int64_t output_bytes =
                  opt->outputs_only ? estimate.outputs_only_bytes : estimate.output_file_bytes;
              if (opt->dry_run) {
                if (!estimate.holds_its_data) {
                  throw Error("its datasets declare " + std::to_string(estimate.input_file_bytes) +
                              " bytes, more than the file can hold: not a valid batch file (hybridtb info names "
                              "the dataset)");
                }
                const std::optional<int64_t> available = available_memory_bytes();
                std::cout << "hybridtb run --dry-run: " << opt->batch_path << " on backend '" << opt->backend
                          << "' (estimates from the dataset shapes; nothing computed or written)\n"
                          << "input file:   " << estimate.input_file_bytes << " bytes ("
                          << human_bytes(estimate.input_file_bytes) << ")\n"
                          << "output file:  " << output_bytes << " bytes (" << human_bytes(output_bytes)
                          << (opt->outputs_only ? ", /outputs alone" : "") << ", at most)\n"
                          << "peak memory:  " << estimate.peak_memory_bytes << " bytes ("
                          << human_bytes(estimate.peak_memory_bytes) << " of host memory, at most)\n"
                          << "available:    "
                          << (available ? human_bytes(*available) + " (" + available_memory_source() + ")"
                                        : std::string("unknown"))
                          << "\n";
                return 0;
              }
              if (estimate.holds_its_data) {  // otherwise read_batch_file refuses it, naming the dataset
                check_memory(estimate.peak_memory_bytes,
                             "reading " + opt->batch_path + " (" + human_bytes(estimate.input_file_bytes) +
                                 ") and running its step (outputs, KV cache and state pools before and after)");
              }
              file = read_batch_file(opt->batch_path, FileProgress{&transfer_progress});
              bar.clear();
              print_file_warnings("run", opt->batch_path, file);
              // Until the backend reports its first stage: building the metadata, the inputs to the backend.
              bar.set_total(1);
              bar.update(0, "preparing the step (metadata, inputs on the backend)", -1, true);
              auto backend = create_backend(opt->backend, BackendSettings{file.config, file.builder});
              StepProgress progress(bar);
              outputs = run_step(*backend, file, StepOptions{&progress});
            } catch (const NotSupported&) {
              bar.clear();
              throw;  // a limit of the backend, not of the file: main() reports it, exit 1
            } catch (const Error& e) {
              bar.clear();
              std::cerr << "hybridtb run: " << opt->batch_path << ": error: " << e.what() << "\n";
              return 2;
            }
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            file.outputs = std::move(outputs);
            if (opt->outputs_only) {
              write_outputs_file(opt->out_path, file, opt->batch_path, FileProgress{&transfer_progress});
            } else {
              write_batch_file(opt->out_path, file, FileProgress{&transfer_progress});
            }
            bar.clear();
            if (!opt->quiet) {
              std::cout << "hybridtb run: " << opt->batch_path << " on backend '" << opt->backend << "' → "
                        << opt->out_path << "\n";
              print_config(std::cout, file.config, file.builder);
              print_batch(std::cout, file.batch);
              print_metadata(std::cout, file.outputs->metadata);
              print_outputs(std::cout, file, *file.outputs);
              std::cout << "time:     " << std::fixed << std::setprecision(3) << seconds << " s (read, run, no write)\n";
            }
            return 0;
          }};
}

}  // namespace hybridtb::cli
