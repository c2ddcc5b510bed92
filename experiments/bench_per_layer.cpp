// hybridtb_bench_per_layer [--out FILE.json] [--batch 1,8,32,128] [--context 1024] [--samples 30]:
// one decode step of a per-layer hybrid model on the "cuda" backend — Qwen3-Next's pattern, three
// Gated DeltaNet layers (16 key heads, 32 value heads of 128, conv 4, the qwen3-next-gdn preset's
// sizes) then one full-attention layer (16/2 heads of 256, the qwen3-next-attention preset), bf16,
// float32 state pools — run eagerly and replayed from ONE CUDA graph captured through the
// lifecycle hooks (init_graph_state / init_capture_metadata / init_replay_metadata), at
// CUDA-graph-padded decode batch sizes.
//
// Per size, medians of --samples steps (after warm-up), each step's state pools and KV cache
// restored outside the timed region:
//   eager_gpu_us / eager_latency_us   the eager step (build_metadata + every layer's calls, which plan
//                                     and upload as they go): its kernels' GPU time alone, and the
//                                     latency of the step issued alone (host enqueue included);
//   graph_gpu_us / graph_latency_us   init_replay_metadata (the uploads) + one cudaGraphLaunch;
//   saved_us                          eager_latency_us − graph_latency_us: what the graph saves;
//   bound_us                          the step's compulsory bytes (every GDN layer's recurrent and
//                                     conv state read and written once, the attention layer's KV
//                                     read once) at the device-to-device copy bandwidth measured
//                                     in the same run; pct_of_bound = bound_us / graph_gpu_us.
// The timer holds the stream behind a gate kernel while the step is enqueued (experiments/src/
// gpu_timing.h), so the GPU time excludes host gaps and the latency includes them. Each size also
// checks that the replayed step's outputs and pools equal the eager step's bit for bit
// ("replay_equals_eager"; tests/cuda/cuda_per_layer_test asserts it on small shapes).
#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_check.h"
#include "hybridtb/backend.h"
#include "hybridtb/error.h"
#include "hybridtb/revision.h"
#include "hybridtb/per_layer.h"
#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"
#include "src/gpu_timing.h"


namespace hybridtb {
namespace {

constexpr int kGdnLayers = 3;

AttentionConfig attention_layer() {
  AttentionConfig c;
  c.num_heads = 16;
  c.num_kv_heads = 2;
  c.head_size = 256;
  c.block_size = 16;
  c.scale = 1.0 / 16.0;
  c.dtype = DType::kBFloat16;
  return c;
}

AttentionConfig gdn_layer() {
  AttentionConfig c = attention_layer();
  c.layer_kind = LayerKind::kGdn;
  c.ssm_mode = "gdn";
  c.ssm_params = {{"num_k_heads", 16}, {"num_v_heads", 32}, {"head_k_dim", 128}, {"head_v_dim", 128},
                  {"conv_kernel", 4}};
  return c;
}

BuilderConfig graph_builder(const std::vector<int64_t>& sizes) {
  BuilderConfig builder;
  builder.cudagraph_mode = CudaGraphMode::kFullDecodeOnly;
  builder.cudagraph_capture_sizes = sizes;
  return builder;
}

// One layer's file and its buffers in the backend (hybridtb/step.h), with the file's state to
// restore before every sample.
struct Layer {
  BatchFile file;
  LayerBuffers buffers;

