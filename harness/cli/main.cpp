// hybridtb — the command-line tool. Subcommands:
//   run       compute a batch file's outputs on a backend and write them to a new file
//   info      describe a batch file and say whether it is a valid hybrid-batch 1.x file
//   backends  list the backends compiled into this build
// Exit status: 0 success, 1 invalid input or failed run (message on stderr), 2 usage error.
#include <CLI/CLI.hpp>

#include <chrono>
#include <iomanip>
#include <iostream>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/step.h"
#include "summary.h"

namespace hybridtb::cli {
namespace {

struct RunOptions {
  std::string backend = "reference";
  std::string batch_path;
  std::string out_path;
  bool quiet = false;
};

int run_command(const RunOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  BatchFile file = read_batch_file(opt.batch_path);
  auto backend = create_backend(opt.backend, BackendSettings{file.config, file.builder});
  StepOutputs outputs = run_step(*backend, file);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  file.outputs = std::move(outputs);
  write_batch_file(opt.out_path, file);
  if (!opt.quiet) {
    std::cout << "hybridtb run: " << opt.batch_path << " on backend '" << opt.backend << "' → " << opt.out_path
              << "\n";
    print_config(std::cout, file.config, file.builder);
    print_batch(std::cout, file.batch);
    print_metadata(std::cout, file.outputs->metadata);
    print_outputs(std::cout, file, *file.outputs);
    std::cout << "time:     " << std::fixed << std::setprecision(3) << seconds << " s (read, run, no write)\n";
  }
  return 0;
}

int info_command(const std::string& path) {
  const std::vector<FileEntry> entries = list_file_entries(path);
  std::cout << path << ":\n";
  for (const FileEntry& e : entries) {
    std::cout << "  " << std::left << std::setw(48) << e.path << " " << e.kind;
    if (e.kind == "dataset") std::cout << " " << e.dtype_name << " " << shape_to_string(e.shape);
    std::cout << "\n";
  }
  try {
    const BatchFile file = read_batch_file(path);
    if (file.config.has_ssm_branch()) {
      const StepTensors views = file.inputs.views();
      reference::ssm::validate_ssm_tensors(file.config, views.ssm_state, views.weights);
    }
    std::cout << "valid:    hybrid-batch " << file.schema_version << "\n";
    for (const auto& [key, value] : file.provenance) std::cout << "          " << key << " = " << value << "\n";
    print_config(std::cout, file.config, file.builder);
    print_batch(std::cout, file.batch);
    if (file.outputs) {
      std::cout << "/outputs: from backend '" << file.outputs->backend << "'\n";
      print_metadata(std::cout, file.outputs->metadata);
      print_outputs(std::cout, file, *file.outputs);
    }
    if (file.expected) std::cout << "/expected: recorded by backend '" << file.expected->backend << "'\n";
    return 0;
  } catch (const Error& e) {
    std::cout << "INVALID:  " << e.what() << "\n";
    return 1;
  }
}

int backends_command() {
  register_builtin_backends();
  for (const std::string& name : BackendRegistry::instance().names()) {
    std::cout << std::left << std::setw(12) << name << BackendRegistry::instance().description(name) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace hybridtb::cli

int main(int argc, char** argv) {
  using namespace hybridtb::cli;
  CLI::App app{"hybridtb: a testbed for hybrid (sliding-window attention + SSM) backends of LLM serving engines"};
  app.require_subcommand(1);

  RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "Run a batch file's step on a backend and write a file with /outputs");
  run_cmd->add_option("--backend", run.backend, "Backend name (see `hybridtb backends`)")->capture_default_str();
  run_cmd->add_option("--batch", run.batch_path, "Input hybrid-batch HDF5 file")->required()->check(CLI::ExistingFile);
  run_cmd->add_option("--out", run.out_path, "Output HDF5 file (inputs + /outputs); written atomically")->required();
  run_cmd->add_flag("--quiet", run.quiet, "Print nothing on success");

  std::string info_path;
  auto* info_cmd = app.add_subcommand("info", "Describe a batch file and validate it (exit 1 if invalid)");
  info_cmd->add_option("file", info_path, "HDF5 file")->required()->check(CLI::ExistingFile);

  auto* backends_cmd = app.add_subcommand("backends", "List the backends compiled into this build");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (run_cmd->parsed()) return run_command(run);
    if (info_cmd->parsed()) return info_command(info_path);
    if (backends_cmd->parsed()) return backends_command();
  } catch (const hybridtb::Error& e) {
    std::cerr << "hybridtb: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hybridtb: internal error: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
