// hybridtb — the command-line tool: one binary, one subcommand per file (commands.h).
// Exit status: 0 success; 2 bad input (run, info, record, parity, replay: the message names the field)
// or a usage error; 1 a failed run or a parity/replay mismatch. `gen` still exits 1 on invalid
// settings (tests/gen/test_gen_cli.cpp). Each subcommand returns its status; main() maps an
// uncaught Error to 1.
#include <CLI/CLI.hpp>

#include <iostream>
#include <vector>

#include "commands.h"
#include "hybridtb/error.h"

int main(int argc, char** argv) {
  using namespace hybridtb::cli;
  CLI::App app{"hybridtb: a testbed for hybrid (sliding-window attention + SSM) backends of LLM serving engines"};
  app.require_subcommand(1);
  const std::vector<Command> commands = {
      add_run_command(app),
      add_info_command(app),
      add_backends_command(app),
      add_gen_command(app),
      add_record_command(app),
      add_parity_command(app),
      add_replay_command(app),
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
  } catch (const hybridtb::Error& e) {
    std::cerr << "hybridtb: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hybridtb: internal error: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