  Layer(Backend& backend, BatchFile f) : file(std::move(f)), buffers(backend, file) {}
  // Puts the step's starting state back (outside the timed region).
  void restore(Backend& backend) const {
    for (const auto& [name, pool] : file.inputs.ssm_state) backend.copy(buffers.device.ssm_state.at(name), pool);
    if (!file.config.is_linear_layer()) backend.copy(buffers.device.kv_cache, file.inputs.kv_cache);
  }
  void run(Backend& backend, const HybridMetadata& metadata) const { buffers.run(backend, metadata, file.batch); }
  // The bytes the step must move for this layer: the state of every request that runs read and
  // written once (linear layers), the KV rows attention reads once (attention layers).
  double compulsory_bytes() const {
    const BatchDescription& b = file.batch;
    double bytes = 0;
    if (file.config.is_linear_layer()) {
      for (const auto& [name, pool] : file.inputs.ssm_state) {
        bytes += 2.0 * static_cast<double>(pool.nbytes() / pool.size(0)) * static_cast<double>(b.num_actual_tokens);
      }
      return bytes;
    }
    const AttentionConfig& c = file.config;
    for (int64_t r = 0; r < b.num_reqs(); ++r) {
      bytes += 2.0 * static_cast<double>(b.seq_len(r) * c.num_kv_heads * c.head_size) *
               static_cast<double>(element_size(c.dtype));
    }
    return bytes;
  }
};


double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

nlohmann::ordered_json bench_size(int64_t batch_size, int64_t context, int samples, double copy_GBps) {
  const std::vector<int64_t> capture = {batch_size};
  const BuilderConfig builder = graph_builder(capture);
  const AttentionConfig attention = attention_layer();
  const AttentionConfig gdn = gdn_layer();
  const std::vector<RequestSpec> requests(static_cast<size_t>(batch_size), RequestSpec{context, 1});
  SyntheticOptions options{.seed = 7};
  options.ssm_block_table = true;
  options.fast_fill = true;
  auto backend = create_per_layer_backend("cuda", {{attention, builder}, {gdn, builder}});

  std::vector<Layer> layers;
  for (int l = 0; l < kGdnLayers; ++l) {
    BatchFile file = make_synthetic_batch(gdn, builder, requests, options);
    auto tensors = spec::ssm::make_random_ssm_tensors(gdn, ssm_slots_needed(file.batch), 31 + l);
    file.inputs.ssm_state = std::move(tensors.ssm_state);
    file.inputs.weights = std::move(tensors.weights);
    layers.emplace_back(*backend, std::move(file));
  }
  layers.emplace_back(*backend, make_synthetic_batch(attention, builder, requests, options));
  const BatchDescription& batch = layers.front().file.batch;
  double bytes = 0;
  for (const Layer& layer : layers) bytes += layer.compulsory_bytes();

  bench::gpu::StepTimer timer(backend->native_stream());
  const auto eager_step = [&] {
    const HybridMetadata metadata = backend->build_metadata(batch);
    for (const Layer& layer : layers) layer.run(*backend, metadata);
  };
  // Eager: warm-up, then samples.
  std::vector<double> eager_gpu, eager_latency;
  bool gate_timeouts = false;
  for (int i = 0; i < samples + 3; ++i) {
    for (const Layer& layer : layers) layer.restore(*backend);
    backend->synchronize();
    timer.start();
    eager_step();
    const double gpu = timer.stop_seconds();
    gate_timeouts = gate_timeouts || timer.last_gate_timed_out();
    if (i < 3) continue;
    eager_gpu.push_back(gpu * 1e6);
    eager_latency.push_back(timer.last_latency_seconds() * 1e6);
  }
  for (const Layer& layer : layers) layer.restore(*backend);
  eager_step();
  backend->synchronize();
  std::vector<StepOutputs> eager_results;
  for (const Layer& layer : layers) eager_results.push_back(layer.buffers.download_all(*backend, {}));

  // The graph: capture every layer's calls of one step on the backend's stream.
  backend->init_graph_state(batch_size, batch_size);
  const HybridMetadata captured = backend->build_metadata(batch);
  backend->init_capture_metadata(captured, batch);
  for (const Layer& layer : layers) layer.run(*backend, captured);  // warm-up: scratch allocated here
  backend->synchronize();
  const auto stream = static_cast<cudaStream_t>(backend->native_stream());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (const Layer& layer : layers) layer.run(*backend, captured);
  HYBRIDTB_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  HYBRIDTB_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  size_t nodes = 0;
  HYBRIDTB_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  const auto replay_step = [&] {
    const HybridMetadata metadata = backend->build_metadata(batch);
    backend->init_replay_metadata(metadata, batch);
    HYBRIDTB_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  };
  std::vector<double> graph_gpu, graph_latency, replan_us;
  for (int i = 0; i < samples + 3; ++i) {
    for (const Layer& layer : layers) layer.restore(*backend);
    backend->synchronize();
    timer.start();
    const auto t0 = std::chrono::steady_clock::now();
    replay_step();
    const auto t1 = std::chrono::steady_clock::now();
    const double gpu = timer.stop_seconds();
    gate_timeouts = gate_timeouts || timer.last_gate_timed_out();
    if (i < 3) continue;
    graph_gpu.push_back(gpu * 1e6);
    graph_latency.push_back(timer.last_latency_seconds() * 1e6);
    replan_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  for (const Layer& layer : layers) layer.restore(*backend);
  replay_step();
  backend->synchronize();
  bool equal = true;
  for (size_t l = 0; l < layers.size(); ++l) {
    equal = equal && first_bit_difference(layers[l].buffers.download_all(*backend, {}), eager_results[l]).empty();
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  const double bound_us = bytes / (copy_GBps * 1e9) * 1e6;
  nlohmann::ordered_json j;
  j["name"] = "qwen3-next-step/d" + std::to_string(batch_size) + "@" + std::to_string(context);
  j["batch"] = batch_size;
  j["context"] = context;
  j["layers"] = "3 x gdn (Hk 16, Hv 32, dk = dv = 128) + 1 x attention (16/2 x 256), bf16, fp32 pools";
  j["graph_nodes"] = nodes;
  j["eager_gpu_us"] = median(eager_gpu);
  j["eager_latency_us"] = median(eager_latency);
  j["graph_gpu_us"] = median(graph_gpu);
  j["graph_latency_us"] = median(graph_latency);
  j["host_replan_and_launch_us"] = median(replan_us);
  j["saved_us"] = median(eager_latency) - median(graph_latency);
  j["compulsory_bytes"] = bytes;
  j["bound_us"] = bound_us;
  j["pct_of_bound"] = 100.0 * bound_us / median(graph_gpu);
  j["replay_equals_eager"] = equal;
  j["gate_timeouts"] = gate_timeouts;
  return j;
}

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"One per-layer (Qwen3-Next-like) decode step on the cuda backend: eager vs one CUDA graph"};
  std::string out_path;
  std::string sizes_text = "1,8,32,128";
  int64_t context = 1024;
  int samples = 30;
  app.add_option("--out", out_path, "JSON results file");
  app.add_option("--batch", sizes_text, "comma-separated decode batch sizes (each is its own capture size)");
  app.add_option("--context", context, "context length of every request");
  app.add_option("--samples", samples, "timed steps per size (after 3 warm-ups)");
  CLI11_PARSE(app, argc, argv);

  std::string reason;
  if (!bench::gpu::available(&reason)) {
    std::cerr << "hybridtb_bench_per_layer: " << reason << "\n";
    return 2;
  }
  const bench::gpu::DeviceInfo device = bench::gpu::device_info();
  const bench::gpu::Ceilings ceilings = bench::gpu::measure_ceilings();
  nlohmann::ordered_json results;
  results["schema"] = "hybridtb-bench-per-layer";
  results["commit"] = hybridtb::source_revision().label();
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  results["date"] = date;
  results["gpu"] = device.name;
  results["sm_clock_mhz_measured"] = bench::gpu::measure_sm_clock_mhz();
  results["max_sm_clock_mhz"] = device.max_sm_clock_mhz;
  results["copy_GBps"] = ceilings.copy_GBps;
  results["cases"] = nlohmann::ordered_json::array();
  std::printf("%-28s %10s %10s %10s %10s %10s %8s %6s\n", "case", "eager_gpu", "eager_lat", "graph_gpu", "graph_lat",
              "saved", "%bound", "equal");
  for (const int64_t size : parse_sizes(sizes_text)) {
    nlohmann::ordered_json j = bench_size(size, context, samples, ceilings.copy_GBps);
    std::printf("%-28s %10.1f %10.1f %10.1f %10.1f %10.1f %8.1f %6s\n", j["name"].get<std::string>().c_str(),
                j["eager_gpu_us"].get<double>(), j["eager_latency_us"].get<double>(), j["graph_gpu_us"].get<double>(),
                j["graph_latency_us"].get<double>(), j["saved_us"].get<double>(), j["pct_of_bound"].get<double>(),
                j["replay_equals_eager"].get<bool>() ? "yes" : "NO");
    results["cases"].push_back(std::move(j));
  }
  std::printf("copy bandwidth %.0f GB/s (read + write counted); times in us, medians of %d steps\n",
              ceilings.copy_GBps, samples);
  if (!out_path.empty()) {
    std::ofstream file(out_path);
    file << results.dump(2) << "\n";
    if (!file) throw Error("cannot write " + out_path);
  }
  for (const auto& c : results["cases"]) {
    if (!c["replay_equals_eager"].get<bool>()) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace hybridtb

int main(int argc, char** argv) {
  try {
    return hybridtb::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "hybridtb_bench_per_layer: " << e.what() << "\n";
    return 1;
  }
}
