// hybridtb backends: list the backends compiled into this build, and whether each can run here
// (a GPU backend without its device is listed as unavailable, with the reason).
#include <iomanip>
#include <iostream>

#include "commands.h"
#include "hybridtb/backend.h"
#include "hybridtb/spec/ssm_mode.h"

namespace hybridtb::cli {

Command add_backends_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("backends", "List the backends compiled into this build");
  return {cmd, [] {
            register_builtin_backends();
            const BackendRegistry& registry = BackendRegistry::instance();
            for (const std::string& name : registry.names()) {
              const std::string reason = registry.unavailable_reason(name);
              std::cout << std::left << std::setw(12) << name << std::setw(14)
                        << (reason.empty() ? "available" : "UNAVAILABLE") << registry.description(name);
              if (!reason.empty()) std::cout << " [" << reason << "]";
              std::cout << "\n";
            }
            // The SSM modes a batch may name (/config ssm_mode, or a linear layer's layer_kind):
            // every mode with a descriptor, all of which the reference implements; a backend without
            // one of them reports NotSupported.
            std::cout << "\nSSM modes (reference):";
            for (const std::string& mode : spec::ssm::ModeSpecRegistry::instance().names()) std::cout << " " << mode;
            std::cout << "\n";
            return 0;
          }};
}

}  // namespace hybridtb::cli
