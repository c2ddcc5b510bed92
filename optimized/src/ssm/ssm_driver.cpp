// The GPU SSM driver: the batch-shaped part of the SSM branch on the GPU, rule for rule the
// reference driver's (reference/ssm/ssm_driver.cpp, restated in reference/ssm/README.md): it
// validates the step's SSM tensors against the mode's descriptor (hybridtb/spec), plans every request
// (decodes first, then prefills; the slots it reads and writes per mamba_cache_mode; zeros without
// an initial state or for a decode without context; the block-boundary writes of mode all),
// checks every slot before anything runs, skips padding (a slot the engine's rules skip:
// spec::ssm::skips_request; never read or written, zero contribution), groups the requests into waves, uploads the plan in one stream-ordered copy
// and runs the GPU mode. Decode-only steps run as a fixed-shape step instead (FixedDecodeStep: the
// same plan as one table of all requests plus per-row flags, in buffers allocated once, so its
// launches can be captured into a CUDA graph and replayed after re-planning). Also the GPU mode
// registry, SsmContext and the fixed step's scratch. Checked by tests/cuda/cuda_ssm_test.cpp.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "common/element_kind.h"
#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"
#include "hybridtb/spec/linear_layer_specs.h"
#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/spec/ssm_plan.h"
#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {

// --- SsmContext ----------------------------------------------------------------------------------

namespace {
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
}  // namespace

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(detail::concat("cuBLAS error ", cublasGetStatusName(status), " in ", what));
  }
}

SsmContext::SsmContext(DeviceMemory& memory, cudaStream_t stream)
    : memory_(memory), stream_(stream), compute_capability_(current_compute_capability()) {}

SsmContext::~SsmContext() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);  // NOLINT: best effort in a destructor
}

cublasHandle_t SsmContext::cublas() {
  if (cublas_ == nullptr) {
    check_cublas(cublasCreate(&cublas_), "cublasCreate");
    check_cublas(cublasSetStream(cublas_, stream_), "cublasSetStream");
    // Our own workspace: no allocation inside cuBLAS calls (graph capture, phase 2) and
    // reproducible results (cuBLAS is bitwise deterministic per stream + workspace).
    cublas_workspace_ = memory_.allocate(kCublasWorkspaceBytes);
    check_cublas(cublasSetWorkspace(cublas_, cublas_workspace_.get(), kCublasWorkspaceBytes), "cublasSetWorkspace");
    check_cublas(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");  // no TF32
  }
  return cublas_;
}

void* SsmContext::scratch(size_t bytes) {
  step_blocks_.push_back(memory_.allocate(std::max<size_t>(bytes, 256)));
  return step_blocks_.back().get();
}

void SsmContext::upload_bytes(void* device, const void* host, size_t bytes) {
  HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
}

// --- registry --------------------------------------------------------------------------------------

GpuModeRegistry& GpuModeRegistry::instance() {
  static GpuModeRegistry* registry = [] {
    auto* built = new GpuModeRegistry();  // never destroyed, like the descriptor registry
    register_builtin_gpu_modes(*built);
    return built;
  }();
  return *registry;
}

void GpuModeRegistry::add(std::unique_ptr<GpuMode> mode) {
  HYBRIDTB_CHECK(mode != nullptr, "GpuModeRegistry::add: null mode");
  HYBRIDTB_CHECK(find(mode->name()) == nullptr, "GpuModeRegistry::add: ssm_mode ", mode->name(),
                 " is registered twice");
  HYBRIDTB_CHECK(spec::ssm::ModeSpecRegistry::instance().contains(mode->name()), "GpuModeRegistry::add: ssm_mode ",
                 mode->name(), " has no descriptor (hybridtb/spec/ssm_mode.h: ModeSpecRegistry)");
  modes_.push_back(std::move(mode));
}

const GpuMode* GpuModeRegistry::find(const std::string& name) const {
  for (const auto& mode : modes_) {
    if (mode->name() == name) return mode.get();
  }
  return nullptr;
}

std::vector<std::string> GpuModeRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& mode : modes_) out.push_back(mode->name());
  return out;
}

ElementKind gpu_element_kind(DType dtype, const std::string& what) {
  if (dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    throw NotSupported(detail::concat("cuda backend: ", what, " has dtype ", to_string(dtype),
                                      " (the GPU SSM modes read and write float32, float16 and bfloat16)"));
  }
  return element_kind(dtype);
}

// --- the plan (hybridtb/spec/ssm_plan.h, the reference driver's rules) -----------------------------

