// hybridtb_bench --suite experiments/suites/quick.json [--out R.json] [--benchmark_filter=...]
//
// The benchmark suite: every case of a suite file (suite.h) on every backend it lists, through the
// common Backend interface, with Google Benchmark doing registration, filtering and repetitions,
// and this program printing the console (one compact row per benchmark: CollectingReporter). Per
// case the batch is built in memory by the same generator as `hybridtb gen` (make_layer +
// parse_mix + generate_batch, same seed), so a case name is also its repro command (--repro).
// What is timed per iteration is one step: write_kv_cache + hybrid_forward (a linear-attention
// layer, layer_kind gdn / mamba2: linear_attention_forward), with the SSM add fused into the
// attention epilogues ("fused") or as a separate pass ("two_kernel", hybrid layers only:
// BackendSettings::fuse_hybrid_add off), or the step captured once as a CUDA graph and replayed
// with its metadata re-uploaded ("graph": decode steps; --cuda-graph adds it to GPU cases);
// build_metadata, uploads, the restore of the mutated state (the SSM pools, from copies on the
// backend's device; the KV writes repeat the same bits) and the L2 flush happen outside the timed
// region.
//   reference: process CPU time (all its threads; Google Benchmark's, paused around the restore);
//   cuda:      CUDA events on the backend's stream (Backend::native_stream) + UseManualTime, the
//              stream held by a gate kernel while the step is enqueued (nvbench's blocking kernel):
//              the time is the step's GPU work back to back; "latency" adds the host enqueue
//              (planning, uploads, launches) — what a CUDA graph shortens. Warm-up, L2 flushed
//              before every iteration, SM clock sampled around every repetition (a repetition below
//              --throttle-threshold of the maximum clock is flagged "throttled").
// Counters (tokens/s, bytes, FLOPs: hybridtb/perf_model.h), achieved GB/s and TFLOP/s and the
// percentage of the ceilings measured in this run go to the results JSON (schema in
// experiments/README.md), written to <date>_<gpu-or-cpu>_<commit>.json in the current directory
// unless --out says otherwise. --shard I/N keeps shard I of N of the suite's cases (round-robin over
// the case names sorted: the k-th name goes to shard k mod N; every backend and path of a case stays
// in its shard) and records the shard in environment.shard, so that N runs on N GPUs or hosts are
// joined into one results file by harness/scripts/merge-shards.py. Exit status: 0 every case ran or
// was skipped with a reason, 1 a case failed, 2 usage error or bad suite (a bad --shard included),
// 3 a backend named by --backend has no device here.
#include <benchmark/benchmark.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <Eigen/Core>

#include "hybridtb/backend.h"
#include "hybridtb/error.h"
#include "hybridtb/mix.h"
#include "hybridtb/perf_model.h"
#include "hybridtb/revision.h"
#include "hybridtb/presets.h"
#include "hybridtb/step.h"
#include "src/gpu_timing.h"
#include "src/results.h"
#include "src/suite.h"

