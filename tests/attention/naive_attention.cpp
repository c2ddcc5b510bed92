// The naive attention formula of naive_attention.h. Deliberately shares no code with the
// reference: a different mask formulation, a per-key loop, weights as exp(s − logsumexp).
#include "naive_attention.h"

#include <cmath>
#include <cstdlib>

namespace hybridtb::testing {
namespace {

// Window as an interval of allowed keys [p − (W − 1), p] (decoder) or [p − (W − 1), p + (W − 1)]
// (encoder_only), plus the multimodal ranges for decoders.
bool sees(const NaiveLayer& layer, const NaiveRequest& request, int64_t p, int64_t k) {
  const int64_t seq_len = request.context_len + request.query_len;
  if (k >= seq_len) return false;
  const int64_t lowest = layer.window > 0 ? p - (layer.window - 1) : 0;
  if (layer.bidirectional) {
    const int64_t highest = layer.window > 0 ? p + (layer.window - 1) : seq_len - 1;
    return lowest <= k && k <= highest;
  }
  if (lowest <= k && k <= p) return true;
  for (const auto& [first, last] : request.mm_ranges) {
    const bool in_range = first < last;
    if (in_range && first <= p && p <= last && first <= k && k <= last) return true;
  }
  return false;
}

}  // namespace

std::vector<double> naive_attention(const NaiveLayer& layer, const NaiveRequest& request) {
  const int64_t hq = layer.num_heads;
  const int64_t d = layer.head_size;
  const int64_t group = layer.num_heads / layer.num_kv_heads;
  const int64_t seq_len = request.context_len + request.query_len;
  std::vector<double> out(static_cast<size_t>(request.query_len * hq * d), 0.0);

  for (int64_t i = 0; i < request.query_len; ++i) {
    const int64_t p = request.context_len + i;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / group;
      std::vector<int64_t> key_index;
      std::vector<double> score;
      for (int64_t k = 0; k < seq_len; ++k) {
        if (!sees(layer, request, p, k)) continue;
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          dot += request.q[static_cast<size_t>((i * hq + h) * d + c)] *
                 request.k[static_cast<size_t>((k * layer.num_kv_heads + g) * d + c)];
        }
        double x = dot * layer.scale;
        if (layer.soft_cap > 0.0) x = std::tanh(x / layer.soft_cap) * layer.soft_cap;
        if (!layer.alibi.empty()) {
          if (layer.alibi_sqrt) {
            x -= k <= p ? layer.alibi[static_cast<size_t>(h)] * std::sqrt(static_cast<double>(p - k)) : 0.0;
          } else {
            x += layer.alibi[static_cast<size_t>(h)] * static_cast<double>(k - request.context_len);
          }
        }
        key_index.push_back(k);
        score.push_back(x);
      }
      if (score.empty()) continue;  // stays 0

      double peak = layer.sinks.empty() ? score[0] : layer.sinks[static_cast<size_t>(h)];
      for (double x : score) peak = std::fmax(peak, x);
      double total = layer.sinks.empty() ? 0.0 : std::exp(layer.sinks[static_cast<size_t>(h)] - peak);
      for (double x : score) total += std::exp(x - peak);
      const double log_sum_exp = peak + std::log(total);

      for (size_t j = 0; j < score.size(); ++j) {
        const double weight = std::exp(score[j] - log_sum_exp);
        for (int64_t c = 0; c < d; ++c) {
          out[static_cast<size_t>((i * hq + h) * d + c)] +=
              weight * request.v[static_cast<size_t>((key_index[j] * layer.num_kv_heads + g) * d + c)];
        }
      }
      if (layer.output_scale) {
        for (int64_t c = 0; c < d; ++c) {
          double& o = out[static_cast<size_t>((i * hq + h) * d + c)];
          o = o / *layer.output_scale;
          if (o > 448.0) o = 448.0;
          if (o < -448.0) o = -448.0;
        }
      }
    }
  }
  return out;
}

