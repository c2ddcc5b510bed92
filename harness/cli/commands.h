// The subcommands of `hybridtb`, one source file each. Each add_*_command() registers its
// options on the app and returns the function that runs it; main() dispatches to the parsed one.
// Exit status: see main.cpp (0 success, 2 bad input or usage error, 1 failed run or mismatch).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace hybridtb::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_run_command(CLI::App& app);       // cmd_run.cpp
Command add_info_command(CLI::App& app);      // cmd_info.cpp
Command add_backends_command(CLI::App& app);  // cmd_backends.cpp
Command add_gen_command(CLI::App& app);       // cmd_gen.cpp
Command add_record_command(CLI::App& app);    // cmd_record.cpp (exit 0 ok, 2 bad input)
Command add_parity_command(CLI::App& app);    // cmd_parity.cpp (exit 0 pass, 1 mismatch, 2 bad input)
Command add_replay_command(CLI::App& app);    // cmd_parity.cpp (exit 0 pass, 1 mismatch, 2 bad input)
Command add_tp_command(CLI::App& app);        // cmd_parity.cpp (exit 0 pass, 1 mismatch, 2 bad input)
Command add_shrink_command(CLI::App& app);    // cmd_shrink.cpp (exit 0 written, 1 batch passes, 2 bad input)

}  // namespace hybridtb::cli