namespace hybridtb::bench {
namespace {

struct Options {
  std::string suite_path;
  std::string out_path;
  bool no_out = false;
  std::vector<std::string> backends;  // empty: every backend the suite lists
  int repetitions = 0;                // > 0 overrides the suite
  double min_time_s = 0;              // > 0 overrides the suite
  double throttle_threshold = 0.9;
  bool no_flush = false;
  bool no_ceilings = false;
  bool cuda_graph = false;
  bool list = false;
  std::string repro;
  std::string color = "auto";  // auto: colour the console only when stdout is a terminal
  std::string shard;           // "I/N": only shard I of N of the suite's cases (empty: all of them)
};

// ------------------------------------------------------------------------------------------------
// Sharding: shard I of N of a suite's cases, for runs spread over GPUs or hosts.

struct ShardSpec {
  int64_t index = 0;
  int64_t count = 0;  // 0: not sharded
};

// "I/N" → the spec, or an error naming --shard and the constraint: two whole numbers (at most 6
// digits each), N >= 1, 0 <= I < N.
std::optional<ShardSpec> parse_shard(const std::string& text, std::string* error) {
  const std::regex form("^([0-9]{1,6})/([0-9]{1,6})$");
  std::smatch m;
  if (!std::regex_match(text, m, form)) {
    *error = "--shard must be I/N, two whole numbers of at most 6 digits with 0 <= I < N (got '" + text + "')";
    return std::nullopt;
  }
  ShardSpec spec{std::stoll(m[1].str()), std::stoll(m[2].str())};
  if (spec.count < 1) {
    *error = "--shard I/N needs N >= 1 shards (got '" + text + "')";
    return std::nullopt;
  }
  if (spec.index >= spec.count) {
    *error = "--shard I/N needs 0 <= I < N: shard " + std::to_string(spec.index) + " does not exist among " +
             std::to_string(spec.count) + " (got '" + text + "')";
    return std::nullopt;
  }
  return spec;
}

// The positions (in suite order) of the cases of shard `spec`: round-robin over the case names
// sorted, the k-th name going to shard k mod N. A suite lists a group's cases together (decode
// batch 1/8/64/256 × context 1k/8k/32k, ...) and sorted names keep similar cases next to each
// other, so the expensive ones are dealt across the shards; shard sizes differ by at most one.
std::vector<size_t> shard_positions(const std::vector<SuiteCase>& cases, const ShardSpec& spec) {
  std::vector<size_t> by_name(cases.size());
  for (size_t k = 0; k < cases.size(); ++k) by_name[k] = k;
  std::stable_sort(by_name.begin(), by_name.end(),
                   [&](size_t a, size_t b) { return cases[a].name < cases[b].name; });
  std::vector<size_t> mine;
  for (size_t rank = 0; rank < by_name.size(); ++rank) {
    if (static_cast<int64_t>(rank % static_cast<size_t>(spec.count)) == spec.index) mine.push_back(by_name[rank]);
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

// FNV-1a (64 bit) of the case names joined by newlines, as "fnv1a64:<16 hex digits>": shards of one
// suite carry the same digest (merge-shards.py refuses to join shards whose digests differ).
std::string case_list_digest(const std::vector<SuiteCase>& cases) {
  uint64_t h = 0xcbf29ce484222325ULL;
  auto add = [&h](unsigned char byte) {
    h ^= byte;
    h *= 0x100000001b3ULL;
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    if (k > 0) add('\n');
    for (const char ch : cases[k].name) add(static_cast<unsigned char>(ch));
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "fnv1a64:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// ------------------------------------------------------------------------------------------------
// The environment a result must carry.

std::string utc_now(const char* format) {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char buf[64];
  std::strftime(buf, sizeof buf, format, std::gmtime(&now));
  return buf;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

// "NVIDIA H200" → "h200", for file names.
std::string short_device_name(const std::string& name) {
  std::string word;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == ' ') {
      if (!word.empty() && word != "NVIDIA") break;
      word.clear();
    } else {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(name[i])));
    }
  }
  return word.empty() ? "gpu" : word;
}

// The 1-minute load average (/proc/loadavg), or -1 where there is none: CPU times of a run on a
// machine busy with other work include waiting for it (hybridtb_bench_compare warns about that).
double load_average() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  return in >> load ? load : -1.0;
}

// ------------------------------------------------------------------------------------------------
// Host ceilings for the reference's roofline: memcpy bandwidth (read + write counted) and an fp64
// Eigen GEMM (the reference computes in float64), both single-threaded as the reference runs.

struct HostCeilings {
  double copy_GBps = 0;
  double fp64_gemm_GFLOPs = 0;
};

HostCeilings measure_host_ceilings() {
  HostCeilings c;
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> times;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    a[static_cast<size_t>(r)] = b[bytes - 1];
  }
  c.copy_GBps = 2.0 * static_cast<double>(bytes) / compute_stats(times).median / 1e9;
  const int n = 512;
  Eigen::MatrixXd x = Eigen::MatrixXd::Random(n, n), y = Eigen::MatrixXd::Random(n, n), z(n, n);
  times.clear();
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    z.noalias() = x * y;
    benchmark::DoNotOptimize(z.data());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  c.fp64_gemm_GFLOPs = 2.0 * n * static_cast<double>(n) * n / compute_stats(times).median / 1e9;
  return c;
}

// ------------------------------------------------------------------------------------------------
// One benchmark = case × backend × path.

struct Bench {
  std::string name;  // "<backend>/<path>/<case name>", the Google Benchmark name
  const SuiteCase* c = nullptr;
  std::string backend;
  std::string path;
  bool gpu = false;
  int repetitions = 1;
  // Filled while it runs:
  std::string status = "not-run";  // ok | skipped | error | not-run (filtered out)
  std::string reason;
  std::vector<double> times_s;       // per repetition: the timed metric per iteration
  std::vector<double> real_times_s;  // per repetition: wall (or manual) time per iteration
  std::vector<int64_t> iterations;
  std::vector<double> latency_times_s;  // GPU, per repetition: mean host enqueue + GPU time per step
  int64_t gate_timeouts = 0;            // GPU iterations whose gate timed out (see StepTimer)
  bool shown = false;                   // its console row has been printed
  double sm_clock_min_mhz = 0;
  std::optional<StepCost> cost;
};

// The batch of the case that runs now (benchmarks of one case are registered together, so each
// batch is generated once and freed when the next case starts).
struct CaseData {
  std::string name;
  BatchFile file;
  StepCost cost;
};

// A prepared benchmark: the backend, its copies of the inputs, the output buffers, the plan.
struct Prepared {
  std::string bench;
  std::unique_ptr<Backend> backend;
  HybridMetadata metadata;
  std::optional<LayerBuffers> buffers;  // the inputs in the backend's memory and the output buffers
  std::unique_ptr<StepGraph> graph;  // path "graph": the captured step
  std::map<std::string, Tensor> pristine_pools;  // the state pools before the step, on the backend
  std::unique_ptr<gpu::StepTimer> timer;
  std::string skip;  // non-empty: skip every repetition with this reason
};

struct Runner {
  Options options;
  Suite suite;
  std::vector<std::unique_ptr<Bench>> benches;
  std::shared_ptr<CaseData> current_case;
  std::unique_ptr<Prepared> prepared;
  std::unique_ptr<gpu::L2Flusher> flusher;
  bool have_gpu = false;
  std::string no_gpu_reason;
  int max_sm_clock_mhz = 0;
  bool any_error = false;

