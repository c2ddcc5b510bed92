#include "checks.h"

#include <filesystem>
#include <iostream>

#include "hybridtb/backend.h"

#include "hybridtb/error.h"

namespace hybridtb::cli {

void check_output_file(const std::string& option, const std::string& path, const std::vector<std::string>& inputs,
                       bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path out(path);
  HYBRIDTB_CHECK(!fs::is_directory(out, ec), option, " ", path, " is a directory (give a file name)");
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  HYBRIDTB_CHECK(fs::is_directory(parent, ec), option, " ", path, ": the directory ", parent.string(),
                 " does not exist");
  if (!fs::exists(out, ec)) return;
  for (const std::string& input : inputs) {
    HYBRIDTB_CHECK(!fs::equivalent(out, fs::path(input), ec), option, " ", path,
                   " is the input file: write the result to another file");
  }
  HYBRIDTB_CHECK(force, option, " ", path, " exists (pass --force to overwrite it)");
}

void print_file_warnings(const std::string& command, const std::string& path, const BatchFile& file) {
  for (const std::string& warning : file.warnings) {
    std::cerr << "hybridtb " << command << ": " << path << ": warning: " << warning << "\n";
  }
}

int check_backends(const std::string& command, const std::vector<std::string>& names) {
  register_builtin_backends();
  const BackendRegistry& registry = BackendRegistry::instance();
  for (const std::string& name : names) {
    if (!registry.contains(name)) {
      std::cerr << "hybridtb " << command << ": error: unknown backend '" << name << "' (see `hybridtb backends`)\n";
      return 2;
    }
    const std::string reason = registry.unavailable_reason(name);
    if (!reason.empty()) {
      std::cerr << "hybridtb " << command << ": backend '" << name << "' is not available on this machine: " << reason
                << "\n";
      return kExitNoDevice;
    }
  }
  return 0;
}

}  // namespace hybridtb::cli
