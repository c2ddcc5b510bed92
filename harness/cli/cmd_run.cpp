// hybridtb run: compute a batch file's step on a backend and write it with /outputs.
#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>

#include "commands.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/step.h"
#include "summary.h"

namespace hybridtb::cli {

Command add_run_command(CLI::App& app) {
  struct Options {
    std::string backend = "reference";
    std::string batch_path;
    std::string out_path;
    bool quiet = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("run", "Run a batch file's step on a backend and write a file with /outputs");
  cmd->add_option("--backend", opt->backend, "Backend name (see `hybridtb backends`)")->capture_default_str();
  cmd->add_option("--batch", opt->batch_path, "Input hybrid-batch HDF5 file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", opt->out_path, "Output HDF5 file (inputs + /outputs); written atomically")->required();
  cmd->add_flag("--quiet", opt->quiet, "Print nothing on success");
  return {cmd, [opt] {
            const auto start = std::chrono::steady_clock::now();
            BatchFile file = read_batch_file(opt->batch_path);
            auto backend = create_backend(opt->backend, BackendSettings{file.config, file.builder});
            StepOutputs outputs = run_step(*backend, file);
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