namespace {

// The per-request plan is the spec's (hybridtb/spec/ssm_plan.h): one interpretation of the Mamba
// metadata for both backends.
using spec::ssm::check_plannable_step;
using spec::ssm::plan_decode;
using spec::ssm::plan_prefill;
using spec::ssm::RequestPlan;
using spec::ssm::Slot;
using spec::ssm::slots_of;

// Waves: a request goes one wave after the last earlier request it conflicts with (it reads or
// writes a slot that request wrote, or writes a slot that request read), so each wave's requests
// touch disjoint slots and the result is the reference's sequential one.
std::vector<int> assign_waves(const std::vector<const RequestPlan*>& runs) {
  std::map<int64_t, int> written_in;  // slot → last wave writing it
  std::map<int64_t, int> read_in;     // slot → last wave reading it
  std::vector<int> waves;
  for (const RequestPlan* plan : runs) {
    std::vector<int64_t> writes;
    for (const auto& write : plan->boundary_writes) writes.push_back(write.second.index);
    writes.push_back(plan->final_write.index);
    int wave = 0;
    const auto after = [&](const std::map<int64_t, int>& map, int64_t slot) {
      const auto it = map.find(slot);
      if (it != map.end()) wave = std::max(wave, it->second + 1);
    };
    if (plan->read) after(written_in, plan->read->index);
    for (int64_t slot : writes) {
      after(written_in, slot);
      after(read_in, slot);
    }
    if (plan->read) read_in[plan->read->index] = std::max(read_in[plan->read->index], wave);
    for (int64_t slot : writes) written_in[slot] = std::max(written_in[slot], wave);
    waves.push_back(wave);
  }
  return waves;
}

// Why a fixed decode step (one wave, at most one token per request) cannot run these requests:
// a request with several tokens, or the first slot (in slot order) that two requests share so that
// their order matters (one writes it, the other reads or writes it); "" if none.
std::string fixed_step_blocker(const std::vector<const RequestPlan*>& runs) {
  struct Use {
    const RequestPlan* plan;
    const Slot* slot;
    bool write;
  };
  std::map<int64_t, std::vector<Use>> uses;  // slot → every use, in request order
  for (const RequestPlan* plan : runs) {
    if (plan->end - plan->begin > 1) {
      return detail::concat("request ", plan->request, " has ", plan->end - plan->begin,
                            " tokens (token rows [", plan->begin, ", ", plan->end,
                            ")); a fixed decode step runs at most one per request");
    }
    if (plan->read) uses[plan->read->index].push_back(Use{plan, &*plan->read, false});
    for (const auto& write : plan->boundary_writes) uses[write.second.index].push_back(Use{plan, &write.second, true});
    uses[plan->final_write.index].push_back(Use{plan, &plan->final_write, true});
  }
  for (const auto& [slot, list] : uses) {
    for (size_t a = 0; a < list.size(); ++a) {
      for (size_t b = a + 1; b < list.size(); ++b) {
        if (list[a].plan != list[b].plan && (list[a].write || list[b].write)) {
          return detail::concat("requests ", list[a].plan->request, " and ", list[b].plan->request,
                                " share state slot ", slot, " (", list[a].slot->field, ", ", list[b].slot->field,
                                "; the driver runs them in two waves)");
        }
      }
    }
  }
  return "";
}

int32_t narrow(int64_t value, const char* what) {
  HYBRIDTB_CHECK(value >= std::numeric_limits<int32_t>::min() && value <= std::numeric_limits<int32_t>::max(), "cuda backend: ", what, " = ", value,
                 " does not fit the GPU plan's int32");
  return static_cast<int32_t>(value);
}

int64_t product(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

const GpuMode& gpu_mode_of(const AttentionConfig& config) {
  const GpuMode* gpu_mode = GpuModeRegistry::instance().find(config.ssm_mode);
  if (gpu_mode == nullptr) {
    std::string names;
    for (const std::string& name : GpuModeRegistry::instance().names()) names += (names.empty() ? "" : ", ") + name;
    throw NotSupported(detail::concat("cuda backend: ssm_mode '", config.ssm_mode,
                                      "' has no GPU implementation (GPU modes: ", names, ")"));
  }
  return *gpu_mode;
}

}  // namespace

// Everything ssm_forward (or linear_attention_forward) checks before a kernel runs, and what it
// plans: the step's tensors bound for the GPU mode (bind_tensors) and, for per-request modes, the
// checked per-request plan (plan_requests). The plan needs no tensor, so a fixed decode step can
// plan once for the tensors of every layer of a step.
struct PlannedStep {
  PlannedStep() = default;
  PlannedStep(const PlannedStep&) = delete;  // `runs` points into `plans`
  PlannedStep(PlannedStep&&) = default;