  std::shared_ptr<CaseData> case_data(const SuiteCase& c) {
    if (current_case && current_case->name == c.name) return current_case;
    prepared.reset();
    current_case.reset();  // free the previous batch before generating the next
    auto data = std::make_shared<CaseData>();
    data->name = c.name;
    GenOptions gen;
    gen.seed = c.seed;
    data->file = generate_batch(make_layer(c.preset, c.settings), parse_mix(c.mix), gen);
    data->cost = step_cost(data->file.config, data->file.batch, data->file.inputs);
    current_case = data;
    return data;
  }

  // Puts back what a step mutates, outside the timed region: the state pools, which a step reads
  // and writes in place, from copies on the backend's own device (a device-to-device copy, not the
  // host upload it replaces). The KV cache and its scales are not restored: the rows a step writes
  // are a function of its inputs alone, so every repetition writes the same bits into the same slots
  // and reads the same attention (step_restore_test).
  void restore(Prepared& p) {
    Backend& b = *p.backend;
    for (const auto& [name, pool] : p.pristine_pools) b.copy(p.buffers->device.ssm_state.at(name), pool);
    b.synchronize();
  }

  // One step; fused and two_kernel differ in the backend's settings (prepare()).
  void run_step(Prepared& p, const BatchFile& file) {
    if (p.graph) {
      p.graph->replay(p.metadata, file.batch);
      return;
    }
    p.buffers->run(*p.backend, p.metadata, file.batch);  // by the layer's kind (hybridtb/step.h)
  }

  // Creates the backend, uploads, builds the metadata and runs two untimed warm-up steps; records
  // a skip reason instead when the backend cannot run this case.
  std::unique_ptr<Prepared> prepare(const Bench& bench, const CaseData& data) {
    auto p = std::make_unique<Prepared>();
    p->bench = bench.name;
    const BatchFile& file = data.file;
    try {
      p->backend = create_backend(bench.backend, {file.config, file.builder, bench.path != "two_kernel"});
    } catch (const NotSupported& e) {
      p->skip = std::string("not supported: ") + e.what();
      return p;
    }
    Backend& b = *p->backend;
    p->metadata = b.build_metadata(file.batch);  // the plan: never timed
    if (file.config.is_linear_layer() && bench.path == "graph") {
      p->skip = "a linear-attention layer is captured with the whole model step through the CUDA-graph hooks "
                "(hybridtb_bench_per_layer), not as one layer's step";
      return p;
    }
    p->buffers.emplace(b, file);

    for (const auto& [name, pool] : p->buffers->device.ssm_state) {
      Tensor copy = b.allocate(pool.dtype(), pool.shape());
      b.copy(copy.view(), pool);
      p->pristine_pools.emplace(name, std::move(copy));
    }
    if (bench.gpu) p->timer = std::make_unique<gpu::StepTimer>(b.native_stream());
    try {
      if (bench.path == "graph") {
        p->graph = b.capture_decode_step(p->metadata, file.batch, p->buffers->views(), p->buffers->outputs());
      }
      for (int w = 0; w < (bench.gpu ? 2 : 1); ++w) {
        restore(*p);
        run_step(*p, file);
        b.synchronize();
      }
    } catch (const NotSupported& e) {
      p->skip = std::string("not supported: ") + e.what();
    }
    return p;
  }

  // Why `bench` cannot run here, or "" (checked before any batch is generated).
  std::string static_skip_reason(const Bench& bench) {
    if (!BackendRegistry::instance().contains(bench.backend)) {
      return "backend '" + bench.backend + "' is not in this build" +
             (bench.backend == "cuda" ? " (built without CUDA)" : "");
    }
    if (bench.gpu && !have_gpu) return no_gpu_reason;
    if (bench.path == "graph" && !bench.gpu) return "CUDA-graph timing needs a GPU backend";
    if (bench.backend == "reference") {
      // The reference's cost from the requests alone, without generating the batch.
      const SuiteCase& c = *bench.c;
      const Layer layer = make_layer(c.preset, c.settings);
      BatchDescription desc;
      std::vector<int32_t> qsl{0}, seq;
      for (const RequestSpec& r : mix_requests(parse_mix(c.mix))) {
        qsl.push_back(static_cast<int32_t>(qsl.back() + r.query_len));
        seq.push_back(static_cast<int32_t>(r.context_len + r.query_len));
      }
      desc.query_start_loc = IntArray::vector(qsl);
      desc.seq_lens = IntArray::vector(seq);
      desc.num_actual_tokens = qsl.back();
      const double gflop = step_cost(layer.attention, desc, BatchInputs{}).flops() / 1e9;
      if (gflop > suite.reference_max_gflop) {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "over the reference budget: %.1f GFLOP > reference_max_gflop %.1f (the float64 reference "
                      "runs at a few GFLOP/s; time this case on a GPU backend)",
                      gflop, suite.reference_max_gflop);
        return buf;
      }
    }
    return "";
  }

