// hybridtb shrink: reduce a batch on which a backend fails parity (or throws) to a minimal batch that
// still fails the same way, and write it with its reduction log (hybridtb/shrink.h). Each kept
// reduction is printed to stderr as it happens (unless --quiet).
//
// Exit status: 0 a minimal failing batch was written; 1 the batch does not fail (nothing to
// minimise); 2 bad input or a usage error (unreadable file, unknown backend, a batch that does not
// run on the --against backend, an --out that is the input, a directory, in a missing directory,
// or an existing file without --force); 3 a backend's device is not on this machine. --out and the
// backends are checked before any computation.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/shrink.h"
#include "checks.h"

namespace hybridtb::cli {

namespace {

struct Options {
  std::string file;
  std::string backend;
  std::string against = "reference";
  std::string out;
  bool force = false;
  double time_limit_s = 600.0;
  bool quiet = false;
};

int shrink_command(const Options& opt) {
  BatchFile file;
  try {
    check_output_file("--out", opt.out, {opt.file}, opt.force);
    if (const int status = check_backends("shrink", {opt.backend, opt.against}); status != 0) return status;
    file = read_batch_file(opt.file);
    print_file_warnings("shrink", opt.file, file);
  } catch (const Error& e) {
    std::cerr << "hybridtb shrink: error: " << e.what() << "\n";
    return 2;
  }

  const shrink::Judge judge = [&](const BatchFile& candidate) {
    return shrink::judge_parity(candidate, opt.backend, opt.against);
  };
  shrink::Options options;
  options.time_limit_s = opt.time_limit_s;
  if (!opt.quiet) options.on_step = [](const std::string& line) { std::cerr << "  kept: " << line << "\n"; };

  const shrink::Verdict original = judge(file);
  if (!original.valid) {
    std::cerr << "hybridtb shrink: error: " << opt.file << " does not run on '" << opt.against << "': "
              << original.detail << "\n";
    return 2;
  }
  if (!original.fails) {
    std::cout << opt.file << ": " << original.detail << " (" << opt.backend << " against " << opt.against
              << "): nothing to minimise\n";
    return 1;
  }
  if (!opt.quiet) {
    std::cerr << "shrinking " << opt.file << ": " << shrink::describe(file) << ", " << original.detail << "\n";
  }
  shrink::Result result = shrink::shrink_batch(file, judge, options);

  nlohmann::ordered_json log = nlohmann::ordered_json::array();
  for (const shrink::Step& step : result.kept) log.push_back({{"reduction", step.reduction}, {"batch", step.batch}});
  BatchFile& minimal = result.minimal;
  minimal.provenance["producer"] = "hybridtb shrink";
  minimal.provenance["shrunk_from"] = opt.file;
  minimal.provenance["shrink_backends"] = opt.backend + " against " + opt.against;
  minimal.provenance["shrink_original"] = shrink::describe(file) + ", " + result.original.detail;
  minimal.provenance["shrink_verdict"] = result.final_verdict.detail;
  minimal.provenance["shrink_log"] = log.dump();
  try {
    write_batch_file(opt.out, minimal);
  } catch (const Error& e) {
    std::cerr << "hybridtb shrink: error: " << e.what() << "\n";
    return 1;
  }
  std::cout << "minimal batch: " << opt.out << ": " << shrink::describe(minimal) << ", "
            << result.final_verdict.detail << "\n"
            << "from " << shrink::describe(file) << " in " << result.kept.size() << " kept reductions ("
            << result.tried << " candidates judged, " << static_cast<int64_t>(result.seconds) << " s"
            << (result.timed_out ? ", stopped at --time-limit" : "") << ")\n"
            << "reproduce: hybridtb parity --backend " << opt.backend << " --against " << opt.against << " "
            << opt.out << "\n";
  return 0;
}

}  // namespace

Command add_shrink_command(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "shrink",
      "Reduce a batch on which a backend fails parity to a minimal batch that still fails (exit 0 written, "
      "1 the batch passes, 2 bad input)");
  cmd->add_option("file", opt->file, "the failing hybrid-batch HDF5 file")->required();
  cmd->add_option("--backend", opt->backend, "Backend under test (see `hybridtb backends`)")->required();
  cmd->add_option("--against", opt->against, "Backend giving the expected results")->capture_default_str();
  cmd->add_option("--out", opt->out, "Where to write the minimal batch (with its reduction log)")->required();
  cmd->add_flag("--force", opt->force, "Overwrite --out if it exists");
  cmd->add_option("--time-limit", opt->time_limit_s, "Stop searching after this many seconds and keep the best")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--quiet", opt->quiet, "Do not print each kept reduction");
  return {cmd, [opt] { return shrink_command(*opt); }};
}

}  // namespace hybridtb::cli
