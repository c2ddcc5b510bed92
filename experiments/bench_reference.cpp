// bench_reference — CPU cost of the reference backend: the metadata builders (the plan) and the
// attention (the run), timed separately on synthetic vLLM-like steps. The reference is ground
// truth, not a fast path; these numbers tell users how its cost grows with tokens and context.
// Run: build/experiments/bench_reference [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cmath>

#include "hybridtb/backend.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"

namespace hybridtb {
namespace {

AttentionConfig llama_like(int64_t window) {
  AttentionConfig c;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_size = 128;
  c.block_size = 16;
  c.scale = 1.0 / std::sqrt(128.0);
  c.sliding_window = window;
  c.dtype = DType::kBFloat16;
  return c;
}

// Decodes: args = {batch size, context length, window}.
std::vector<RequestSpec> decodes(int64_t batch, int64_t context) {
  return std::vector<RequestSpec>(static_cast<size_t>(batch), RequestSpec{context, 1, {}});
}

void BM_ReferenceBuildMetadata(benchmark::State& state) {
  // The builders only read the batch description; a one-head model keeps the set-up cheap.
  AttentionConfig tiny = llama_like(0);
  tiny.num_heads = tiny.num_kv_heads = 1;
  tiny.head_size = 32;
  const BatchFile file = make_synthetic_batch(tiny, {}, decodes(state.range(0), state.range(1)), {});
  auto backend = create_backend("reference", {file.config, file.builder});
  for (auto _ : state) benchmark::DoNotOptimize(backend->build_metadata(file.batch));
  state.counters["requests"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_ReferenceBuildMetadata)->ArgNames({"requests", "context"})->Args({8, 1024})->Args({256, 1024})->Unit(benchmark::kMicrosecond);

void BM_ReferenceDecodeStep(benchmark::State& state) {
  const BatchFile file =
      make_synthetic_batch(llama_like(state.range(2)), {}, decodes(state.range(0), state.range(1)), {});
  auto backend = create_backend("reference", {file.config, file.builder});
  for (auto _ : state) benchmark::DoNotOptimize(run_step(*backend, file));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.range(0)), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReferenceDecodeStep)
    ->ArgNames({"batch", "context", "window"})
    ->Args({8, 1024, 0})
    ->Args({8, 8192, 0})
    ->Args({8, 8192, 1024})
    ->Unit(benchmark::kMillisecond);

void BM_ReferencePrefillStep(benchmark::State& state) {
  const BatchFile file =
      make_synthetic_batch(llama_like(state.range(1)), {}, {RequestSpec{0, state.range(0), {}}}, {});
  auto backend = create_backend("reference", {file.config, file.builder});
  for (auto _ : state) benchmark::DoNotOptimize(run_step(*backend, file));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.range(0)), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReferencePrefillStep)->ArgNames({"tokens", "window"})->Args({512, 0})->Args({2048, 256})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hybridtb

BENCHMARK_MAIN();
