// hybridtb — the command-line tool: one binary, one subcommand per file (commands.h).
// Exit status: 0 success; 2 bad input (the message names the field) or a usage error; 1 a failed
// run or a parity/replay mismatch; 3 a backend's device (the GPU) is not on this machine (see each
// subcommand). Each subcommand returns its status; main()
// maps an uncaught Error to 1. SIGINT/SIGTERM remove the temporary file being written.
#include <CLI/CLI.hpp>

#include <iostream>
#include <vector>

#include "checks.h"
#include "commands.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/revision.h"
#include "hybridtb/temporary_files.h"

int main(int argc, char** argv) {
  using namespace hybridtb::cli;
  CLI::App app{"hybridtb: a testbed for hybrid (sliding-window attention + SSM) backends of LLM serving engines"};
  // A function, so that git is asked for the revision only when --version is given.
  app.set_version_flag("--version", [] {
    return "hybridtb " + hybridtb::source_revision().label() + " (reads and writes " + hybridtb::kSchemaName + " " +
           std::to_string(hybridtb::kSchemaMajor) + "." + std::to_string(hybridtb::kSchemaMinor) + ")";
  });
  app.require_subcommand(1);
  hybridtb::install_interrupt_cleanup();
  const std::vector<Command> commands = {
      add_run_command(app),
      add_info_command(app),
      add_backends_command(app),
      add_gen_command(app),
      add_record_command(app),
      add_parity_command(app),
      add_replay_command(app),
      add_tp_command(app),
      add_shrink_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (const Command& command : commands) {
      if (command.app->parsed()) return command.run();
    }
  } catch (const hybridtb::DeviceUnavailable& e) {
    std::cerr << "hybridtb: " << e.what() << "\n";
    return kExitNoDevice;
  } catch (const hybridtb::Error& e) {
    std::cerr << "hybridtb: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hybridtb: internal error: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