  const GpuMode* gpu_mode = nullptr;
  GpuStep step;
  int64_t input_rows = 0;  // rows of the query or the linear inputs (and of the output)
  int64_t num_slots = 0;   // slots of the state pools (has_pools)
  bool has_pools = false;
  std::vector<RequestPlan> plans;        // every decode with tokens, then every prefill
  std::vector<const RequestPlan*> runs;  // those that run: no padding slot, at least one token
};

void GpuMode::linear_forward(const GpuStep& step) const {
  throw NotSupported(detail::concat("cuda backend: ssm_mode ", name(), " has no linear-attention layer form (layer_kind ",
                                    to_string(step.config->layer_kind), ")"));
}

namespace {

std::string owner_of(const AttentionConfig& config) {
  return config.is_linear_layer() ? "layer_kind " + std::string(to_string(config.layer_kind))
                                  : "ssm_mode " + config.ssm_mode;
}

// The SSM branch's rows: the query viewed as hidden rows [T, H] (a tensor-parallel rank: ssm_hidden),
// the contribution of the query's shape.
void bind_branch_rows(PlannedStep& planned, const AttentionConfig& config, const StepTensors& tensors,
                      const TensorView& contribution, int64_t hidden_size) {
  const TensorView& query = tensors.query;
  HYBRIDTB_CHECK(query.device() == Device::kCuda && contribution.device() == Device::kCuda,
                 "the GPU SSM driver needs CUDA tensors, got query ", query.describe(), " and contribution ",
                 contribution.describe());
  HYBRIDTB_CHECK(query.rank() == 3 && query.size(1) == config.num_heads && query.size(2) == config.head_size &&
                     query.stride(2) == 1 && query.stride(1) == config.head_size,
                 "/inputs/query must be [T, num_heads, head_size] with contiguous rows, got ", query.describe());
  HYBRIDTB_CHECK(contribution.shape() == query.shape() && is_floating(contribution.dtype()) &&
                     contribution.is_contiguous(),
                 "the SSM contribution buffer ", contribution.describe(),
                 " must be a contiguous float tensor of the query's shape ", shape_to_string(query.shape()));
  GpuStep& step = planned.step;
  const int64_t row_width = config.num_heads * config.head_size;
  if (config.is_tensor_parallel_rank()) {
    // A rank reads every head's row (ssm_hidden) and writes its own heads' columns of the contribution.
    const TensorView& hidden = tensors.ssm_hidden;
    HYBRIDTB_CHECK(hidden.device() == Device::kCuda && hidden.shape() == Shape({query.size(0), hidden_size}) &&
                       hidden.is_contiguous(),
                   hidden.empty() ? "missing /inputs/ssm_hidden" : "/inputs/ssm_hidden must be a contiguous CUDA tensor",
                   " (a tensor-parallel rank's SSM input: [T, tp_size * num_heads * head_size] = [", query.size(0), ", ",
                   hidden_size, "]), got ", hidden.empty() ? std::string("nothing") : hidden.describe());
    step.hidden = RowsRef{hidden.data(), gpu_element_kind(hidden.dtype(), "/inputs/ssm_hidden"), hidden_size};
  } else {
    step.hidden = RowsRef{query.data(), gpu_element_kind(query.dtype(), "/inputs/query"), query.stride(0)};
  }
  step.contribution =
      RowsRef{contribution.data(), gpu_element_kind(contribution.dtype(), "the SSM contribution"), row_width};
  step.output_width = row_width;
  planned.input_rows = query.size(0);
}

// A linear layer's rows: its inputs by name ([T, width] each) and its output [T, output_width].
void bind_linear_rows(PlannedStep& planned, const AttentionConfig& config, const StepTensors& tensors,
                      const TensorView& output) {
  const LinearLayerSpec spec = linear_layer_spec(config);
  const std::string owner = owner_of(config);
  int64_t rows = -1;
  GpuStep& step = planned.step;
  for (const LinearInput& input : spec.inputs) {
    const auto it = tensors.linear_inputs.find(input.name);
    HYBRIDTB_CHECK(it != tensors.linear_inputs.end() && !it->second.empty(), "missing /inputs/", input.name,
                   " (required by ", owner, ": [T, ", input.width_formula, "], ", input.meaning, ")");
    const TensorView& view = it->second;
    if (rows < 0 && view.rank() == 2) rows = view.size(0);
    HYBRIDTB_CHECK(view.device() == Device::kCuda && view.rank() == 2 && view.size(0) == rows &&
                       view.size(1) == input.width && view.stride(1) == 1,
                   "/inputs/", input.name, " must be a CUDA tensor [T, ", input.width_formula, "] = [", rows, ", ",
                   input.width, "] with contiguous rows (T as the other inputs), got ", view.describe());
    step.linear_inputs[input.name] =
        RowsRef{view.data(), gpu_element_kind(view.dtype(), "/inputs/" + input.name), view.stride(0)};
  }
  HYBRIDTB_CHECK(output.device() == Device::kCuda && output.shape() == Shape({rows, spec.output_width}) &&
                     is_floating(output.dtype()) && output.is_contiguous(),
                 "the linear layer's output buffer ", output.describe(), " must be a contiguous CUDA float tensor [T, ",
                 spec.output_width, "] = [", rows, ", ", spec.output_width, "] (", spec.output_meaning, ")");
  step.contribution =
      RowsRef{output.data(), gpu_element_kind(output.dtype(), "the linear layer's output"), spec.output_width};
  step.output_width = spec.output_width;
  planned.input_rows = rows;
}

// Checks the step's tensors against the mode's specs (the SSM branch) or the linear layer's, and
// binds them: rows, weights and pools as the GPU mode reads them. No plan yet.
PlannedStep bind_tensors(const AttentionConfig& config, const StepTensors& tensors, const TensorView& output,
                         SsmContext& context) {
  const spec::ssm::ModeSpec& mode = spec::ssm::ModeSpecRegistry::instance().find(config.ssm_mode);
  const GpuMode& gpu_mode = gpu_mode_of(config);
  const spec::ssm::ModeShape shape = spec::ssm::mode_shape(config);
  std::vector<spec::ssm::TensorSpec> weight_specs;
  std::vector<spec::ssm::TensorSpec> state_specs;
  if (config.is_linear_layer()) {
    spec::ssm::validate_linear_tensors(config, tensors.ssm_state, tensors.weights);
    spec::ssm::LinearLayerTensorSpecs specs = spec::ssm::linear_layer_tensor_specs(config);
    weight_specs = std::move(specs.weights);
    state_specs = std::move(specs.state);
  } else {
    spec::ssm::validate_ssm_tensors(config, tensors.ssm_state, tensors.weights);
    weight_specs = mode.weight_specs(shape);
    state_specs = mode.state_specs(shape);
  }

  PlannedStep planned;
  planned.gpu_mode = &gpu_mode;
  GpuStep& step = planned.step;
  step.config = &config;
  step.context = &context;
  step.hidden_size = shape.hidden_size;
  if (config.is_linear_layer()) {
    bind_linear_rows(planned, config, tensors, output);
  } else {
    bind_branch_rows(planned, config, tensors, output, shape.hidden_size);
  }
  for (const spec::ssm::TensorSpec& spec : weight_specs) {
    const auto it = tensors.weights.find(spec.name);
    if (it == tensors.weights.end() || it->second.empty()) continue;
    const TensorView& w = it->second;
    HYBRIDTB_CHECK(w.device() == Device::kCuda && w.is_contiguous(), "/weights/", spec.name,
                   " must be a contiguous CUDA tensor, got ", w.describe());
    step.weights[spec.name] =
        GpuWeight{WeightRef{w.data(), gpu_element_kind(w.dtype(), "/weights/" + spec.name)}, w.shape()};
  }
  for (const spec::ssm::TensorSpec& spec : state_specs) {
    const auto it = tensors.ssm_state.find(spec.name);
    if (it == tensors.ssm_state.end() || it->second.empty()) continue;
    const TensorView& pool = it->second;
    HYBRIDTB_CHECK(pool.device() == Device::kCuda && pool.is_contiguous(), "/inputs/ssm/", spec.name,
                   " must be a contiguous CUDA tensor, got ", pool.describe());
    const ElementKind kind = gpu_element_kind(pool.dtype(), "/inputs/ssm/" + spec.name);
    step.pools[spec.name] = PoolRef{pool.data(), kind, product(spec.shape)};
    if (spec.transposed) {
      // Stored [slots, rows, cols] (the SD conv state); run_mode hands the kernels a DS copy.
      step.pools[spec.name].data = nullptr;
      step.transposed_pools.push_back(GpuStep::TransposedPool{spec.name, pool.data(), kind == ElementKind::kFloat32 ? 4 : 2,
                                                              pool.size(0), spec.shape.at(0), spec.shape.at(1)});
    }
    planned.num_slots = pool.size(0);
    planned.has_pools = true;
  }
  gpu_mode.check_supported(step);
  return planned;
}

// Plans every request of the step (the spec's plan) into planned.plans/runs, and sets the
// step's token counts; checks nothing that needs a tensor (check_slots does, once bound).
void plan_requests(PlannedStep& planned, const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                   const BatchDescription& batch) {
  const int64_t num_tokens = batch.num_actual_tokens;
  HYBRIDTB_CHECK(0 <= num_tokens && num_tokens <= batch.num_tokens(), "/batch/num_actual_tokens = ", num_tokens,
                 " is outside the batch's ", batch.num_tokens(), " token rows");
  planned.step.num_tokens = num_tokens;
  planned.step.num_decode_tokens = metadata.num_decode_tokens;
  if (planned.gpu_mode->whole_step()) return;

  check_plannable_step(config, metadata, batch, owner_of(config));
  for (int64_t r = 0; r < metadata.num_decodes; ++r) {
    if (batch.query_len(r) > 0) planned.plans.push_back(plan_decode(config, metadata, batch, r));
  }
  for (int64_t i = 0; i < metadata.num_prefills; ++i) planned.plans.push_back(plan_prefill(config, metadata, batch, i));
  for (const RequestPlan& plan : planned.plans) {
    HYBRIDTB_CHECK(0 <= plan.begin && plan.begin <= plan.end && plan.end <= num_tokens, "request ", plan.request,
                   " has token rows [", plan.begin, ", ", plan.end, ") outside the step's ", num_tokens, " tokens");
    // The engine's skip rule, decided by the spec's function (index < 0, or <= 0 from vLLM
    // 0.33 on): the kernels only ever see the requests that run.
    if (!spec::ssm::skips_request(config, plan) && plan.end > plan.begin) planned.runs.push_back(&plan);
  }
}

// The largest slot the plan reads or writes (−1 if none).
int64_t max_slot_of(const PlannedStep& planned) {
  int64_t max_slot = -1;
  for (const RequestPlan& plan : planned.plans) {
    for (const Slot* slot : slots_of(plan)) max_slot = std::max(max_slot, slot->index);
  }
  return max_slot;
}

// Every slot of the plan inside the bound pools; Error naming the first that is not.
void check_slots(const PlannedStep& planned) {
  if (!planned.has_pools) return;
  for (const RequestPlan& plan : planned.plans) {
    for (const Slot* slot : slots_of(plan)) {
      HYBRIDTB_CHECK(slot->index < planned.num_slots, slot->field, " = ", slot->index,
                     " is outside the SSM state pools' ", planned.num_slots, " slots");
    }
  }
}

// The step's token rows must fit the bound tensors.
void check_rows(const PlannedStep& planned, int64_t rows) {
  HYBRIDTB_CHECK(rows <= planned.input_rows, "the step's ", rows, " token rows do not fit the ",
                 planned.step.config->is_linear_layer() ? "linear inputs'" : "query's", " ", planned.input_rows,
                 " rows");
}

// The mode's forward for the SSM branch, its linear_forward for a linear layer.
// Pools stored transposed (GpuStep::transposed_pools) go through a DS scratch copy: transposed in
// before the mode, back after it (from the step's scratch, so a fixed step's copies are the same
// memory on every launch and can be captured).
void run_mode(const GpuMode& gpu_mode, GpuStep& step) {
  const cudaStream_t stream = step.context->stream();
  for (const GpuStep::TransposedPool& t : step.transposed_pools) {
    PoolRef& pool = step.pools.at(t.name);
    pool.data = step.scratch(static_cast<size_t>(t.slots * t.rows * t.cols * t.element_bytes));
    launch_transpose_slots(t.stored, pool.data, t.element_bytes, t.slots, t.rows, t.cols, stream);
  }
  if (step.config->is_linear_layer()) {
    gpu_mode.linear_forward(step);
  } else {
    gpu_mode.forward(step);
  }
  for (const GpuStep::TransposedPool& t : step.transposed_pools) {
    launch_transpose_slots(step.pools.at(t.name).data, t.stored, t.element_bytes, t.slots, t.cols, t.rows, stream);
  }
}

// The eager wave driver: per-token flags and boundary slots and the requests wave by wave, in one
// upload to the context's scratch; then the mode, then zeros for the skipped rows.
void run_waves(PlannedStep& planned) {
  GpuStep& step = planned.step;
  SsmContext& context = *step.context;
  const int64_t num_tokens = step.num_tokens;
  const std::vector<const RequestPlan*>& runs = planned.runs;
  const std::vector<int> wave_of = assign_waves(runs);
  const int num_waves = wave_of.empty() ? 0 : *std::max_element(wave_of.begin(), wave_of.end()) + 1;
  std::vector<int32_t> active(static_cast<size_t>(std::max<int64_t>(num_tokens, 1)), kRowSkipped);
  std::vector<int32_t> boundary_slot(active.size(), -1);
  std::vector<std::vector<GpuRequest>> wave_requests(static_cast<size_t>(num_waves));
  for (size_t k = 0; k < runs.size(); ++k) {
    const RequestPlan& plan = *runs[k];
    GpuRequest request;
    request.begin = narrow(plan.begin, "a token row");
    request.end = narrow(plan.end, "a token row");
    request.read_slot = plan.read ? narrow(plan.read->index, "a state slot") : -1;
    request.write_slot = narrow(plan.final_write.index, "a state slot");
    request.decode = plan.decode ? 1 : 0;
    request.first_boundary = static_cast<int32_t>(step.boundaries.size());
    request.num_boundaries = static_cast<int32_t>(plan.boundary_writes.size());
    for (const auto& [position, slot] : plan.boundary_writes) {
      const int64_t row = plan.begin + (position - plan.first_position);
      boundary_slot[static_cast<size_t>(row)] = narrow(slot.index, "a state slot");
      step.boundaries.push_back(GpuBoundary{narrow(row, "a token row"), narrow(slot.index, "a state slot")});
    }
    for (int64_t t = plan.begin; t < plan.end; ++t) active[static_cast<size_t>(t)] = kRowActive;
    wave_requests[static_cast<size_t>(wave_of[k])].push_back(request);
  }
  // One upload: [active | boundary_slot | wave 0 requests | wave 1 requests | ...].
  std::vector<int32_t> packed(active);
  packed.insert(packed.end(), boundary_slot.begin(), boundary_slot.end());
  std::vector<size_t> wave_offsets;
  static_assert(sizeof(GpuRequest) % sizeof(int32_t) == 0);
  for (const auto& requests : wave_requests) {
    wave_offsets.push_back(packed.size());
    for (const GpuRequest& request : requests) {
      const auto* words = reinterpret_cast<const int32_t*>(&request);
      packed.insert(packed.end(), words, words + sizeof(GpuRequest) / sizeof(int32_t));
    }
  }
  int32_t* device = context.upload(packed);
  step.active = device;
  step.boundary_slot = device + active.size();
  for (size_t w = 0; w < wave_requests.size(); ++w) {
    GpuWave wave;
    wave.host = wave_requests[w];
    wave.device.requests = reinterpret_cast<const GpuRequest*>(device + wave_offsets[w]);
    wave.device.num_requests = static_cast<int32_t>(wave.host.size());
    for (const GpuRequest& request : wave.host) {
      wave.device.max_tokens = std::max(wave.device.max_tokens, request.end - request.begin);
    }
    step.waves.push_back(std::move(wave));
  }

  if (num_tokens > 0) {
    if (!step.waves.empty()) run_mode(*planned.gpu_mode, step);
    // Rows of skipped requests (padding slots, no state run) contribute zeros; a batch without any
    // launches no zero pass.
    if (std::find(active.begin(), active.begin() + num_tokens, kRowSkipped) != active.begin() + num_tokens) {
      launch_zero_rows(step.contribution, step.output_width, 0, num_tokens, step.active, ZeroRows::kSkipped,
                       context.stream());
    }
  }
}

}  // namespace

// The eager step: bound, planned and checked before anything runs; decode-only steps take the
// fixed step's launches (the ones a replayed CUDA graph runs: the same bits eager or replayed).
void run_ssm_step(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                  const StepTensors& tensors, const TensorView& output, SsmContext& context,
                  const SsmPrefillChoice& prefill) {
  PlannedStep planned = bind_tensors(config, tensors, output, context);
  planned.step.prefill = prefill;
  plan_requests(planned, config, metadata, batch);
  check_rows(planned, planned.step.num_tokens);
  check_slots(planned);
  // A query view cut to num_actual_tokens rows (no padding rows to compute over) runs eagerly too.
  if (is_fixed_decode_step(config, metadata, batch) && batch.num_tokens() <= planned.input_rows &&
      (planned.gpu_mode->whole_step() || fixed_step_blocker(planned.runs).empty())) {
    FixedDecodeStep fixed(config, context);
    fixed.upload_plan(planned, metadata, batch);
    fixed.launch_planned(planned, /*may_be_captured=*/false);
  } else if (planned.gpu_mode->whole_step()) {
    planned.gpu_mode->forward(planned.step);
  } else {
    run_waves(planned);
  }
  context.end_step();
}

void ssm_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                 const StepTensors& tensors, const TensorView& contribution, SsmContext& context,
                 const SsmPrefillChoice& prefill) {
  HYBRIDTB_CHECK(!config.is_linear_layer(), "ssm_forward called for a layer_kind ", to_string(config.layer_kind),
                 " layer (run it with linear_attention_forward)");
  run_ssm_step(config, metadata, batch, tensors, contribution, context, prefill);
}

