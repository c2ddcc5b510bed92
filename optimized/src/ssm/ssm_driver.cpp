// The GPU SSM driver: the batch-shaped part of the SSM branch on the GPU, rule for rule the
// reference driver's (reference/ssm/ssm_driver.cpp, restated in reference/ssm/README.md): it
// validates the step's SSM tensors against the reference mode's specs, plans every request
// (decodes first, then prefills; the slots it reads and writes per mamba_cache_mode; zeros without
// an initial state or for a decode without context; the block-boundary writes of mode all),
// checks every slot before anything runs, skips padding (any slot < 0: never read or written,
// zero contribution), groups the requests into waves, uploads the plan in one stream-ordered copy
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
#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/reference/ssm_plan.h"
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
    auto* built = new GpuModeRegistry();  // never destroyed, like the reference registry
    register_builtin_gpu_modes(*built);
    return built;
  }();
  return *registry;
}

void GpuModeRegistry::add(std::unique_ptr<GpuMode> mode) {
  HYBRIDTB_CHECK(mode != nullptr, "GpuModeRegistry::add: null mode");
  HYBRIDTB_CHECK(find(mode->name()) == nullptr, "GpuModeRegistry::add: ssm_mode ", mode->name(),
                 " is registered twice");
  HYBRIDTB_CHECK(reference::ssm::ModeRegistry::instance().contains(mode->name()), "GpuModeRegistry::add: ssm_mode ",
                 mode->name(), " has no reference mode (the GPU registry mirrors reference/ssm)");
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
  switch (dtype) {
    case DType::kFloat32:
      return ElementKind::kFloat32;
    case DType::kFloat16:
      return ElementKind::kFloat16;
    case DType::kBFloat16:
      return ElementKind::kBFloat16;
    default:
      throw NotSupported(detail::concat("cuda backend: ", what, " has dtype ", to_string(dtype),
                                        " (the GPU SSM modes read and write float32, float16 and bfloat16)"));
  }
}

// --- the plan (the reference driver's rules) ---------------------------------------------------------

namespace {

// The per-request plan is the reference's (hybridtb/reference/ssm_plan.h): one interpretation of
// the Mamba metadata for both backends.
using reference::ssm::check_plannable_step;
using reference::ssm::plan_decode;
using reference::ssm::plan_prefill;
using reference::ssm::RequestPlan;
using reference::ssm::Slot;
using reference::ssm::slots_of;

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

// Everything ssm_forward checks before a kernel runs, and what it plans: the step's tensors and
// sizes (step.num_tokens = num_actual_tokens; no device plan yet) and, for per-request modes, the
// checked per-request plan.
struct PlannedStep {
  PlannedStep() = default;
  PlannedStep(const PlannedStep&) = delete;  // `runs` points into `plans`
  PlannedStep(PlannedStep&&) = default;

