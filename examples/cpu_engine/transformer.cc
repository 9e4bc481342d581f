#include "examples/cpu_engine/transformer.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace cake::engine {
namespace {

// splitmix64: a tiny generator whose stream is fixed by the seed on every platform, unlike std's distributions.
class WeightStream {
 public:
  explicit WeightStream(uint64_t seed) : state_(seed) {}
  // Uniform in [-1, 1).
  float Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }

 private:
  uint64_t state_;
};

// Variance 1 / fan_in (uniform on +-sqrt(3 / fan_in)), so activations keep their scale through the layers.
std::vector<float> Projection(WeightStream& stream, uint32_t in, uint32_t out) {
  std::vector<float> w(static_cast<size_t>(in) * out);
  const float scale = std::sqrt(3.0f / static_cast<float>(in));
  for (float& v : w) v = stream.Next() * scale;
  return w;
}

std::vector<float> NormWeights(WeightStream& stream, uint32_t size) {
  std::vector<float> w(size);
  for (float& v : w) v = 1.0f + 0.1f * stream.Next();
  return w;
}

void RoundToBf16(std::vector<float>& values) {
  for (float& v : values) v = Bf16ToFloat(FloatToBf16(v));
}

// out = rows x weights, [m x k] times [k x n]; beta 1 accumulates into out (the residual adds).
void Gemm(const float* rows, uint32_t m, uint32_t k, const float* weights, uint32_t n, float* out, float beta = 0) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, rows, static_cast<int>(k), weights, static_cast<int>(n), beta, out, static_cast<int>(n));
}

void RmsNorm(const float* in, uint32_t rows, uint32_t width, const std::vector<float>& weight, float eps, float* out) {
  for (uint32_t r = 0; r < rows; ++r) {
    const float* x = in + static_cast<size_t>(r) * width;
    float* y = out + static_cast<size_t>(r) * width;
    double sum = 0;
    for (uint32_t i = 0; i < width; ++i) sum += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum / width + eps));
    for (uint32_t i = 0; i < width; ++i) y[i] = x[i] * inv * weight[i];
  }
}

// Rotary embedding, Llama's half-split form: dimension i pairs with i + head_dim / 2.
void Rope(float* rows, uint32_t count, uint32_t heads, uint32_t head_dim, uint32_t first_position, float theta) {
  const uint32_t half = head_dim / 2;
  for (uint32_t r = 0; r < count; ++r) {
    const double position = first_position + r;
    for (uint32_t i = 0; i < half; ++i) {
      const double angle = position * std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
      const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
      for (uint32_t h = 0; h < heads; ++h) {
        float* x = rows + (static_cast<size_t>(r) * heads + h) * head_dim;
        const float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = a * s + b * c;
      }
    }
  }
}

}  // namespace

uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFloat(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

void SetBlasThreads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

absl::Status TransformerConfig::Validate() const {
  if (layers == 0) return absl::InvalidArgumentError("layers must be positive");
  if (hidden == 0 || heads == 0 || hidden % heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden (", hidden, ") must be a positive multiple of heads (", heads, ")"));
  }
  if (head_dim() % 2 != 0) return absl::InvalidArgumentError("hidden / heads must be even (rotary pairs)");
  if (kv_heads == 0 || heads % kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("heads (", heads, ") must be a multiple of kv_heads (", kv_heads, ")"));
  }
  if (intermediate == 0) return absl::InvalidArgumentError("intermediate must be positive");
  if (vocab < 2) return absl::InvalidArgumentError("vocab must be at least 2");
  return absl::OkStatus();
}

double TransformerConfig::FlopPerToken() const {
  const double h = hidden, d = head_dim();
  const double per_layer = h * heads * d + 2 * h * kv_heads * d + heads * d * h + 3 * h * intermediate;
  return 2 * (layers * per_layer + h * vocab);
}

Transformer::Transformer(const TransformerConfig& config)
    : config_(config), value_bytes_(config.storage == Storage::kFp32 ? 4 : 2) {
  WeightStream stream(config.seed);
  const uint32_t h = config.hidden, d = config.head_dim(), i = config.intermediate;
  weights_.embed.resize(static_cast<size_t>(config.vocab) * h);
  for (float& v : weights_.embed) v = stream.Next();
  for (uint32_t l = 0; l < config.layers; ++l) {
    LayerWeights w;
    w.attn_norm = NormWeights(stream, h);
    w.wq = Projection(stream, h, config.heads * d);
    w.wk = Projection(stream, h, config.kv_heads * d);
    w.wv = Projection(stream, h, config.kv_heads * d);
    w.wo = Projection(stream, config.heads * d, h);
    w.mlp_norm = NormWeights(stream, h);
    w.w_gate = Projection(stream, h, i);
    w.w_up = Projection(stream, h, i);
    w.w_down = Projection(stream, i, h);
    weights_.layers.push_back(std::move(w));
  }
  weights_.final_norm = NormWeights(stream, h);
  if (config.storage == Storage::kBf16) {
    RoundToBf16(weights_.embed);
    RoundToBf16(weights_.final_norm);
    for (LayerWeights& w : weights_.layers) {
      for (auto* m : {&w.attn_norm, &w.wq, &w.wk, &w.wv, &w.wo, &w.mlp_norm, &w.w_gate, &w.w_up, &w.w_down}) {
        RoundToBf16(*m);
      }
    }
  }
}