void linear_attention_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                              const BatchDescription& batch, const StepTensors& tensors, const TensorView& output,
                              SsmContext& context, const SsmPrefillChoice& prefill) {
  HYBRIDTB_CHECK(config.is_linear_layer(), "linear_attention_forward called for a full_attention layer (ssm_mode ",
                 config.ssm_mode, "): run it with hybrid_forward");
  run_ssm_step(config, metadata, batch, tensors, output, context, prefill);
}

// --- the fixed-shape decode step ---------------------------------------------------------------------

bool is_fixed_decode_step(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                          const BatchDescription& /*batch*/) {
  return GpuModeRegistry::instance().find(config.ssm_mode) != nullptr && metadata.num_prefills == 0 &&
         config.num_speculative_tokens == 0;
}

void* ScratchBlocks::get(size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  if (next_ < blocks_.size()) {
    HYBRIDTB_CHECK(bytes <= sizes_[next_], "a fixed SSM decode step asked for ", bytes, " bytes of scratch block ",
                   next_, ", which its first launch allocated with ", sizes_[next_],
                   " (a fixed step's scratch depends on its shape only)");
    return blocks_[next_++].get();
  }
  blocks_.push_back(memory_.allocate(bytes));
  sizes_.push_back(bytes);
  ++next_;
  return blocks_.back().get();
}

