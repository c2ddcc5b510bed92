// hybridtb run: compute a batch file's step on a backend and write it with /outputs.
// Exit status: 0 success; 3 the backend's device is not on this machine; 2 bad input (the file cannot be read or validated, an unknown backend, or
// the backend rejected the batch), as for record/parity/replay; 1 a failed run (the backend does
// not support the batch, or the output cannot be written). --out is checked before the run (not a
// directory, in an existing directory, not the input; an existing file only with --force). No
// output file is left on failure, nor a temporary one on SIGINT/SIGTERM (temporary_files.h).
// Before reading the batch, the sizes are estimated from the file's dataset shapes alone: --dry-run
// prints them and exits 0, and a peak above the memory available is refused (exit 2, memory.h).
// Progress of the computation (per block of query tokens, with an ETA) goes to stderr when it is a
// terminal, or always with --progress; never with --quiet.
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>

#include "commands.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "checks.h"
#include "memory.h"
#include "progress.h"
#include "summary.h"

namespace hybridtb::cli {

namespace {

// What `run` will read, hold and write, from the dataset shapes of the input file (no data read).
// Outputs are counted at 8 bytes an element (the reference's float64, the widest any backend
// writes) and as if the layer had an SSM branch, so the estimate is an upper bound up to HDF5's
// own overhead and the builder metadata (integers per request and token, small by comparison); the
// peak includes kProcessOverheadBytes.
struct RunEstimate {
  int64_t input_file_bytes = 0;   // the tensors of the input file
  int64_t output_file_bytes = 0;  // the tensors of --out: the inputs (without an old /outputs) + /outputs
  int64_t outputs_only_bytes = 0;  // the tensors of --out with --outputs-only: /outputs alone
  int64_t peak_memory_bytes = 0;  // host memory at the peak of read + run
};

RunEstimate estimate_run(const std::string& path) {
  int64_t all = 0, old_outputs = 0, tensors = 0, kv = 0, pools = 0, tokens = 0, attention_row = 0, linear_row = 0;
  for (const FileEntry& entry : list_file_entries(path)) {
    if (entry.kind != "dataset") continue;
    int64_t numel = 1;
    for (const int64_t d : entry.shape) numel *= d;
    int64_t size = 8;  // an unlabelled or unknown type: assume the widest
    try {
      size = element_size(dtype_from_string(entry.dtype_name));
    } catch (const Error&) {
    }
    const int64_t bytes = numel * size;
    all += bytes;
    const auto under = [&](const char* prefix) { return entry.path.rfind(prefix, 0) == 0; };
    if (under("/outputs/")) old_outputs += bytes;
    if (under("/inputs/") || under("/weights/")) tensors += bytes;
    if (entry.path == "/inputs/kv_cache" || entry.path == "/inputs/k_scale_cache" ||
        entry.path == "/inputs/v_scale_cache") {
      kv += bytes;
    }
    if (under("/inputs/ssm/")) pools += bytes;
    if (entry.path == "/batch/slot_mapping" && entry.shape.size() == 1) tokens = entry.shape[0];
    if (entry.path == "/inputs/query" && entry.shape.size() == 3) attention_row = entry.shape[1] * entry.shape[2];
    if (under("/inputs/") && !under("/inputs/ssm/") && entry.shape.size() == 2) {
      linear_row = std::max(linear_row, entry.shape[1]);  // a linear layer's output is at most its widest input
    }
  }
  // output, attn_output and ssm_output of an attention layer; output alone of a linear one.
  const int64_t outputs = attention_row > 0 ? 3 * tokens * attention_row * 8 : tokens * linear_row * 8;
  const int64_t after = outputs + kv + pools;  // /outputs: the outputs, the KV cache and the pools after
  RunEstimate e;
  e.input_file_bytes = all;
  e.output_file_bytes = all - old_outputs + after;
  e.outputs_only_bytes = after;
  // The file read, the inputs copied into the backend (host memory for the reference), the output
  // buffers, and the host copies of everything /outputs holds.
  e.peak_memory_bytes = all + tensors + outputs + after + kProcessOverheadBytes;
  return e;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  struct Options {
    std::string backend = "reference";
    std::string batch_path;
    std::string out_path;
    bool quiet = false;
    bool force = false;
    bool progress = false;
    bool dry_run = false;
    bool outputs_only = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("run", "Run a batch file's step on a backend and write a file with /outputs");
  cmd->add_option("--backend", opt->backend, "Backend name (see `hybridtb backends`)")->capture_default_str();
  cmd->add_option("--batch", opt->batch_path, "Input hybrid-batch HDF5 file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", opt->out_path,
                  "Output HDF5 file (inputs + /outputs); written atomically; required unless --dry-run");
  cmd->add_flag("--quiet", opt->quiet, "Print nothing on success");
  cmd->add_flag("--force", opt->force, "Overwrite --out if it exists (never the input)");
  cmd->add_flag("--progress", opt->progress,
                "Show the progress of the computation on stderr even when it is not a terminal (one line per update)");
  cmd->add_flag("--outputs-only", opt->outputs_only,
                "Write /outputs alone, with root attributes naming the batch file (an outputs file: SCHEMA.md §5.7; "
                "`hybridtb info OUT` reads the pair)");
  cmd->add_flag("--dry-run", opt->dry_run,
                "Print the input and output file sizes and the peak host memory, then exit without computing or "
                "writing");
  return {cmd, [opt] {
            const auto start = std::chrono::steady_clock::now();
            BatchFile file;
            StepOutputs outputs;
            try {
              if (opt->out_path.empty() && !opt->dry_run) {
                std::cerr << "hybridtb run: --out is required (except with --dry-run)\n";
                return 2;
              }
              if (!opt->out_path.empty()) check_output_file("--out", opt->out_path, {opt->batch_path}, opt->force);
              if (const int status = check_backends("run", {opt->backend}); status != 0) return status;
              const RunEstimate estimate = estimate_run(opt->batch_path);
              const int64_t output_bytes =
                  opt->outputs_only ? estimate.outputs_only_bytes : estimate.output_file_bytes;
              if (opt->dry_run) {
                const std::optional<int64_t> available = available_memory_bytes();
                std::cout << "hybridtb run --dry-run: " << opt->batch_path << " on backend '" << opt->backend
                          << "' (estimates from the dataset shapes; nothing computed or written)\n"
                          << "input file:   " << estimate.input_file_bytes << " bytes ("
                          << human_bytes(estimate.input_file_bytes) << ")\n"
                          << "output file:  " << output_bytes << " bytes (" << human_bytes(output_bytes)
                          << (opt->outputs_only ? ", /outputs alone" : "") << ", at most)\n"
                          << "peak memory:  " << estimate.peak_memory_bytes << " bytes ("
                          << human_bytes(estimate.peak_memory_bytes) << " of host memory, at most)\n"
                          << "available:    "
                          << (available ? human_bytes(*available) + " (" + available_memory_source() + ")"
                                        : std::string("unknown"))
                          << "\n";
                return 0;
              }
              check_memory(estimate.peak_memory_bytes,
                           "reading " + opt->batch_path + " (" + human_bytes(estimate.input_file_bytes) +
                               ") and running its step (outputs, KV cache and state pools before and after)");
              file = read_batch_file(opt->batch_path);
              auto backend = create_backend(opt->backend, BackendSettings{file.config, file.builder});
              ProgressBar bar(file.batch.num_actual_tokens, !opt->quiet, stderr, opt->progress);
              StepProgress progress(bar);
              outputs = run_step(*backend, file, StepOptions{&progress});
              bar.clear();
            } catch (const NotSupported&) {
              throw;  // a limit of the backend, not of the file: main() reports it, exit 1
            } catch (const Error& e) {
              std::cerr << "hybridtb run: " << opt->batch_path << ": error: " << e.what() << "\n";
              return 2;
            }
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            file.outputs = std::move(outputs);
            if (opt->outputs_only) {
              write_outputs_file(opt->out_path, file, opt->batch_path);
            } else {
              write_batch_file(opt->out_path, file);
            }
            if (!opt->quiet) {
              std::cout << "hybridtb run: " << opt->batch_path << " on backend '" << opt->backend << "' → "
                        << opt->out_path << "\n";
              print_config(std::cout, file.config, file.builder);
              print_batch(std::cout, file.batch);
              print_metadata(std::cout, file.outputs->metadata);
              print_outputs(std::cout, file, *file.outputs);
              std::cout << "time:     " << std::fixed << std::setprecision(3) << seconds << " s (read, run, no write)\n";
            }
            return 0;
          }};
}

}  // namespace hybridtb::cli