NamespaceSpec Transformer::Namespace(uint32_t chunk_tokens, std::string model_id) const {
  NamespaceSpec spec;
  spec.model_id = model_id.empty()
                      ? absl::StrCat("cake-engine-l", config_.layers, "-h", config_.hidden, "-q", config_.heads, "-kv",
                                     config_.kv_heads, "-i", config_.intermediate, "-v", config_.vocab, "-seed",
                                     config_.seed, config_.storage == Storage::kFp32 ? "-fp32" : "-bf16")
                      : std::move(model_id);
  spec.num_layers = config_.layers;
  spec.num_kv_heads = config_.kv_heads;
  spec.head_dim = config_.head_dim();
  spec.dtype = config_.storage == Storage::kFp32 ? DType::kFp32 : DType::kBf16;
  spec.chunk_tokens = chunk_tokens;
  return spec;
}

uint64_t Transformer::PageBytes(uint32_t chunk_tokens) const {
  return uint64_t{2} * config_.layers * chunk_tokens * config_.kv_heads * config_.head_dim() * value_bytes_;
}

void Transformer::StoreKv(const float* rows, uint32_t first, uint32_t count, uint32_t layer, uint32_t which,
                          uint32_t chunk_tokens, const KvPages& pages) const {
  const uint32_t width = config_.kv_heads * config_.head_dim();
  for (uint32_t r = 0; r < count; ++r) {
    const uint32_t position = first + r;
    std::byte* page = pages.base + pages.offsets[position / chunk_tokens];
    std::byte* dst = page + ((static_cast<uint64_t>(layer) * 2 + which) * chunk_tokens + position % chunk_tokens) *
                                width * value_bytes_;
    const float* src = rows + static_cast<size_t>(r) * width;
    if (config_.storage == Storage::kFp32) {
      std::memcpy(dst, src, width * sizeof(float));
    } else {
      for (uint32_t i = 0; i < width; ++i) {
        const uint16_t b = FloatToBf16(src[i]);
        std::memcpy(dst + i * 2, &b, 2);
      }
    }
  }
}

void Transformer::GatherKv(uint32_t tokens, uint32_t layer, uint32_t which, uint32_t kv_head, uint32_t chunk_tokens,
                           const KvPages& pages, float* out) const {
  const uint32_t d = config_.head_dim();
  const uint32_t width = config_.kv_heads * d;
  for (uint32_t t = 0; t < tokens; ++t) {
    const std::byte* page = pages.base + pages.offsets[t / chunk_tokens];
    const std::byte* src =
        page + (((static_cast<uint64_t>(layer) * 2 + which) * chunk_tokens + t % chunk_tokens) * width +
                static_cast<uint64_t>(kv_head) * d) *
                   value_bytes_;
    float* dst = out + static_cast<size_t>(t) * d;
    if (config_.storage == Storage::kFp32) {
      std::memcpy(dst, src, d * sizeof(float));
    } else {
      for (uint32_t i = 0; i < d; ++i) {
        uint16_t b;
        std::memcpy(&b, src + i * 2, 2);
        dst[i] = Bf16ToFloat(b);
      }
    }
  }
}