FixedDecodeStep::FixedDecodeStep(const AttentionConfig& config, SsmContext& context)
    : config_(config), context_(context), scratch_(context.memory()), gpu_mode_(&gpu_mode_of(config_)) {}

namespace {

// NotSupported unless is_fixed_decode_step (the mode was checked when the step was made).
void require_fixed(const AttentionConfig& config, const MambaAttentionMetadata& metadata) {
  if (metadata.num_prefills > 0) {
    throw NotSupported(detail::concat("a fixed-shape SSM decode step cannot run prefills (mamba/num_prefills = ",
                                      metadata.num_prefills, ")"));
  }
  if (config.num_speculative_tokens > 0) {
    throw NotSupported(detail::concat("a fixed-shape SSM decode step cannot run speculative decodes "
                                      "(/config/num_speculative_tokens = ",
                                      config.num_speculative_tokens, ")"));
  }
}

}  // namespace

void FixedDecodeStep::prepare(const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                              const StepTensors& tensors, const TensorView& output) {
  require_fixed(config_, metadata);
  PlannedStep planned = bind_tensors(config_, tensors, output, context_);
  plan_requests(planned, config_, metadata, batch);
  check_rows(planned, batch.num_tokens());
  check_slots(planned);
  // The tensors the launches read and write, by name: the same ones on every prepare.
  const GpuStep& step = planned.step;
  std::vector<TensorKey> keys;
  if (config_.is_linear_layer()) {
    for (const auto& [name, rows] : step.linear_inputs) keys.push_back({"/inputs/" + name, rows.data, rows.kind, rows.row_stride});
  } else {
    keys.push_back({"/inputs/query", step.hidden.data, step.hidden.kind, step.hidden.row_stride});
  }
  keys.push_back({config_.is_linear_layer() ? "the linear layer's output" : "the SSM contribution", step.contribution.data,
                  step.contribution.kind, step.contribution.row_stride});
  for (const auto& [name, pool] : step.pools) keys.push_back({"/inputs/ssm/" + name, pool.data, pool.kind, pool.slot_size});
  for (const auto& [name, weight] : step.weights) {
    keys.push_back({"/weights/" + name, weight.ref.data, weight.ref.kind, product(weight.shape)});
  }
  if (bound_tensors_) {
    for (size_t i = 0; i < std::max(keys.size(), tensors_.size()); ++i) {
      if (i < keys.size() && i < tensors_.size() && keys[i] == tensors_[i]) continue;
      const TensorKey none{"(none)"};
      const TensorKey& now = i < keys.size() ? keys[i] : none;
      const TensorKey& then = i < tensors_.size() ? tensors_[i] : none;
      throw Error(detail::concat("FixedDecodeStep::prepare: ", now.name == none.name ? then.name : now.name,
                                 " is not the tensor the step was prepared with (", now.name, " at ", now.data,
                                 ", element kind ", static_cast<int>(now.kind), ", extent ", now.extent, " vs ",
                                 then.name, " at ", then.data, ", element kind ", static_cast<int>(then.kind),
                                 ", extent ", then.extent,
                                 "); a prepared step keeps its tensors: copy new values into them"));
    }
  }
  upload_plan(planned, metadata, batch);
  if (!bound_tensors_) {
    bound_tensors_ = tensors;
    bound_output_ = output;
    tensors_ = std::move(keys);
  }
}

