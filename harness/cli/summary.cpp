// Summaries printed by `hybridtb run` and `hybridtb info`.
#include "summary.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>

#include "hybridtb/engine_rules.h"
#include "hybridtb/linear_layer.h"

namespace hybridtb::cli {

namespace {

// The engine version and the rules it selects (engine_rules.h), e.g. "vllm 0.33.0: padding state
// index 0, skips state index <= 0, mamba_cache_mode align | none, ...".
std::string describe_engine(const AttentionConfig& c) {
  const EngineRules& r = engine_rules(c);
  std::ostringstream out;
  out << (c.engine_version.empty() ? std::string("none (no /config engine_version: the unversioned rules)")
                                   : c.engine_version)
      << ": padding state index " << r.padding_state_index() << ", skips state index "
      << (r.state_index_skip == StateIndexSkip::kNegative ? "< 0" : "<= 0") << ", mamba_cache_mode "
      << r.mamba_cache_modes_text() << ", a short request without context is a "
      << (r.short_extends_are_decodes() ? "decode" : "prefill") << ", conv state "
      << to_string(r.conv_state_layout) << ", norm eps ";
  if (c.norm_eps) {
    out << *c.norm_eps;
  } else {
    out << (r.norm_eps_from_config ? "the model family's default" : "fixed (gdn 1e-6, mamba2 1e-5)");
  }
  return out.str();
}

}  // namespace

void print_config(std::ostream& out, const AttentionConfig& c, const BuilderConfig& b) {
  if (c.is_linear_layer()) {
    out << "layer:    " << to_string(c.layer_kind) << " (linear attention: the ssm_mode " << c.ssm_mode
        << " core on /inputs";
    for (const LinearInput& input : linear_layer_spec(c).inputs) out << " " << input.name << "[T, " << input.width << "]";
    out << "; the attention attributes below are the model's attention layers')\n";
  }
  out << "config:   heads " << c.num_heads << "/" << c.num_kv_heads << " (q/kv), head_size " << c.head_size
      << ", block_size " << c.block_size << ", scale " << c.scale << "\n"
      << "          dtype " << to_string(c.dtype) << ", kv_cache " << to_string(c.kv_cache_dtype) << ", "
      << to_string(c.attn_type) << ", window " << (c.sliding_window ? std::to_string(c.sliding_window) : "none")
      << ", soft_cap " << (c.logits_soft_cap > 0 ? std::to_string(c.logits_soft_cap) : "off") << "\n"
      << "          alibi " << (c.alibi_slopes ? (c.use_alibi_sqrt ? "sqrt" : "linear") : "off") << ", sinks "
      << (c.sinks ? "on" : "off") << ", ssm_mode " << c.ssm_mode << ", mamba_cache_mode "
      << to_string(c.mamba_cache_mode) << " (block " << c.mamba_block_size << "), speculative tokens "
      << c.num_speculative_tokens << "\n"
      << "engine:   " << describe_engine(c) << "\n"
      << "builder:  cudagraph_mode " << to_string(b.cudagraph_mode) << ", capture sizes "
      << b.cudagraph_capture_sizes.size() << ", max_num_seqs " << b.max_num_seqs << "\n";
}

void print_batch(std::ostream& out, const BatchDescription& b) {
  int64_t decodes = 0, prefills = 0, padding = 0, context = 0;
  for (int64_t r = 0; r < b.num_reqs(); ++r) {
    if (b.query_len(r) == 0) {
      ++padding;
    } else if (b.query_len(r) == 1) {
      ++decodes;
    } else {
      ++prefills;
    }
    context += b.context_len(r);
  }
  out << "batch:    " << b.num_reqs() << " requests (" << decodes << " single-token, " << prefills
      << " multi-token, " << padding << " padding), " << b.num_actual_tokens << " tokens + "
      << b.num_tokens() - b.num_actual_tokens << " padding rows, max query " << b.max_query_len()
      << ", max seq " << b.max_seq_len() << ", total context " << context << "\n";
}

void print_metadata(std::ostream& out, const HybridMetadata& m) {
  out << "metadata: ";
  if (m.mamba) {
    out << "split " << m.mamba->num_decodes << " decodes (" << m.mamba->num_decode_tokens << " tokens) + "
        << m.mamba->num_prefills << " prefills (" << m.mamba->num_prefill_tokens << " tokens); ";
  } else {
    out << "no SSM-state metadata (encoder-only layer); ";
  }
  out << "attention path " << (m.attention.use_3d_path ? "3D (split softmax)" : "2D") << ", seq_threshold_3D "
      << m.attention.seq_threshold_3d << (m.mamba && m.mamba->cudagraph_padded ? ", CUDA-graph padded" : "") << "\n";
}

namespace {
void print_tensor_stats(std::ostream& out, const char* label, const BatchFile& file, const TensorView& v) {
  if (v.empty()) return;
  const int64_t row = v.numel() / std::max<int64_t>(1, v.size(0));  // [T, Hq, D], or a linear layer's [T, width]
  const int64_t real = file.batch.num_actual_tokens * row;
  double max_abs = 0.0, sum_sq = 0.0;
  int64_t non_finite = 0, padding_written = 0;
  for (int64_t i = 0; i < v.numel(); ++i) {
    const double x = load_as_double(v.data(), v.dtype(), i);
    if (i < real) {
      if (!std::isfinite(x)) {
        ++non_finite;
      } else {
        max_abs = std::max(max_abs, std::fabs(x));
        sum_sq += x * x;
      }
    } else if (!std::isnan(x)) {
      ++padding_written;
    }
  }
  out << label << " " << to_string(v.dtype()) << " " << shape_to_string(v.shape()) << ": max |x| " << max_abs
      << ", rms " << (real > 0 ? std::sqrt(sum_sq / static_cast<double>(real)) : 0.0) << ", non-finite "
      << non_finite << ", padding elements written " << padding_written << "\n";
}
}  // namespace

void print_outputs(std::ostream& out, const BatchFile& file, const StepOutputs& o) {
  print_tensor_stats(out, "output:   ", file, o.output);  // a linear layer's: its core's (see the layer line)
  print_tensor_stats(out, "attention:", file, o.attn_output);
  if (!o.ssm_output.empty()) print_tensor_stats(out, "ssm:      ", file, o.ssm_output);
  for (const auto& [name, pool] : o.ssm_state) {
    out << "ssm pool: " << name << " " << pool.view().describe() << "\n";
  }
}

}  // namespace hybridtb::cli