NaiveLayer naive_layer(const AttentionConfig& config, const StepTensors& tensors) {
  NaiveLayer layer;
  layer.num_heads = config.num_heads;
  layer.num_kv_heads = config.num_kv_heads;
  layer.head_size = config.head_size;
  layer.scale = config.scale;
  layer.window = config.sliding_window;
  layer.bidirectional = config.attn_type == AttnType::kEncoderOnly;
  if (!layer.bidirectional) {
    layer.output_scale = tensors.output_scale;
    layer.soft_cap = config.logits_soft_cap;
    if (config.alibi_slopes) {
      for (float s : *config.alibi_slopes) layer.alibi.push_back(s);
    }
    layer.alibi_sqrt = config.use_alibi_sqrt;
    if (config.sinks) {
      for (float s : *config.sinks) layer.sinks.push_back(s);
    }
  }
  return layer;
}

NaiveRequest naive_request(const AttentionConfig& config, const BatchDescription& batch, const StepTensors& tensors,
                           int64_t r) {
  NaiveRequest request;
  const int64_t start = batch.query_start_loc[r];
  request.query_len = batch.query_start_loc[r + 1] - start;
  const int64_t seq_len = batch.seq_lens[r];
  request.context_len = seq_len - request.query_len;
  const int64_t hq = config.num_heads, hkv = config.num_kv_heads, d = config.head_size;

  for (int64_t i = 0; i < request.query_len; ++i) {
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t c = 0; c < d; ++c) {
        request.q.push_back(load_as_double(tensors.query.data(), tensors.query.dtype(),
                                           tensors.query.offset({start + i, h, c})));
      }
    }
  }

  for (int64_t k = 0; k < seq_len; ++k) {
    for (int64_t g = 0; g < hkv; ++g) {
      for (int64_t c = 0; c < d; ++c) {
        if (config.attn_type == AttnType::kEncoderOnly) {
          request.k.push_back(load_as_double(tensors.key.data(), tensors.key.dtype(), tensors.key.offset({start + k, g, c})));
          request.v.push_back(
              load_as_double(tensors.value.data(), tensors.value.dtype(), tensors.value.offset({start + k, g, c})));
          continue;
        }
        const TensorView& cache = tensors.kv_cache;
        const int64_t page = batch.block_table.at(r, k / config.block_size);
        const int64_t in_page = k % config.block_size;
        double key = load_as_double(cache.data(), cache.dtype(), cache.offset({page, 0, in_page, g, c}));
        double value = load_as_double(cache.data(), cache.dtype(), cache.offset({page, 1, in_page, g, c}));
        switch (config.kv_cache_dtype) {
          case KvCacheDtype::kAuto:
            break;
          case KvCacheDtype::kFp8E4M3:
          case KvCacheDtype::kFp8E5M2:
            key *= static_cast<double>(tensors.k_scale);
            value *= static_cast<double>(tensors.v_scale);
            break;
          case KvCacheDtype::kInt8PerTokenHead:
          case KvCacheDtype::kFp8PerTokenHead: {
            const auto* ks = static_cast<const float*>(tensors.k_scale_cache.data());
            const auto* vs = static_cast<const float*>(tensors.v_scale_cache.data());
            key *= static_cast<double>(ks[tensors.k_scale_cache.offset({page, in_page, g})]);
            value *= static_cast<double>(vs[tensors.v_scale_cache.offset({page, in_page, g})]);
            break;
          }
        }
        request.k.push_back(key);
        request.v.push_back(value);
      }
    }
  }

  if (batch.mm_prefix_range) {
    const IntArray& mm = *batch.mm_prefix_range;
    for (int64_t m = 0; m < mm.size(1); ++m) {
      const size_t base = static_cast<size_t>((r * mm.size(1) + m) * 2);
      request.mm_ranges.emplace_back(mm.values[base], mm.values[base + 1]);
    }
  }
  return request;
}

}  // namespace hybridtb::testing