void FixedDecodeStep::prepare_plan(const MambaAttentionMetadata& metadata, const BatchDescription& batch) {
  require_fixed(config_, metadata);
  PlannedStep planned;
  planned.gpu_mode = gpu_mode_;
  planned.step.config = &config_;
  planned.step.context = &context_;
  plan_requests(planned, config_, metadata, batch);
  upload_plan(planned, metadata, batch);
}

void FixedDecodeStep::upload_plan(const PlannedStep& planned, const MambaAttentionMetadata& metadata,
                                  const BatchDescription& batch) {
  // Checks first: a call that throws changes nothing.
  require_fixed(config_, metadata);
  const bool whole_step = gpu_mode_->whole_step();
  const int64_t T = batch.num_tokens();
  const int64_t R = batch.num_reqs();
  const int64_t num_actual = planned.step.num_tokens;
  HYBRIDTB_CHECK(num_actual <= T, "a fixed-shape SSM decode step needs num_actual_tokens (", num_actual,
                 ") <= its token rows (", T, ", /batch/slot_mapping)");
  if (!whole_step) {
    const std::string blocker = fixed_step_blocker(planned.runs);
    if (!blocker.empty()) throw NotSupported("a fixed-shape SSM decode step cannot run this batch: " + blocker);
  }
  if (prepared_) {
    HYBRIDTB_CHECK(T == num_tokens_, "FixedDecodeStep::prepare: the batch has ", T,
                   " token rows (/batch/slot_mapping) but the step was prepared for ", num_tokens_,
                   " (a fixed step keeps its padded shape; use one step per captured size)");
    HYBRIDTB_CHECK(R == num_reqs_, "FixedDecodeStep::prepare: the batch has ", R,
                   " requests (/batch/query_start_loc) but the step was prepared for ", num_reqs_,
                   " (a fixed step keeps its padded shape; use one step per captured size)");
  }

  // The host image of the device plan: [T row flags | R requests].
  constexpr size_t kWords = sizeof(GpuRequest) / sizeof(int32_t);
  static_assert(sizeof(GpuRequest) % sizeof(int32_t) == 0);
  packed_.assign(static_cast<size_t>(T) + static_cast<size_t>(R) * kWords, 0);
  for (int64_t t = 0; t < T; ++t) packed_[static_cast<size_t>(t)] = t < num_actual ? kRowSkipped : kRowPadding;
  GpuRequest empty;
  empty.begin = 0;
  empty.end = 0;
  empty.read_slot = -1;
  empty.write_slot = -1;
  empty.decode = 1;
  std::vector<GpuRequest> entries(static_cast<size_t>(R), empty);
  if (whole_step) {
    // prefix_sum_flat's rule: decode rows t < num_decode_tokens (clamped as the eager mode does).
    const int64_t decode_rows = std::clamp<int64_t>(metadata.num_decode_tokens, 0, num_actual);
    for (int64_t t = 0; t < decode_rows; ++t) packed_[static_cast<size_t>(t)] = kRowActive;
  } else {
    for (const RequestPlan* plan : planned.runs) {
      HYBRIDTB_CHECK(0 <= plan->request && plan->request < R, "request ", plan->request, " is outside the batch's ",
                     R, " requests");
      GpuRequest& entry = entries[static_cast<size_t>(plan->request)];
      entry.begin = narrow(plan->begin, "a token row");
      entry.end = narrow(plan->end, "a token row");
      entry.read_slot = plan->read ? narrow(plan->read->index, "a state slot") : -1;
      entry.write_slot = narrow(plan->final_write.index, "a state slot");
      for (int64_t t = plan->begin; t < plan->end; ++t) packed_[static_cast<size_t>(t)] = kRowActive;
    }
  }
  for (size_t r = 0; r < entries.size(); ++r) {
    std::memcpy(packed_.data() + static_cast<size_t>(T) + r * kWords, &entries[r], sizeof(GpuRequest));
  }
  any_skipped_rows_ = std::find(packed_.begin(), packed_.begin() + T, kRowSkipped) != packed_.begin() + T;

  if (!prepared_) {
    plan_ = context_.memory().allocate(std::max<size_t>(packed_.size(), 1) * sizeof(int32_t));
    num_tokens_ = T;
    num_reqs_ = R;
  }
  if (gpu_mode_->uses_cublas()) context_.cublas();
  if (!packed_.empty()) {
    HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(plan_.get(), packed_.data(), packed_.size() * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, context_.stream()));
  }
  max_slot_ = max_slot_of(planned);
  prepared_ = true;
}