  void run(benchmark::State& state, Bench& bench) {
    try {
      if (std::string why = static_skip_reason(bench); !why.empty()) {
        bench.status = "skipped";
        bench.reason = why;
        state.SkipWithError(("skipped: " + why).c_str());
        return;
      }
      const auto data = case_data(*bench.c);
      if (!prepared || prepared->bench != bench.name) {
        prepared.reset();
        prepared = prepare(bench, *data);
      }
      Prepared& p = *prepared;
      bench.cost = data->cost;
      if (!p.skip.empty()) {
        bench.status = "skipped";
        bench.reason = p.skip;
        state.SkipWithError(("skipped: " + p.skip).c_str());
        return;
      }
      const BatchFile& file = data->file;
      double clock_min = 0;
      if (bench.gpu) {
        if (!flusher && !options.no_flush) flusher = std::make_unique<gpu::L2Flusher>();
        clock_min = gpu::measure_sm_clock_mhz();
        double latency_sum = 0;
        int64_t steps = 0;
        for (auto _ : state) {
          restore(p);
          if (flusher) flusher->flush();
          p.timer->start();
          run_step(p, file);
          state.SetIterationTime(p.timer->stop_seconds());
          latency_sum += p.timer->last_latency_seconds();
          bench.gate_timeouts += p.timer->last_gate_timed_out() ? 1 : 0;
          ++steps;
        }
        if (steps > 0) bench.latency_times_s.push_back(latency_sum / static_cast<double>(steps));
        // Right after the timed loop the clocks are at their loaded level.
        const double after = gpu::measure_sm_clock_mhz();
        clock_min = clock_min > 0 && after > 0 ? std::min(clock_min, after) : std::max(clock_min, after);
        state.counters["sm_MHz"] = clock_min;
        if (clock_min > 0 && (bench.sm_clock_min_mhz == 0 || clock_min < bench.sm_clock_min_mhz)) {
          bench.sm_clock_min_mhz = clock_min;
        }
      } else {
        for (auto _ : state) {
          state.PauseTiming();
          restore(p);
          state.ResumeTiming();
          run_step(p, file);
        }
      }
      const StepCost& cost = data->cost;
      using benchmark::Counter;
      state.counters["tok/s"] = Counter(static_cast<double>(cost.tokens), Counter::kIsIterationInvariantRate);
      state.counters["B/s"] = Counter(cost.bytes(), Counter::kIsIterationInvariantRate);
      state.counters["FLOP/s"] = Counter(cost.flops(), Counter::kIsIterationInvariantRate);
      bench.status = "ok";
    } catch (const std::exception& e) {
      bench.status = "error";
      bench.reason = e.what();
      any_error = true;
      prepared.reset();
      state.SkipWithError(("error: " + std::string(e.what())).c_str());
    }
  }
};

// The console and the collection of per-repetition times (by registered name). Google Benchmark's
// own console line per repetition and aggregate runs to hundreds of characters (every counter,
// colour codes even when redirected); this reporter prints one compact row per benchmark once
// all its repetitions are in (print_row), and nothing of the library's context block.
class CollectingReporter : public benchmark::BenchmarkReporter {
 public:
  CollectingReporter(std::map<std::string, Bench*> by_name, std::function<void(Bench&)> print_row)
      : by_name_(std::move(by_name)), print_row_(std::move(print_row)) {}

  // The library's context block ends with "***WARNING*** Library was built as DEBUG" when the
  // installed libbenchmark was compiled without NDEBUG (Debian's and Ubuntu's package is: CMake
  // build type "None"). Recorded here; main_impl prints its own note once.
  bool ReportContext(const Context& context) override {
    std::ostringstream block;
    PrintBasicContext(&block, context);
    library_debug_ = block.str().find("built as DEBUG") != std::string::npos;
    return true;
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      const auto it = by_name_.find(run.run_name.function_name);
      if (it == by_name_.end()) continue;
      Bench& b = *it->second;
      if (run.run_type == Run::RT_Iteration && b.status == "ok" && run.iterations > 0) {
        const double iters = static_cast<double>(run.iterations);
        const double real = run.real_accumulated_time / iters;
        const double cpu = run.cpu_accumulated_time / iters;
        b.times_s.push_back(b.gpu ? real : cpu);
        b.real_times_s.push_back(real);
        b.iterations.push_back(run.iterations);
      }
      const bool complete = b.status == "ok" ? static_cast<int>(b.times_s.size()) >= b.repetitions
                                             : b.status != "not-run";
      if (complete && !b.shown) {
        print_row_(b);
        b.shown = true;
      }
    }
  }

  bool library_debug() const { return library_debug_; }

 private:
  std::map<std::string, Bench*> by_name_;
  std::function<void(Bench&)> print_row_;
  bool library_debug_ = false;
};

// "12.3 us", "4.56 ms", "1.23 s": three significant figures in a fixed-width cell.
std::string format_seconds(double s) {
  char buf[32];
  if (!(s > 0)) return "-";
  if (s < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  } else if (s < 1) {
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  }
  return buf;
}

// The console table: one row per benchmark, at most 121 columns (a skip reason or a flag may run
// longer). Names are shortened (short_bench_name); --list prints the full ones, the results JSON
// has them with the repro command.
constexpr size_t kNameWidth = 64;

void print_header() {
  std::printf("%-*s %-7s %9s %9s %5s %8s %7s %5s\n", static_cast<int>(kNameWidth), "benchmark (short name)", "status",
              "median", "latency", "iqr%", "GB/s", "TFLOP/s", "%roof");
}