  const GpuMode* gpu_mode = nullptr;
  GpuStep step;
  int64_t query_rows = 0;  // rows of the query (and contribution) tensors
  std::vector<RequestPlan> plans;        // every decode with tokens, then every prefill
  std::vector<const RequestPlan*> runs;  // those that run: no padding slot, at least one token
};

namespace {

PlannedStep plan_step(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                      const BatchDescription& batch, const StepTensors& tensors, const TensorView& contribution,
                      SsmContext& context) {
  const reference::ssm::Mode& mode = reference::ssm::ModeRegistry::instance().find(config.ssm_mode);
  const GpuMode& gpu_mode = gpu_mode_of(config);
  reference::ssm::validate_ssm_tensors(config, tensors.ssm_state, tensors.weights);
  const reference::ssm::ModeShape shape = reference::ssm::mode_shape(config);
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
  const int64_t num_tokens = batch.num_actual_tokens;
  HYBRIDTB_CHECK(0 <= num_tokens && num_tokens <= query.size(0), "/batch/num_actual_tokens = ", num_tokens,
                 " does not fit the query's ", query.size(0), " rows");

  PlannedStep planned;
  planned.gpu_mode = &gpu_mode;
  planned.query_rows = query.size(0);
  GpuStep& step = planned.step;
  step.config = &config;
  step.context = &context;
  step.num_tokens = num_tokens;
  step.hidden_size = shape.hidden_size;
  step.num_decode_tokens = metadata.num_decode_tokens;
  step.hidden = RowsRef{query.data(), gpu_element_kind(query.dtype(), "/inputs/query"), query.stride(0)};
  step.contribution = RowsRef{contribution.data(), gpu_element_kind(contribution.dtype(), "the SSM contribution"),
                              shape.hidden_size};
  for (const reference::ssm::TensorSpec& spec : mode.weight_specs(shape)) {
    const auto it = tensors.weights.find(spec.name);
    if (it == tensors.weights.end() || it->second.empty()) continue;
    const TensorView& w = it->second;
    HYBRIDTB_CHECK(w.device() == Device::kCuda && w.is_contiguous(), "/weights/", spec.name,
                   " must be a contiguous CUDA tensor, got ", w.describe());
    step.weights[spec.name] =
        GpuWeight{WeightRef{w.data(), gpu_element_kind(w.dtype(), "/weights/" + spec.name)}, w.shape()};
  }
  int64_t num_slots = 0;
  bool has_pools = false;
  for (const reference::ssm::TensorSpec& spec : mode.state_specs(shape)) {
    const auto it = tensors.ssm_state.find(spec.name);
    if (it == tensors.ssm_state.end() || it->second.empty()) continue;
    const TensorView& pool = it->second;
    HYBRIDTB_CHECK(pool.device() == Device::kCuda && pool.is_contiguous(), "/inputs/ssm/", spec.name,
                   " must be a contiguous CUDA tensor, got ", pool.describe());
    step.pools[spec.name] =
        PoolRef{pool.data(), gpu_element_kind(pool.dtype(), "/inputs/ssm/" + spec.name), product(spec.shape)};
    num_slots = pool.size(0);
    has_pools = true;
  }
  gpu_mode.check_supported(step);
  if (gpu_mode.whole_step()) return planned;

  check_plannable_step(config, metadata, batch, "ssm_mode " + mode.name());

  // Plan and check every request before anything runs, so a bad batch changes nothing.
  for (int64_t r = 0; r < metadata.num_decodes; ++r) {
    if (batch.query_len(r) > 0) planned.plans.push_back(plan_decode(config, metadata, batch, r));
  }
  for (int64_t i = 0; i < metadata.num_prefills; ++i) planned.plans.push_back(plan_prefill(config, metadata, batch, i));
  for (const RequestPlan& plan : planned.plans) {
    HYBRIDTB_CHECK(0 <= plan.begin && plan.begin <= plan.end && plan.end <= num_tokens, "request ", plan.request,
                   " has token rows [", plan.begin, ", ", plan.end, ") outside the step's ", num_tokens, " tokens");
    bool padding = false;
    for (const Slot* slot : slots_of(plan)) {
      HYBRIDTB_CHECK(!has_pools || slot->index < num_slots, slot->field, " = ", slot->index,
                     " is outside the SSM state pools' ", num_slots, " slots");
      padding = padding || slot->index < 0;
    }
    if (!padding && plan.end > plan.begin) planned.runs.push_back(&plan);
  }
  return planned;
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
    if (!step.waves.empty()) planned.gpu_mode->forward(step);
    // Rows of skipped requests (padding slots, no state run) contribute zeros.
    launch_zero_rows(step.contribution, step.hidden_size, 0, num_tokens, step.active, ZeroRows::kSkipped,
                     context.stream());
  }
}

}  // namespace

void ssm_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                 const StepTensors& tensors, const TensorView& contribution, SsmContext& context) {
  PlannedStep planned = plan_step(config, metadata, batch, tensors, contribution, context);
  // A query view cut to num_actual_tokens rows (no padding rows to compute over) runs eagerly too.
  if (is_fixed_decode_step(config, metadata, batch) && batch.num_tokens() <= planned.query_rows &&
      (planned.gpu_mode->whole_step() || fixed_step_blocker(planned.runs).empty())) {
    // The launches a replayed CUDA graph of this shape runs: the same bits, eager or replayed.
    FixedDecodeStep fixed(config, context);
    fixed.prepare_planned(planned, metadata, batch);
    fixed.launch();
  } else if (planned.gpu_mode->whole_step()) {
    planned.gpu_mode->forward(planned.step);
  } else {
    run_waves(planned);
  }
  context.end_step();
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
                              const StepTensors& tensors, const TensorView& contribution) {
  require_fixed(config_, metadata);
  PlannedStep planned = plan_step(config_, metadata, batch, tensors, contribution, context_);
  prepare_planned(planned, metadata, batch);
}

