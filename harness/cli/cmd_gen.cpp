// hybridtb gen: realistic batch files from a model preset and a one-line mix (presets.h, mix.h).
// Every file records the seed and the exact command that regenerates it bit for bit. Documented
// in datasets/GENERATING.md; checked end to end by tests/gen/test_gen_cli.cpp.
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>

#include "commands.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"
#include "hybridtb/mix.h"
#include "hybridtb/dtype.h"
#include "hybridtb/linear_layer.h"
#include "hybridtb/presets.h"
#include "hybridtb/shell.h"
#include "hybridtb/spec/linear_layer_specs.h"
#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/spec/tensor_parallel.h"
#include "hybridtb/synthetic.h"
#include "memory.h"
#include "progress.h"

namespace hybridtb::cli {

namespace {

const char* kGrammarHelp = R"(
Mix grammar: terms joined by '+' (spaces around terms ignored), in any order:
  dN@C      N decodes (1 token each) at context C
  pNxL      N fresh prefills of L tokens (context 0)
  cNxL@C    N chunks of L tokens continuing requests at context C >= 1
  sNxK@C    N speculative decodes of K tokens (K = 1 + num_speculative_tokens >= 2) at context C;
            sets num_speculative_tokens = K-1 and draws num_accepted_tokens in [1, K]
  L, K and C take a k suffix (x1024): d64@4k = 64 decodes at context 4096.
Requests come out decodes first, then chunks, then prefills (vLLM's order), whatever the order
written. The canonical form (file names, provenance) writes multiples of 1024 with k.
Example: hybridtb gen --preset mistral-7b --mix d32@8k+c1x512@2k+p2x1k --out step.h5
         hybridtb gen --preset all --mix d64@4k --mix p1x2k --out-dir grid/
                      (writes grid/<preset>__<canonical mix>.h5 for each pair)
)";

std::string presets_help() {
  std::ostringstream out;
  out << "\nPresets (--preset NAME, a comma list, or all):\n";
  for (const Preset& p : presets()) {
    out << "  " << p.name << ": " << p.description << "\n     ";
    for (const std::string& s : p.settings) out << " " << s;
    out << "\n";
  }
  out << "\nSettings (--set key=value, repeatable, applied after the preset):\n" << settings_help();
  return out.str();
}

// --mm-prefix SPEC → /batch/mm_prefix_range int32 [R, M, 2]. SPEC: one entry per request in the
// generated order (decodes first), joined by '/'; a request's ranges joined by ','; a range
// START:END, inclusive absolute positions, 0:0 = none. Requests with fewer ranges than the most
// are padded with 0:0. E.g. "0:0/28:37/2:6,10:15" for three requests.
IntArray parse_mm_prefix(const std::string& spec, int64_t num_reqs) {
  const auto fail = [&](const std::string& why) -> Error {
    return Error("--mm-prefix '" + spec + "': " + why +
                 " (expected one entry per request joined by '/', ranges START:END joined by ',')");
  };
  const auto split = [](const std::string& text, char separator) {
    std::vector<std::string> parts;
    std::string::size_type begin = 0;
    for (;;) {
      const std::string::size_type end = text.find(separator, begin);
      parts.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
      if (end == std::string::npos) return parts;
      begin = end + 1;
    }
  };
  const auto position = [&](const std::string& text) {
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(text, &used);
    } catch (const std::exception&) {
    }
    if (text.empty() || used != text.size() || value < 0 || value > std::numeric_limits<int32_t>::max()) {
      throw fail("'" + text + "' is not a position (an integer in [0, 2^31))");
    }
    return static_cast<int32_t>(value);
  };
  const std::vector<std::string> requests = split(spec, '/');
  if (static_cast<int64_t>(requests.size()) != num_reqs) {
    throw fail(std::to_string(requests.size()) + " entries, but the batch has " + std::to_string(num_reqs) +
               " requests");
  }
  std::vector<std::vector<std::pair<int32_t, int32_t>>> ranges;
  size_t most = 1;
  for (const std::string& request : requests) {
    ranges.emplace_back();
    for (const std::string& range : split(request, ',')) {
      const std::vector<std::string> ends = split(range, ':');
      if (ends.size() != 2) throw fail("range '" + range + "' is not START:END");
      ranges.back().emplace_back(position(ends[0]), position(ends[1]));
    }
    most = std::max(most, ranges.back().size());
  }
  std::vector<int32_t> values;
  for (const auto& request : ranges) {
    for (size_t m = 0; m < most; ++m) {
      const auto range = m < request.size() ? request[m] : std::pair<int32_t, int32_t>{0, 0};
      values.push_back(range.first);
      values.push_back(range.second);
    }
  }
  return IntArray({num_reqs, static_cast<int64_t>(most), 2}, std::move(values));
}

// What `gen` will hold and write for one file, from the layer and the mix alone (nothing drawn).
// An upper bound: the KV cache counted as 1 + every request's own blocks (prefix hits and aliasing
// share some), the state pools with one slot per request (one per KV block with mamba_cache_mode
// all) plus the null slot, each mode's pools and weights from its specs.
struct GenEstimate {
  int64_t file_bytes = 0;         // the tensors of the file (HDF5 adds a little)
  int64_t peak_memory_bytes = 0;  // the batch in memory (then, freed, the same read back for the check)
                                  // + kProcessOverheadBytes
};

GenEstimate estimate_gen(const Layer& layer, const Mix& mix, const GenOptions& options) {
  const AttentionConfig& c = layer.attention;
  const int64_t reqs = std::max(mix.num_requests(), options.pad_to);
  const int64_t tokens = std::max(mix.num_tokens(), options.pad_to);
  int64_t blocks = 1;  // the null block
  for (const RequestSpec& r : mix_requests(mix)) {
    blocks += (r.context_len + r.query_len + c.block_size - 1) / c.block_size;
  }
  const auto numel = [](const Shape& shape) {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    return n;
  };
  int64_t bytes = 0;
  const int64_t elem = element_size(c.dtype);
  std::vector<spec::ssm::TensorSpec> state, weights;
  if (c.is_linear_layer()) {
    for (const LinearInput& input : linear_layer_spec(c).inputs) bytes += tokens * input.width * elem;
    const auto specs = spec::ssm::linear_layer_tensor_specs(c);
    state = specs.state;
    weights = specs.weights;
  } else {
    bytes += tokens * (c.num_heads + 2 * c.num_kv_heads) * c.head_size * elem;  // query, key, value
    if (c.attn_type == AttnType::kDecoder) {
      bytes += blocks * 2 * c.block_size * c.num_kv_heads * c.head_size *
               element_size(kv_storage_dtype(c.kv_cache_dtype, c.dtype));
      if (is_per_token_head(c.kv_cache_dtype)) bytes += 2 * blocks * c.block_size * c.num_kv_heads * 4;
    }
    if (c.has_ssm_branch()) {
      const auto& mode = spec::ssm::ModeSpecRegistry::instance().find(c.ssm_mode);
      const auto shape = spec::ssm::mode_shape(c);
      state = mode.state_specs(shape);
      weights = mode.weight_specs(shape);
    }
  }
  const int64_t slots = c.mamba_cache_mode == MambaCacheMode::kNone ? reqs + 1 : blocks;
  for (const auto& spec : state) bytes += slots * numel(spec.shape) * element_size(spec.dtype);
  for (const auto& spec : weights) bytes += numel(spec.shape) * element_size(spec.dtype);
  bytes += (3 * reqs + 2 * tokens + reqs * blocks) * 8;  // the batch description, generously
  return {bytes, bytes + kProcessOverheadBytes};
}

}  // namespace