void FixedDecodeStep::launch() {
  HYBRIDTB_CHECK(prepared_ && bound_tensors_.has_value(), "FixedDecodeStep::launch called before prepare");
  launch_on(*bound_tensors_, bound_output_);
}

void FixedDecodeStep::launch_on(const StepTensors& tensors, const TensorView& output) {
  HYBRIDTB_CHECK(prepared_, "FixedDecodeStep::launch_on called before a plan (prepare or prepare_plan)");
  PlannedStep bound = bind_tensors(config_, tensors, output, context_);
  HYBRIDTB_CHECK(num_tokens_ <= bound.input_rows, "a fixed-shape SSM decode step of ", num_tokens_,
                 " token rows cannot run on tensors of ", bound.input_rows, " rows");
  HYBRIDTB_CHECK(!bound.has_pools || max_slot_ < bound.num_slots, "the planned state slot ", max_slot_,
                 " is outside these SSM state pools' ", bound.num_slots, " slots");
  launch_planned(bound);
}

// Launches the mode over the bound tensors of `bound` (checked against the plan) as the fixed step.
void FixedDecodeStep::launch_planned(PlannedStep& bound, bool may_be_captured) {
  if (num_tokens_ == 0) return;
  auto* device = static_cast<int32_t*>(plan_.get());
  GpuStep step = std::move(bound.step);
  step.config = &config_;
  step.context = &context_;
  step.fixed = true;
  step.num_tokens = num_tokens_;
  step.num_decode_tokens = 0;
  step.active = device;
  step.boundary_slot = nullptr;
  step.boundaries.clear();
  GpuWave wave;
  wave.device.requests = reinterpret_cast<const GpuRequest*>(device + num_tokens_);
  wave.device.num_requests = narrow(num_reqs_, "the number of requests");
  wave.device.max_tokens = 1;
  step.waves = {wave};
  step.fixed_scratch = &scratch_;
  scratch_.rewind();
  run_mode(*gpu_mode_, step);
  // Rows of skipped requests contribute zeros; padding rows are left alone.
  if (!gpu_mode_->whole_step() && (may_be_captured || any_skipped_rows_)) {
    launch_zero_rows(step.contribution, step.output_width, 0, num_tokens_, step.active, ZeroRows::kSkipped,
                     context_.stream());
  }
}

}  // namespace hybridtb::cuda::ssm