void Transformer::Forward(std::span<const uint32_t> prompt, uint32_t first, uint32_t count, uint32_t chunk_tokens,
                          const KvPages& pages, bool write_kv) {
  const uint32_t h = config_.hidden, d = config_.head_dim(), nh = config_.heads, nkv = config_.kv_heads;
  const uint32_t inter = config_.intermediate, group = nh / nkv;
  const uint32_t keys = first + count;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  x_.resize(static_cast<size_t>(count) * h);
  normed_.resize(x_.size());
  q_.resize(static_cast<size_t>(count) * nh * d);
  attn_.resize(q_.size());
  k_.resize(static_cast<size_t>(count) * nkv * d);
  v_.resize(k_.size());
  gate_.resize(static_cast<size_t>(count) * inter);
  up_.resize(gate_.size());
  scores_.resize(static_cast<size_t>(count) * keys);
  keys_.resize(static_cast<size_t>(keys) * d);
  values_.resize(keys_.size());
  for (uint32_t r = 0; r < count; ++r) {
    const uint32_t token = prompt[first + r] % config_.vocab;
    std::memcpy(&x_[static_cast<size_t>(r) * h], &weights_.embed[static_cast<size_t>(token) * h], h * sizeof(float));
  }
  for (uint32_t layer = 0; layer < config_.layers; ++layer) {
    const LayerWeights& w = weights_.layers[layer];
    RmsNorm(x_.data(), count, h, w.attn_norm, config_.norm_eps, normed_.data());
    Gemm(normed_.data(), count, h, w.wq.data(), nh * d, q_.data());
    Gemm(normed_.data(), count, h, w.wk.data(), nkv * d, k_.data());
    Gemm(normed_.data(), count, h, w.wv.data(), nkv * d, v_.data());
    Rope(q_.data(), count, nh, d, first, config_.rope_theta);
    Rope(k_.data(), count, nkv, d, first, config_.rope_theta);
    if (write_kv) {
      StoreKv(k_.data(), first, count, layer, 0, chunk_tokens, pages);
      StoreKv(v_.data(), first, count, layer, 1, chunk_tokens, pages);
    }
    for (uint32_t g = 0; g < nkv; ++g) {
      // Every key and value comes from the pages, this chunk's own included: the arithmetic cannot tell a
      // computed page from a loaded one.
      GatherKv(keys, layer, 0, g, chunk_tokens, pages, keys_.data());
      GatherKv(keys, layer, 1, g, chunk_tokens, pages, values_.data());
      for (uint32_t j = 0; j < group; ++j) {
        const uint32_t head = g * group + j;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(count), static_cast<int>(keys),
                    static_cast<int>(d), scale, &q_[head * d], static_cast<int>(nh * d), keys_.data(),
                    static_cast<int>(d), 0.0f, scores_.data(), static_cast<int>(keys));
        for (uint32_t r = 0; r < count; ++r) {
          float* row = &scores_[static_cast<size_t>(r) * keys];
          const uint32_t visible = first + r + 1;  // causal: a position sees itself and what came before
          const float peak = *std::max_element(row, row + visible);
          float sum = 0;
          for (uint32_t t = 0; t < visible; ++t) {
            row[t] = std::exp(row[t] - peak);
            sum += row[t];
          }
          const float inv = 1.0f / sum;
          for (uint32_t t = 0; t < visible; ++t) row[t] *= inv;
          std::fill(row + visible, row + keys, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(count), static_cast<int>(d),
                    static_cast<int>(keys), 1.0f, scores_.data(), static_cast<int>(keys), values_.data(),
                    static_cast<int>(d), 0.0f, &attn_[head * d], static_cast<int>(nh * d));
      }
    }
    Gemm(attn_.data(), count, nh * d, w.wo.data(), h, x_.data(), 1.0f);
    RmsNorm(x_.data(), count, h, w.mlp_norm, config_.norm_eps, normed_.data());
    Gemm(normed_.data(), count, h, w.w_gate.data(), inter, gate_.data());
    Gemm(normed_.data(), count, h, w.w_up.data(), inter, up_.data());
    for (size_t i = 0; i < gate_.size(); ++i) {
      const float g = gate_[i];
      gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];  // SwiGLU: silu(gate) x up
    }
    Gemm(gate_.data(), count, inter, w.w_down.data(), h, x_.data(), 1.0f);
  }
  hidden_.resize(x_.size());
  RmsNorm(x_.data(), count, h, weights_.final_norm, config_.norm_eps, hidden_.data());
}

void Transformer::PrefillChunk(std::span<const uint32_t> prompt, uint32_t chunk, uint32_t chunk_tokens,
                               const KvPages& pages) {
  const uint32_t first = chunk * chunk_tokens;
  const uint32_t count = std::min<uint32_t>(chunk_tokens, static_cast<uint32_t>(prompt.size()) - first);
  Forward(prompt, first, count, chunk_tokens, pages, /*write_kv=*/true);
}

std::vector<float> Transformer::NextTokenLogits(std::span<const uint32_t> prompt, uint32_t chunk_tokens,
                                                const KvPages& pages) {
  const uint32_t last = static_cast<uint32_t>(prompt.size()) - 1;
  Forward(prompt, last, 1, chunk_tokens, pages, /*write_kv=*/false);
  std::vector<float> logits(config_.vocab);
  cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(config_.vocab), static_cast<int>(config_.hidden), 1.0f,
              weights_.embed.data(), static_cast<int>(config_.hidden), hidden_.data(), 1, 0.0f, logits.data(), 1);
  return logits;
}

uint32_t Transformer::FirstToken(std::span<const uint32_t> prompt, uint32_t chunk_tokens, const KvPages& pages) {
  const std::vector<float> logits = NextTokenLogits(prompt, chunk_tokens, pages);
  return static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace cake::engine
