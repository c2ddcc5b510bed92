// hybridtb run: compute a batch file's step on a backend and write it with /outputs.
// Exit status: 0 success; 3 the backend's device is not on this machine; 2 bad input (the file cannot be read or validated, an unknown backend, or
// the backend rejected the batch), as for record/parity/replay; 1 a failed run (the backend does
// not support the batch, or the output cannot be written). --out is checked before the run (not a
// directory, in an existing directory, not the input; an existing file only with --force). No
// output file is left on failure, nor a temporary one on SIGINT/SIGTERM (temporary_files.h).
#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>

#include "commands.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "checks.h"
#include "summary.h"

namespace hybridtb::cli {

Command add_run_command(CLI::App& app) {
  struct Options {
    std::string backend = "reference";
    std::string batch_path;
    std::string out_path;
    bool quiet = false;
    bool force = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("run", "Run a batch file's step on a backend and write a file with /outputs");
  cmd->add_option("--backend", opt->backend, "Backend name (see `hybridtb backends`)")->capture_default_str();
  cmd->add_option("--batch", opt->batch_path, "Input hybrid-batch HDF5 file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", opt->out_path, "Output HDF5 file (inputs + /outputs); written atomically")->required();
  cmd->add_flag("--quiet", opt->quiet, "Print nothing on success");
  cmd->add_flag("--force", opt->force, "Overwrite --out if it exists (never the input)");
  return {cmd, [opt] {
            const auto start = std::chrono::steady_clock::now();
            BatchFile file;
            StepOutputs outputs;
            try {
              check_output_file("--out", opt->out_path, {opt->batch_path}, opt->force);
              if (const int status = check_backends("run", {opt->backend}); status != 0) return status;
              file = read_batch_file(opt->batch_path);
              print_file_warnings("run", opt->batch_path, file);
              auto backend = create_backend(opt->backend, BackendSettings{file.config, file.builder});
              outputs = run_step(*backend, file);
            } catch (const NotSupported&) {
              throw;  // a limit of the backend, not of the file: main() reports it, exit 1
            } catch (const Error& e) {
              std::cerr << "hybridtb run: " << opt->batch_path << ": error: " << e.what() << "\n";
              return 2;
            }
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            file.outputs = std::move(outputs);
            write_batch_file(opt->out_path, file);
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
