// Checks the subcommands make before any computation: an output file path (run, shrink) is not a
// directory, its directory exists, it is none of the command's inputs, and an existing file is
// replaced only with --force; and the backends asked for are known and have their device here.
#pragma once

#include <string>
#include <vector>

#include "hybridtb/batch_file.h"

namespace hybridtb::cli {

// Throws Error naming `option` and the constraint.
void check_output_file(const std::string& option, const std::string& path, const std::vector<std::string>& inputs,
                       bool force);

// Prints the reader's warnings about `file` (BatchFile::warnings) to stderr, one line each.
void print_file_warnings(const std::string& command, const std::string& path, const BatchFile& file);

// Exit status for a backend whose device is not on this machine (DeviceUnavailable).
inline constexpr int kExitNoDevice = 3;

// 0 if every backend in `names` is registered and available; else prints why (prefixed by
// "hybridtb <command>: ") and returns 2 for an unknown name or kExitNoDevice for a missing device.
int check_backends(const std::string& command, const std::vector<std::string>& names);

}  // namespace hybridtb::cli