Command add_gen_command(CLI::App& app) {
  struct Options {
    std::string preset;
    std::vector<std::string> mixes;
    std::vector<std::string> settings;
    uint64_t seed = 0;
    std::string out_path;
    std::string out_dir;
    int64_t pad_to = 0;
    std::string prefix_hits = "0";
    bool alias_blocks = false;
    std::string ssm_slots = "auto";
    bool no_shuffle = false;
    std::string mamba_cache_mode, cudagraph_mode, capture_sizes;
    std::string engine_version = newest_engine_version().substr(5);  // the bare release
    std::string mm_prefix;
    int64_t tp = 1;
    bool list_presets = false;
    bool quiet = false;
    bool dry_run = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("gen", "Generate realistic batch files from a model preset and a mix");
  cmd->add_option("--preset", opt->preset, "Model preset: a name, a comma list, or all (see below)");
  cmd->add_option("--mix", opt->mixes, "The step's mix, e.g. d64@4k+p2x2k (repeatable or comma-separated; grammar below)")
      ->delimiter(',');
  cmd->add_option("--set", opt->settings, "Override a field: key=value (repeatable; keys below)");
  cmd->add_option("--seed", opt->seed, "Seed of every random choice (printed and stored in the file)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--out", opt->out_path, "Output file (one preset and one mix); written atomically");
  cmd->add_option("--out-dir", opt->out_dir, "Output directory: writes DIR/<preset>__<canonical mix>.h5 for each pair");
  cmd->add_option("--pad-to", opt->pad_to,
                  "CUDA-graph padding of a decode-only mix: padding requests and token rows up to N (turns on full "
                  "CUDA graphs with N among the capture sizes)");
  cmd->add_option("--prefix-hits", opt->prefix_hits,
                  "Prefix-cache hits: requests with context >= T tokens share the physical blocks of their first T "
                  "tokens (k suffix allowed; full blocks only; mamba_cache_mode all also shares the SSM states)")
      ->capture_default_str();
  cmd->add_flag("--alias-blocks", opt->alias_blocks,
                "Random block-table aliasing: blocks a request only reads are drawn with repeats from a small pool");
  cmd->add_option("--ssm-slots", opt->ssm_slots,
                  "A dedicated /batch/ssm_block_table: auto (on when the layer keeps SSM state) | on (any layer) | off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--no-shuffle", opt->no_shuffle, "Consecutive block ids instead of shuffled ones");
  cmd->add_option("--engine-version", opt->engine_version,
                  "The serving engine whose rules the batch follows (/config engine_version): a vLLM release (" +
                      [] {
                        std::string list;
                        for (const std::string& v : supported_engine_versions()) list += (list.empty() ? "" : ", ") + v.substr(5);
                        return list;
                      }() +
                      ") or none (no engine_version: the unversioned rules of older files)")
      ->capture_default_str();
  cmd->add_option("--mamba-cache-mode", opt->mamba_cache_mode, "Same as --set mamba_cache_mode=...");
  cmd->add_option("--cudagraph-mode", opt->cudagraph_mode, "Same as --set cudagraph_mode=...");
  cmd->add_option("--capture-sizes", opt->capture_sizes, "Same as --set cudagraph_capture_sizes=... (comma list)");
  cmd->add_option("--mm-prefix", opt->mm_prefix,
                  "Bidirectional mm-prefix ranges (/batch/mm_prefix_range): one entry per request in the "
                  "generated order, joined by '/'; ranges START:END (inclusive absolute positions, 0:0 = none) "
                  "joined by ','; e.g. 0:0/28:37/2:6,10:15");
  cmd->add_option("--tp", opt->tp,
                  "Also write the N tensor-parallel rank files of each step beside it, FILE.tpN-rankR.h5 (vLLM's "
                  "head and mamba1 channel split; datasets/SCHEMA.md 5.2.2); 1 writes the unsharded file alone")
      ->capture_default_str();
  cmd->add_flag("--list-presets", opt->list_presets, "Print the presets and the settings, then exit");
  cmd->add_flag("--quiet", opt->quiet, "Print nothing on success");
  cmd->add_flag("--dry-run", opt->dry_run,
                "Print each file's size and the peak host memory (estimates, upper bounds), then exit without "
                "generating or writing");
  cmd->footer(std::string(kGrammarHelp) + presets_help() +
              "\nExit status: 0 success, 2 invalid settings or a usage error (nothing written), 1 the file could not be "
              "written.");

  return {cmd, [opt] {
           try {
            if (opt->list_presets) {
              std::cout << presets_help();
              return 0;
            }
            if (opt->preset.empty() || opt->mixes.empty()) {
              std::cerr << "hybridtb gen: --preset and --mix are required (see hybridtb gen --help)\n";
              return 2;
            }
            if (opt->out_path.empty() == opt->out_dir.empty()) {
              std::cerr << "hybridtb gen: give exactly one of --out FILE and --out-dir DIR\n";
              return 2;
            }
            // Everything is parsed and checked before anything is written.
            const std::vector<std::string> preset_names = expand_preset_list(opt->preset);
            std::vector<Mix> mixes;
            for (const std::string& m : opt->mixes) mixes.push_back(parse_mix(m));
            if (!opt->out_path.empty() && preset_names.size() * mixes.size() != 1) {
              std::cerr << "hybridtb gen: --out takes one preset and one mix; use --out-dir for "
                        << preset_names.size() * mixes.size() << " files\n";
              return 2;
            }
            if (opt->tp < 1) {
              std::cerr << "hybridtb gen: --tp must be at least 1 (the number of tensor-parallel ranks), got " << opt->tp
                        << "\n";
              return 2;
            }
            std::vector<std::string> settings = opt->settings;
            if (!opt->mamba_cache_mode.empty()) settings.push_back("mamba_cache_mode=" + opt->mamba_cache_mode);
            if (!opt->cudagraph_mode.empty()) settings.push_back("cudagraph_mode=" + opt->cudagraph_mode);
            if (!opt->capture_sizes.empty()) settings.push_back("cudagraph_capture_sizes=" + opt->capture_sizes);
            GenOptions gen;
            gen.seed = opt->seed;
            gen.pad_to = opt->pad_to;
            try {
              LayerSettings probe;  // reuse the integer parser (k suffix) of the settings
              apply_setting(probe, "mamba_block_size=" + opt->prefix_hits);
              gen.prefix_hit_tokens = probe.attention.mamba_block_size;
            } catch (const Error&) {
              throw Error("--prefix-hits: expected a token count (k suffix allowed), got '" + opt->prefix_hits + "'");
            }
            gen.alias_blocks = opt->alias_blocks;
            gen.shuffle_blocks = !opt->no_shuffle;
            if (opt->ssm_slots != "auto") gen.ssm_slots = opt->ssm_slots == "on";
            std::vector<Layer> layers;
            // The engine version first, so that a preset's or --set's values are checked against its rules.
            const std::string engine_version = canonical_engine_version(opt->engine_version, "--engine-version");
            const std::string engine_word = engine_version.empty() ? "none" : engine_version.substr(5);
            std::vector<std::string> layer_settings{"engine_version=" + engine_word};
            layer_settings.insert(layer_settings.end(), settings.begin(), settings.end());
            for (const std::string& name : preset_names) layers.push_back(make_layer(name, layer_settings));
            // Every layer must split over --tp ranks (heads, kv heads, mamba1 channels) before anything is written.
            if (opt->tp > 1) {
              for (size_t p = 0; p < preset_names.size(); ++p) {
                for (int64_t r = 0; r < opt->tp; ++r) {
                  try {
                    (void)spec::shard_config(layers[p].attention, spec::tp_shard(layers[p].attention, opt->tp, r));
                  } catch (const Error& e) {
                    throw Error(detail::concat("--tp ", opt->tp, ": preset ", preset_names[p], ": ", e.what()));
                  }
                }
              }
            }

            // Sizes first: --dry-run prints them; otherwise a file that cannot fit in memory is refused
            // before anything is generated or written.
            for (size_t p = 0; p < preset_names.size(); ++p) {
              for (const Mix& mix : mixes) {
                const GenEstimate estimate = estimate_gen(layers[p], mix, gen);
                const std::string what = preset_names[p] + " " + to_string(mix);
                if (opt->dry_run) {
                  std::cout << "hybridtb gen --dry-run: " << what << ": file " << estimate.file_bytes << " bytes ("
                            << human_bytes(estimate.file_bytes) << "), peak memory " << estimate.peak_memory_bytes
                            << " bytes (" << human_bytes(estimate.peak_memory_bytes) << "), at most\n";
                } else {
                  check_memory(estimate.peak_memory_bytes, "generating " + what);
                }
              }
            }
            if (opt->dry_run) {
              const std::optional<int64_t> available = available_memory_bytes();
              std::cout << "available memory: "
                        << (available ? human_bytes(*available) + " (" + available_memory_source() + ")"
                                      : std::string("unknown"))
                        << "; nothing generated or written\n";
              return 0;
            }
            if (!opt->out_dir.empty()) std::filesystem::create_directories(opt->out_dir);
            if (!opt->quiet) std::cout << "hybridtb gen: seed " << opt->seed << "\n";
            for (size_t p = 0; p < preset_names.size(); ++p) {
              for (const Mix& mix : mixes) {
                const std::string mix_name = to_string(mix);
                const std::string path = !opt->out_path.empty()
                                             ? opt->out_path
                                             : (std::filesystem::path(opt->out_dir) /
                                                (preset_names[p] + "__" + mix_name + ".h5"))
                                                   .string();
                // The command that regenerates exactly this file (one preset, one mix).
                std::string command = "hybridtb gen --preset " + preset_names[p] + " --mix " + mix_name +
                                      " --seed " + std::to_string(opt->seed) + " --engine-version " + engine_word;
                for (const std::string& s : settings) command += " --set " + shell_word(s);
                if (gen.pad_to > 0) command += " --pad-to " + std::to_string(gen.pad_to);
                if (gen.prefix_hit_tokens > 0) command += " --prefix-hits " + std::to_string(gen.prefix_hit_tokens);
                if (gen.alias_blocks) command += " --alias-blocks";
                if (gen.ssm_slots) command += std::string(" --ssm-slots ") + (*gen.ssm_slots ? "on" : "off");
                if (!gen.shuffle_blocks) command += " --no-shuffle";
                if (!opt->mm_prefix.empty()) command += " --mm-prefix " + shell_word(opt->mm_prefix);
                if (opt->tp > 1) command += " --tp " + std::to_string(opt->tp);
                command += " --out " + shell_word(path);
                // One bar per file: generating the KV cache (blocks), writing it, reading it back (MiB).
                ProgressBar bar(0, !opt->quiet, stderr);
                StepProgress fill_progress(bar, "", "blocks");
                StepProgress transfer_progress(bar, "", "MiB");
                GenOptions file_options = gen;
                file_options.provenance = {{"preset", preset_names[p]}, {"generator_command", command}};
                file_options.progress = &fill_progress;

                const auto start = std::chrono::steady_clock::now();
                {
                  BatchFile file = generate_batch(layers[p], mix, file_options);
                  if (!opt->mm_prefix.empty()) {
                    file.batch.mm_prefix_range = parse_mm_prefix(opt->mm_prefix, file.batch.num_reqs());
                  }
                  // The rank files are cut before anything is written: a step that does not split writes nothing.
                  std::vector<BatchFile> rank_files;
                  for (int64_t r = 0; r < opt->tp && opt->tp > 1; ++r) {
                    rank_files.push_back(spec::shard_batch_file(file, spec::tp_shard(file.config, opt->tp, r)));
                  }
                  try {
                    write_batch_file(path, file, FileProgress{&transfer_progress});
                    for (size_t r = 0; r < rank_files.size(); ++r) {
                      const std::string rank_path = spec::tp_rank_file_path(path, opt->tp, static_cast<int64_t>(r));
                      write_batch_file(rank_path, rank_files[r]);
                      (void)read_batch_file(rank_path);  // the reader validates what was written
                      if (!opt->quiet) std::cout << "wrote " << rank_path << ": rank " << r << " of " << opt->tp << "\n";
                    }
                  } catch (const Error& e) {
                    bar.clear();
                    std::cerr << "hybridtb gen: error: " << e.what() << "\n";
                    return 1;
                  }
                }  // freed before the check
                // The reader validates what was written.
                const BatchFile check = read_batch_file(path, FileProgress{&transfer_progress});
                bar.clear();
                const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                if (!opt->quiet) {
                  const BatchDescription& b = check.batch;
                  const AttentionConfig& c = check.config;
                  std::cout << "wrote " << path << ": " << preset_names[p] << " " << mix_name << ", " << b.num_reqs()
                            << " requests, " << b.num_actual_tokens << " tokens";
                  if (b.num_tokens() != b.num_actual_tokens) std::cout << " (padded to " << b.num_tokens() << ")";
                  if (c.is_linear_layer()) {  // no KV cache: the model's attention layers hold it
                    std::cout << ", " << to_string(c.layer_kind) << " layer, " << to_string(c.dtype);
                  } else {
                    std::cout << ", " << (c.attn_type == AttnType::kDecoder ? check.inputs.kv_cache.size(0) : 0)
                              << " KV blocks, " << to_string(c.dtype) << "/" << to_string(c.kv_cache_dtype);
                  }
                  std::cout << ", ssm " << c.ssm_mode << ", " << human_bytes(check.inputs.nbytes()) << ", " << std::fixed
                            << std::setprecision(2) << seconds << " s\n";
                }
              }
            }
            return 0;
           } catch (const Error& e) {  // a bad mix, preset, setting or combination: nothing was written
             std::cerr << "hybridtb gen: error: " << e.what() << "\n";
             return 2;
           }
          }};
}

}  // namespace hybridtb::cli
