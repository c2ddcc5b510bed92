// hybridtb backends: list the backends compiled into this build.
#include <iomanip>
#include <iostream>

#include "commands.h"
#include "hybridtb/backend.h"

namespace hybridtb::cli {

Command add_backends_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("backends", "List the backends compiled into this build");
  return {cmd, [] {
            register_builtin_backends();
            for (const std::string& name : BackendRegistry::instance().names()) {
              std::cout << std::left << std::setw(12) << name << BackendRegistry::instance().description(name) << "\n";
            }
            return 0;
          }};
}

}  // namespace hybridtb::cli
