// hybridtb info: describe a batch file and say whether it is a valid hybrid-batch 1.x file.
// Exit status: 0 valid; 2 invalid or unreadable (the reason, naming the field, on stderr; the
// listing of what could be read and an "INVALID:" line on stdout). An outputs file (run
// --outputs-only) is read with the batch file it names, and described as the pair.
#include <iomanip>
#include <iostream>
#include <memory>

#include "checks.h"
#include "commands.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/linear_layer_specs.h"
#include "hybridtb/spec/ssm_mode.h"
#include "progress.h"
#include "summary.h"

namespace hybridtb::cli {

namespace {
int invalid(const std::string& path, const Error& e) {
  std::cout << "INVALID:  " << e.what() << "\n";
  std::cerr << "hybridtb info: " << path << ": error: " << e.what() << "\n";
  return 2;
}

int describe(const std::string& path) {
  std::vector<FileEntry> entries;
  try {
    entries = list_file_entries(path);
  } catch (const Error& e) {
    return invalid(path, e);  // not HDF5, truncated: nothing to list
  }
  std::cout << path << ":\n";
  for (const FileEntry& e : entries) {
    std::cout << "  " << std::left << std::setw(48) << e.path << " " << e.kind;
    if (e.kind == "dataset") std::cout << " " << e.dtype_name << " " << shape_to_string(e.shape);
    std::cout << "\n";
  }
  try {
    std::string batch_path;
    const bool outputs_file = is_outputs_file(path);
    std::cout.flush();  // the listing before the progress of the read (stderr)
    ProgressBar bar(0, true, stderr);
    StepProgress read_progress(bar, "", "MiB");
    const BatchFile file =
        outputs_file ? read_outputs_file(path, &batch_path) : read_batch_file(path, FileProgress{&read_progress});
    bar.clear();
    if (outputs_file) std::cout << "outputs file of " << batch_path << " (its /outputs alone)\n";
    print_file_warnings("info", path, file);
    const StepTensors views = file.inputs.views();
    if (file.config.is_linear_layer()) {
      spec::ssm::validate_linear_tensors(file.config, views.ssm_state, views.weights);
    } else if (file.config.has_ssm_branch()) {
      spec::ssm::validate_ssm_tensors(file.config, views.ssm_state, views.weights);
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
    return invalid(path, e);
  }
}
}  // namespace

Command add_info_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("info", "Describe a batch file and validate it (exit 2 if invalid)");
  cmd->add_option("file", *path, "HDF5 file")->required()->check(CLI::ExistingFile);
  return {cmd, [path] { return describe(*path); }};
}

}  // namespace hybridtb::cli