void print_row(const Bench& b, const nlohmann::json& j, bool colour) {
  const std::string name = short_bench_name(b.name, kNameWidth);
  const char* on = !colour ? "" : b.status == "ok" ? "\033[32m" : b.status == "skipped" ? "\033[33m" : "\033[31m";
  const char* off = colour ? "\033[0m" : "";
  if (b.status != "ok") {
    // The reason up to its explanation in parentheses, at most 70 characters (all of it: the JSON).
    std::string reason = b.reason.substr(0, b.reason.find(" ("));
    if (reason.size() > 70) reason = reason.substr(0, 67) + "...";
    std::printf("%-*s %s%-7s%s %s\n", static_cast<int>(kNameWidth), name.c_str(), on, b.status.c_str(), off,
                reason.c_str());
  } else {
    const double median = j.value("median_s", 0.0);
    std::printf("%-*s %s%-7s%s %9s %9s %5.1f %8.2f %7.3f %5.1f%s%s\n", static_cast<int>(kNameWidth), name.c_str(), on,
                "ok", off, format_seconds(median).c_str(),
                b.gpu ? format_seconds(j.value("latency_median_s", 0.0)).c_str() : "-", j.value("rel_iqr", 0.0) * 100,
                j.value("GBps", 0.0), j.value("TFLOPs", 0.0), j.value("pct_of_roofline", 0.0),
                j.value("throttled", false) ? "  [throttled]" : "",
                j.value("gate_timeouts", 0) > 0 ? "  [gate timed out: the time includes host waits]" : "");
  }
  std::fflush(stdout);
}

nlohmann::json case_json(const Bench& b, const nlohmann::json& ceilings, const Runner& runner) {
  const SuiteCase& c = *b.c;
  nlohmann::json j;
  j["name"] = c.name;
  j["backend"] = b.backend;
  j["path"] = b.path;
  j["group"] = c.group;
  j["preset"] = c.preset;
  j["mix"] = c.mix;
  j["settings"] = c.settings;
  j["seed"] = c.seed;
  const std::string file = "case.h5";
  j["repro"] = c.gen_command(file) + " && " + SuiteCase::parity_command(file, b.backend == "reference" ? "cuda" : b.backend);
  j["status"] = b.status;
  if (!b.reason.empty()) j["reason"] = b.reason;
  j["timing"] = b.gpu ? "cuda_events" : "cpu_time";
  if (b.cost) {
    const StepCost& k = *b.cost;
    j["tokens"] = k.tokens;
    j["requests"] = k.requests;
    j["attention_pairs"] = k.attention_pairs;
    j["bytes"] = k.bytes();
    j["flops"] = k.flops();
    j["arithmetic_intensity"] = k.arithmetic_intensity();
    j["ssm_flops_known"] = k.ssm_flops_known;
    j["bytes_breakdown"] = {{"kv_read", k.kv_read_bytes}, {"kv_write", k.kv_write_bytes}, {"qo", k.qo_bytes},
                            {"block_table", k.block_table_bytes}, {"ssm", k.ssm_bytes}};
    j["flops_breakdown"] = {{"attention", k.attention_flops}, {"ssm", k.ssm_flops}};
  }
  if (b.status != "ok" || b.times_s.empty()) return j;
  const SampleStats s = compute_stats(b.times_s);
  j["repetitions"] = s.count;
  j["iterations"] = b.iterations;
  j["times_s"] = b.times_s;
  j["real_times_s"] = b.real_times_s;
  j["median_s"] = s.median;
  j["q1_s"] = s.q1;
  j["q3_s"] = s.q3;
  j["min_s"] = s.min;
  j["max_s"] = s.max;
  j["mean_s"] = s.mean;
  j["stddev_s"] = s.stddev;
  j["rel_iqr"] = s.rel_iqr();
  if (b.cost && s.median > 0) {
    const StepCost& k = *b.cost;
    const double gbps = k.bytes() / s.median / 1e9;
    const double tflops = k.flops() / s.median / 1e12;
    j["tokens_per_s"] = static_cast<double>(k.tokens) / s.median;
    j["GBps"] = gbps;
    j["TFLOPs"] = tflops;
    // The ceilings of this case's device, measured in this run.
    const bool gpu = b.gpu;
    const nlohmann::json set = gpu ? ceilings.value("device", nlohmann::json()) : ceilings.value("host", nlohmann::json());
    if (set.is_object()) {
      const double bw = gpu ? set.value("read_GBps", 0.0) : set.value("copy_GBps", 0.0);
      const double fl = gpu ? set.value("bf16_gemm_TFLOPs", 0.0) : set.value("fp64_gemm_GFLOPs", 0.0) / 1e3;
      j["ceiling_bandwidth_GBps"] = bw;
      j["ceiling_TFLOPs"] = fl;
      if (bw > 0) j["pct_of_bandwidth"] = 100.0 * gbps / bw;
      if (gpu && set.value("copy_GBps", 0.0) > 0) j["pct_of_copy_bandwidth"] = 100.0 * gbps / set.value("copy_GBps", 0.0);
      if (fl > 0) j["pct_of_compute"] = 100.0 * tflops / fl;
      if (bw > 0 && fl > 0) {
        // Roofline bound: the time the step needs at the ceilings, over the time it took.
        const double bound = std::max(k.bytes() / (bw * 1e9), k.flops() / (fl * 1e12));
        j["pct_of_roofline"] = 100.0 * bound / s.median;
      }
    }
  }
  if (b.gpu && !b.latency_times_s.empty()) {
    const SampleStats l = compute_stats(b.latency_times_s);
    j["latency_times_s"] = b.latency_times_s;
    j["latency_median_s"] = l.median;
    j["latency_rel_iqr"] = l.rel_iqr();
    j["gate_timeouts"] = b.gate_timeouts;
  }
  if (b.gpu) {
    j["sm_clock_min_mhz"] = b.sm_clock_min_mhz;
    j["throttled"] = b.sm_clock_min_mhz > 0 && runner.max_sm_clock_mhz > 0 &&
                     b.sm_clock_min_mhz < runner.options.throttle_threshold * runner.max_sm_clock_mhz;
  } else {
    j["throttled"] = false;
  }
  return j;
}