void FixedDecodeStep::prepare_planned(PlannedStep& planned, const MambaAttentionMetadata& metadata,
                                      const BatchDescription& batch) {
  // Checks first: a call that throws changes nothing.
  require_fixed(config_, metadata);
  const bool whole_step = gpu_mode_->whole_step();
  const int64_t T = batch.num_tokens();
  const int64_t R = batch.num_reqs();
  const int64_t num_actual = planned.step.num_tokens;
  HYBRIDTB_CHECK(num_actual <= T && T <= planned.query_rows, "a fixed-shape SSM decode step needs num_actual_tokens (",
                 num_actual, ") <= its token rows (", T, ", /batch/slot_mapping) <= the query's rows (",
                 planned.query_rows, ")");
  if (!whole_step) {
    const std::string blocker = fixed_step_blocker(planned.runs);
    if (!blocker.empty()) throw NotSupported("a fixed-shape SSM decode step cannot run this batch: " + blocker);
  }
  // The tensors the launches read and write, by name: the same ones on every prepare.
  const GpuStep& planned_step = planned.step;
  std::vector<TensorKey> tensors = {
      {"/inputs/query", planned_step.hidden.data, planned_step.hidden.kind, planned_step.hidden.row_stride},
      {"the SSM contribution", planned_step.contribution.data, planned_step.contribution.kind,
       planned_step.contribution.row_stride}};
  for (const auto& [name, pool] : planned_step.pools) {
    tensors.push_back({"/inputs/ssm/" + name, pool.data, pool.kind, pool.slot_size});
  }
  for (const auto& [name, weight] : planned_step.weights) {
    tensors.push_back({"/weights/" + name, weight.ref.data, weight.ref.kind, product(weight.shape)});
  }
  if (prepared_) {
    HYBRIDTB_CHECK(T == num_tokens_, "FixedDecodeStep::prepare: the batch has ", T,
                   " token rows (/batch/slot_mapping) but the step was prepared for ", num_tokens_,
                   " (a fixed step keeps its padded shape; use one step per captured size)");
    HYBRIDTB_CHECK(R == num_reqs_, "FixedDecodeStep::prepare: the batch has ", R,
                   " requests (/batch/query_start_loc) but the step was prepared for ", num_reqs_,
                   " (a fixed step keeps its padded shape; use one step per captured size)");
    for (size_t i = 0; i < std::max(tensors.size(), tensors_.size()); ++i) {
      if (i < tensors.size() && i < tensors_.size() && tensors[i] == tensors_[i]) continue;
      const TensorKey none{"(none)"};
      const TensorKey& now = i < tensors.size() ? tensors[i] : none;
      const TensorKey& then = i < tensors_.size() ? tensors_[i] : none;
      throw Error(detail::concat("FixedDecodeStep::prepare: ", now.name == none.name ? then.name : now.name,
                                 " is not the tensor the step was prepared with (", now.name, " at ", now.data,
                                 ", element kind ", static_cast<int>(now.kind), ", extent ", now.extent, " vs ",
                                 then.name, " at ", then.data, ", element kind ", static_cast<int>(then.kind),
                                 ", extent ", then.extent,
                                 "); a prepared step keeps its tensors: copy new values into them"));
    }
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

  if (!prepared_) {
    plan_ = context_.memory().allocate(std::max<size_t>(packed_.size(), 1) * sizeof(int32_t));
    auto* device = static_cast<int32_t*>(plan_.get());
    step_ = std::move(planned.step);
    step_.config = &config_;
    step_.context = &context_;
    step_.fixed = true;
    step_.num_tokens = T;
    step_.num_decode_tokens = 0;
    step_.active = device;
    step_.boundary_slot = nullptr;
    step_.boundaries.clear();
    GpuWave wave;
    wave.device.requests = reinterpret_cast<const GpuRequest*>(device + T);
    wave.device.num_requests = narrow(R, "the number of requests");
    wave.device.max_tokens = 1;
    step_.waves = {wave};
    step_.fixed_scratch = &scratch_;
    num_tokens_ = T;
    num_reqs_ = R;
    tensors_ = std::move(tensors);
  }
  if (gpu_mode_->uses_cublas()) context_.cublas();
  if (!packed_.empty()) {
    HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(plan_.get(), packed_.data(), packed_.size() * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, context_.stream()));
  }
  prepared_ = true;
}

void FixedDecodeStep::launch() {
  HYBRIDTB_CHECK(prepared_, "FixedDecodeStep::launch called before prepare");
  if (num_tokens_ == 0) return;
  scratch_.rewind();
  gpu_mode_->forward(step_);
  // Rows of skipped requests contribute zeros; padding rows are left alone.
  if (!gpu_mode_->whole_step()) {
    launch_zero_rows(step_.contribution, step_.hidden_size, 0, num_tokens_, step_.active, ZeroRows::kSkipped,
                     context_.stream());
  }
}

}  // namespace hybridtb::cuda::ssm