// What --help adds after our options: Google Benchmark's flags pass through.
constexpr const char* kBenchmarkFlagsHelp =
    "\nGoogle Benchmark's own --benchmark_* flags are accepted too and passed to it, e.g.\n"
    "  --benchmark_filter=REGEX                 run only the benchmarks whose full name (--list) matches\n"
    "  --benchmark_out=F --benchmark_out_format=json   also write Google Benchmark's own JSON\n"
    "  --benchmark_list_tests                   list the benchmarks as Google Benchmark sees them\n"
    "(the suite's repetitions and min_time_s are set per benchmark: change them with --repetitions and\n"
    "--min-time, not --benchmark_repetitions / --benchmark_min_time)\n"
    "--help-benchmark lists all of them. The console is this program's table (--benchmark_format and\n"
    "--benchmark_color do not change it; --color does).\n";

int main_impl(int argc, char** argv) {
  Runner runner;
  Options& o = runner.options;
  CLI::App app{"hybridtb_bench: the benchmark suite (experiments/README.md).\n"
               "Exit status: 0 every case ran or was skipped with a reason, 1 a case failed, 2 usage error, 3 a "
               "backend named by --backend has no device on this machine."};
  app.name("hybridtb_bench");
  app.add_option("--suite", o.suite_path, "Suite file (experiments/suites/*.json)")->required();
  app.add_option("--out", o.out_path,
                 "Results JSON (default <date>_<gpu-or-cpu>_<commit>.json in the current directory)");
  app.add_flag("--no-out", o.no_out, "Write no results file");
  app.add_option("--backend", o.backends, "Only these backends (repeatable; default: the suite's)");
  app.add_option("--repetitions", o.repetitions, "Override the suite's repetitions")->check(CLI::PositiveNumber);
  app.add_option("--min-time", o.min_time_s, "Override the suite's min_time_s (seconds of timed work per repetition)")
      ->check(CLI::PositiveNumber);
  app.add_option("--throttle-threshold", o.throttle_threshold,
                 "Flag a GPU case whose SM clock fell below this fraction of the maximum (default 0.9)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--no-l2-flush", o.no_flush, "Do not flush the L2 before each timed GPU step (hot-cache timing)");
  app.add_flag("--no-ceilings", o.no_ceilings, "Skip measuring the ceilings (no % of ceiling counters)");
  app.add_flag("--cuda-graph", o.cuda_graph,
               "Also time each GPU case as a replayed CUDA graph (path 'graph'; decode steps only, others skipped "
               "with the reason)");
  app.add_flag("--list", o.list, "List the benchmarks (full names) and exit");
  app.add_option("--repro", o.repro, "Print the gen + parity commands of the cases matching REGEX and exit");
  app.add_option("--shard", o.shard,
                 "Run only shard I of N of the suite's cases (I/N, 0 <= I < N; round-robin over the sorted case "
                 "names); harness/scripts/merge-shards.py joins the N results files");
  app.add_option("--color", o.color,
                 "Colour the console status column: auto (when stdout is a terminal), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  bool help_benchmark = false;  // answered before parsing (below); declared so that --help lists it
  app.add_flag("--help-benchmark", help_benchmark, "Show Google Benchmark's own flags and exit");
  app.footer(kBenchmarkFlagsHelp);
  // benchmark::Initialize answers --help itself with the library's flags only and exits, so the
  // help flags are looked for first (before a "--" that ends the options).
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::cout << app.help();
      return 0;
    }
    if (std::strcmp(argv[i], "--help-benchmark") == 0) {
      benchmark::PrintDefaultHelp();
      return 0;
    }
  }
  // Google Benchmark's filter, recorded with a shard (shards run with different filters do not merge).
  std::string benchmark_filter;
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strncmp(argv[i], "--benchmark_filter=", 19) == 0) benchmark_filter = argv[i] + 19;
  }
  benchmark::Initialize(&argc, argv);  // strips the --benchmark_* flags, leaves ours
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  ShardSpec shard;
  if (app.count("--shard") > 0) {
    std::string error;
    const std::optional<ShardSpec> spec = parse_shard(o.shard, &error);
    if (!spec) {
      std::cerr << "hybridtb_bench: error: " << error << "\n";
      return 2;
    }
    shard = *spec;
  }
  const char* no_color = std::getenv("NO_COLOR");
  const bool colour = o.color == "always" ||
                      (o.color == "auto" && isatty(fileno(stdout)) && !(no_color && *no_color) &&
                       std::string(std::getenv("TERM") ? std::getenv("TERM") : "dumb") != "dumb");
  try {
    runner.suite = load_suite(o.suite_path);
  } catch (const Error& e) {
    std::cerr << "hybridtb_bench: error: " << e.what() << "\n";
    return 2;
  }
  // A shard keeps its cases (in suite order) and records which they are among all of the suite's.
  nlohmann::json shard_json;
  if (shard.count > 0) {
    const std::vector<size_t> positions = shard_positions(runner.suite.cases, shard);
    std::vector<SuiteCase> kept;
    nlohmann::json names = nlohmann::json::array();
    for (const size_t k : positions) {
      kept.push_back(runner.suite.cases[k]);
      names.push_back(runner.suite.cases[k].name);
    }
    nlohmann::json backends = o.backends;
    shard_json = {{"index", shard.index},
                  {"count", shard.count},
                  {"rule", "round-robin over the case names sorted: the k-th name goes to shard k mod count"},
                  {"case_ids", names},
                  {"case_indices", positions},
                  {"total_cases", runner.suite.cases.size()},
                  {"case_list_digest", case_list_digest(runner.suite.cases)},
                  {"selection", {{"backends", backends},
                                 {"benchmark_filter", benchmark_filter},
                                 {"cuda_graph", o.cuda_graph},
                                 {"repetitions", o.repetitions},
                                 {"min_time_s", o.min_time_s},
                                 {"l2_flush", !o.no_flush}}}};
    std::cerr << "hybridtb_bench: shard " << shard.index << "/" << shard.count << ": " << kept.size() << " of "
              << runner.suite.cases.size() << " cases\n";
    runner.suite.cases = std::move(kept);
  }
  const Suite& suite = runner.suite;
  if (!o.repro.empty()) {
    const std::regex re(o.repro);
    for (const SuiteCase& c : suite.cases) {
      if (!std::regex_search(c.name, re)) continue;
      std::cout << "# " << c.name << "\n" << c.gen_command("case.h5") << "\n"
                << SuiteCase::parity_command("case.h5", "cuda") << "\n";
    }
    return 0;
  }
  register_builtin_backends();
  runner.have_gpu = gpu::available(&runner.no_gpu_reason);
  // A backend asked for by name whose device is absent: say so and stop, rather than "0 ok, N skipped".
  for (const std::string& name : o.backends) {
    const BackendRegistry& registry = BackendRegistry::instance();
    if (!registry.contains(name)) continue;  // unknown names are reported with the suite's cases
    if (const std::string reason = registry.unavailable_reason(name); !reason.empty()) {
      std::cerr << "hybridtb_bench: backend '" << name << "' is not available on this machine: " << reason << "\n";
      return 3;
    }
  }

  std::map<std::string, Bench*> by_name;
  for (const SuiteCase& c : suite.cases) {
    for (const std::string& backend : c.backends) {
      if (!o.backends.empty() && std::find(o.backends.begin(), o.backends.end(), backend) == o.backends.end()) continue;
      std::vector<std::string> paths = c.paths;
      if (o.cuda_graph && backend != "reference" && std::find(paths.begin(), paths.end(), "graph") == paths.end()) {
        paths.push_back("graph");
      }
      for (const std::string& path : paths) {
        auto b = std::make_unique<Bench>();
        b->c = &c;
        b->backend = backend;
        b->path = path;
        b->name = backend + "/" + path + "/" + c.name;
        // Any backend whose memory is not the host is timed with CUDA events (only "cuda" today).
        b->gpu = backend != "reference";
        b->repetitions = o.repetitions > 0 ? o.repetitions
                         : backend == "reference" ? std::min(c.repetitions, suite.reference_repetitions)
                                                  : c.repetitions;
        by_name[b->name] = b.get();
        runner.benches.push_back(std::move(b));
      }
    }
  }
  if (o.list) {
    for (const auto& b : runner.benches) std::cout << b->name << "\n";
    return 0;
  }

  // Environment and ceilings, once per run, before any case allocates.
  nlohmann::json env = {{"commit", source_revision().label()},
                        {"build_type", HYBRIDTB_BUILD_TYPE},
                        {"date_utc", utc_now("%Y-%m-%dT%H:%M:%SZ")},
                        {"cpu_model", cpu_model()},
                        {"cpu_threads", std::thread::hardware_concurrency()},
                        {"load_average_start", load_average()},
                        {"suite", suite.name},
                        {"suite_file", suite.path},
                        {"l2_flush", !o.no_flush},
                        {"gpu_timing", "CUDA events on the backend's stream behind a gate kernel released after the "
                                       "step is enqueued: GPU time; latency_* adds the host enqueue"},
                        {"throttle_threshold", o.throttle_threshold},
                        {"gpu", nullptr}};
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  env["command"] = command;
  nlohmann::json ceilings = nlohmann::json::object();
  if (runner.have_gpu) {
    const gpu::DeviceInfo info = gpu::device_info();
    runner.max_sm_clock_mhz = info.max_sm_clock_mhz;
    env["gpu"] = {{"name", info.name}, {"sms", info.sms}, {"memory_bytes", info.memory_bytes},
                  {"l2_bytes", info.l2_bytes}, {"max_sm_clock_mhz", info.max_sm_clock_mhz},
                  {"max_mem_clock_mhz", info.max_mem_clock_mhz}, {"cuda_driver_version", info.driver_version},
                  {"cuda_runtime_version", info.runtime_version}, {"sm_clock_at_start_mhz", gpu::measure_sm_clock_mhz()}};
    benchmark::AddCustomContext("gpu", info.name);
  } else {
    env["gpu_unavailable"] = runner.no_gpu_reason;
  }
  benchmark::AddCustomContext("commit", source_revision().label());
  benchmark::AddCustomContext("suite", suite.name);
  if (shard.count > 0) {
    env["shard"] = shard_json;
    benchmark::AddCustomContext("shard", std::to_string(shard.index) + "/" + std::to_string(shard.count));
  }
  if (!o.no_ceilings) {
    std::cerr << "hybridtb_bench: measuring the ceilings...\n";
    const HostCeilings host = measure_host_ceilings();
    ceilings["host"] = {{"copy_GBps", host.copy_GBps}, {"fp64_gemm_GFLOPs", host.fp64_gemm_GFLOPs}};
    if (runner.have_gpu) {
      const gpu::Ceilings dev = gpu::measure_ceilings();
      ceilings["device"] = {{"read_GBps", dev.read_GBps}, {"copy_GBps", dev.copy_GBps}, {"bf16_gemm_TFLOPs", dev.gemm_TFLOPs}};
    }
    std::cerr << "hybridtb_bench: ceilings " << ceilings.dump() << "\n";
  }

  for (const auto& bp : runner.benches) {
    Bench* b = bp.get();
    const double min_time = o.min_time_s > 0 ? o.min_time_s : b->c->min_time_s;
    auto* reg = benchmark::RegisterBenchmark(b->name.c_str(), [&runner, b](benchmark::State& st) { runner.run(st, *b); });
    reg->Repetitions(b->repetitions)->MinTime(min_time)->Unit(benchmark::kMicrosecond);
    // The reference runs its attention on several std::threads: the process CPU time (every
    // thread's) is its cost; the default per-thread CPU time would miss the workers.
    if (b->gpu) {
      reg->UseManualTime();
    } else {
      reg->MeasureProcessCPUTime();
    }
  }
  print_header();
  CollectingReporter reporter(by_name, [&](Bench& b) { print_row(b, case_json(b, ceilings, runner), colour); });
  if (runner.benches.empty()) {
    // Possible for a shard of a suite with fewer cases than shards: its results file lists none.
    std::cerr << "hybridtb_bench: no benchmark to run" << (shard.count > 0 ? " in this shard" : "") << "\n";
  } else {
    benchmark::RunSpecifiedBenchmarks(&reporter);
  }
  env["benchmark_library_debug"] = reporter.library_debug();
  env["load_average_end"] = load_average();
  if (reporter.library_debug()) {
    // Google Benchmark's context block would say "***WARNING*** Library was built as DEBUG.
    // Timings may be affected." once per run; this is what that means here.
    std::fprintf(stderr,
                 "hybridtb_bench: note: the installed Google Benchmark library was compiled without NDEBUG (as\n"
                 "  Debian's and Ubuntu's libbenchmark package is), so it calls itself a DEBUG build. It does not\n"
                 "  time the GPU cases: their times are this program's CUDA events (manual time). For the\n"
                 "  reference it reads the process CPU clock around each step; without NDEBUG it only keeps its\n"
                 "  own internal assertions, a cost small beside steps of 0.1 ms and more.\n");
  }
  runner.prepared.reset();
  runner.current_case.reset();
  runner.flusher.reset();

  // Results.
  nlohmann::json results = {{"schema", "hybridtb-bench-results"}, {"version", 1}, {"environment", env},
                            {"ceilings", ceilings}, {"cases", nlohmann::json::array()}};
  int ok = 0, skipped = 0, failed = 0;
  for (const auto& b : runner.benches) {
    if (b->status == "not-run") continue;  // filtered out
    const nlohmann::json j = case_json(*b, ceilings, runner);
    results["cases"].push_back(j);
    if (!b->shown) print_row(*b, j, colour);  // e.g. random interleaving reports repetitions one by one
    b->status == "ok" ? ++ok : b->status == "skipped" ? ++skipped : ++failed;
  }
  std::printf("%d ok, %d skipped, %d failed (full names: --list; every repetition and repro: the results JSON)\n", ok,
              skipped, failed);

  if (!o.no_out) {
    std::string out = o.out_path;
    if (out.empty()) {
      const std::string device = runner.have_gpu ? short_device_name(env["gpu"]["name"].get<std::string>()) : "cpu";
      const std::string stem = utc_now("%Y-%m-%d") + "_" + device + "_" + source_revision().label() +
                               (shard.count > 0 ? ".shard-" + std::to_string(shard.index) + "-of-" +
                                                      std::to_string(shard.count)
                                                : std::string());
      out = stem + ".json";
      for (int n = 2; std::filesystem::exists(out); ++n) out = stem + "-" + std::to_string(n) + ".json";
    }
    const std::filesystem::path parent = std::filesystem::path(out).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    std::ofstream file(out);
    file << results.dump(1) << "\n";
    if (!file) {
      std::cerr << "hybridtb_bench: error: cannot write " << out << "\n";
      return 1;
    }
    std::printf("results: %s\n", out.c_str());
  }
  benchmark::Shutdown();
  return runner.any_error || failed > 0 ? 1 : 0;
}

}  // namespace
}  // namespace hybridtb::bench

int main(int argc, char** argv) {
  try {
    return hybridtb::bench::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "hybridtb_bench: error: " << e.what() << "\n";
    return 1;
  }
}
