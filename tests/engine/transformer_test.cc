// The CPU transformer against a straightforward reference (whole-sequence, double precision, no BLAS, no pages)
// on a tiny size, and the properties Cake's bit-exactness rests on: chunked prefill is deterministic and reads
// only the pages.
#include "examples/cpu_engine/transformer.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "examples/cpu_engine/prefill_engine.h"

using namespace cake;
using namespace cake::engine;

namespace {

TransformerConfig TinyConfig(Storage storage) {
  TransformerConfig c;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.intermediate = 48;
  c.vocab = 37;
  c.seed = 7;
  c.storage = storage;
  return c;
}

std::vector<uint32_t> Prompt(size_t n) {
  std::vector<uint32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint32_t>((i * 7919 + 13) % 1000);
  return p;
}

// Keys and values per layer, [position][kv_head x head_dim], and the next token's logits.
struct Reference {
  std::vector<std::vector<double>> keys, values;
  std::vector<double> logits;
};

double Round(double v, Storage storage) {
  return storage == Storage::kBf16 ? Bf16ToFloat(FloatToBf16(static_cast<float>(v))) : v;
}

// Row vector x [in] times w [in x out].
std::vector<double> MatVec(const std::vector<double>& x, const std::vector<float>& w, size_t out) {
  std::vector<double> y(out, 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t j = 0; j < out; ++j) y[j] += x[i] * w[i * out + j];
  }
  return y;
}

std::vector<double> Norm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double sum = 0;
  for (double v : x) sum += v * v;
  const double inv = 1 / std::sqrt(sum / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

void Rotate(std::vector<double>& x, uint32_t heads, uint32_t d, double position, double theta) {
  for (uint32_t h = 0; h < heads; ++h) {
    for (uint32_t i = 0; i < d / 2; ++i) {
      const double angle = position * std::pow(theta, -2.0 * i / d);
      double& a = x[h * d + i];
      double& b = x[h * d + i + d / 2];
      const double ra = a * std::cos(angle) - b * std::sin(angle), rb = a * std::sin(angle) + b * std::cos(angle);
      a = ra;
      b = rb;
    }
  }
}

// The textbook forward pass over the whole prompt at once: every position through every layer, causal attention
// over the keys so far. Keys and values are rounded to the storage type, as the engine's KV cache holds them.
Reference ReferenceForward(const Transformer& model, const std::vector<uint32_t>& prompt) {
  const TransformerConfig& c = model.config();
  const Weights& w = model.weights();
  const uint32_t h = c.hidden, d = c.head_dim(), group = c.heads / c.kv_heads;
  const size_t n = prompt.size();
  std::vector<std::vector<double>> x(n, std::vector<double>(h));
  for (size_t p = 0; p < n; ++p) {
    for (uint32_t i = 0; i < h; ++i) x[p][i] = w.embed[(prompt[p] % c.vocab) * h + i];
  }
  Reference ref;
  for (uint32_t l = 0; l < c.layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (size_t p = 0; p < n; ++p) {
      const auto normed = Norm(x[p], lw.attn_norm, c.norm_eps);
      q[p] = MatVec(normed, lw.wq, c.heads * d);
      k[p] = MatVec(normed, lw.wk, c.kv_heads * d);
      v[p] = MatVec(normed, lw.wv, c.kv_heads * d);
      Rotate(q[p], c.heads, d, static_cast<double>(p), c.rope_theta);
      Rotate(k[p], c.kv_heads, d, static_cast<double>(p), c.rope_theta);
      for (double& e : k[p]) e = Round(e, c.storage);
      for (double& e : v[p]) e = Round(e, c.storage);
    }
    std::vector<double> layer_keys, layer_values;
    for (size_t p = 0; p < n; ++p) {
      layer_keys.insert(layer_keys.end(), k[p].begin(), k[p].end());
      layer_values.insert(layer_values.end(), v[p].begin(), v[p].end());
    }
    ref.keys.push_back(layer_keys);
    ref.values.push_back(layer_values);
    for (size_t p = 0; p < n; ++p) {
      std::vector<double> attn(c.heads * d, 0.0);
      for (uint32_t head = 0; head < c.heads; ++head) {
        const uint32_t g = head / group;
        std::vector<double> s(p + 1);
        double peak = -1e300;
        for (size_t t = 0; t <= p; ++t) {
          double dot = 0;
          for (uint32_t i = 0; i < d; ++i) dot += q[p][head * d + i] * k[t][g * d + i];
          s[t] = dot / std::sqrt(static_cast<double>(d));
          peak = std::max(peak, s[t]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - peak));
        for (size_t t = 0; t <= p; ++t) {
          for (uint32_t i = 0; i < d; ++i) attn[head * d + i] += s[t] / sum * v[t][g * d + i];
        }
      }
      const auto out = MatVec(attn, lw.wo, h);
      for (uint32_t i = 0; i < h; ++i) x[p][i] += out[i];
      const auto normed = Norm(x[p], lw.mlp_norm, c.norm_eps);
      auto gate = MatVec(normed, lw.w_gate, c.intermediate);
      const auto up = MatVec(normed, lw.w_up, c.intermediate);
      for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      const auto down = MatVec(gate, lw.w_down, h);
      for (uint32_t i = 0; i < h; ++i) x[p][i] += down[i];
    }
  }
  const auto last = Norm(x[n - 1], w.final_norm, c.norm_eps);
  ref.logits.assign(c.vocab, 0.0);
  for (uint32_t t = 0; t < c.vocab; ++t) {
    for (uint32_t i = 0; i < h; ++i) ref.logits[t] += last[i] * w.embed[t * h + i];
  }
  return ref;
}

float ReadValue(const std::byte* at, Storage storage) {
  if (storage == Storage::kFp32) {
    float f;
    std::memcpy(&f, at, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, at, 2);
  return Bf16ToFloat(b);
}

struct PageBuffer {
  PageBuffer(const Transformer& model, uint32_t chunk_tokens, size_t tokens, bool shuffled = false)
      : page_bytes(model.PageBytes(chunk_tokens)), chunks((tokens + chunk_tokens - 1) / chunk_tokens) {
    bytes.assign(page_bytes * chunks, std::byte{0});
    pages.base = bytes.data();
    for (uint32_t c = 0; c < chunks; ++c) {
      // A page table in reverse order: the engine must follow it, not assume page c sits at c.
      pages.offsets.push_back((shuffled ? chunks - 1 - c : c) * page_bytes);
    }
  }
  std::vector<std::byte> Ordered() const {
    std::vector<std::byte> out;
    for (uint64_t off : pages.offsets) out.insert(out.end(), bytes.begin() + off, bytes.begin() + off + page_bytes);
    return out;
  }
  uint64_t page_bytes;
  uint32_t chunks;
  std::vector<std::byte> bytes;
  KvPages pages;
};

}  // namespace

TEST_CASE("chunked prefill agrees with a whole-sequence reference", "[engine]") {
  for (Storage storage : {Storage::kFp32, Storage::kBf16}) {
    CAPTURE(storage == Storage::kFp32 ? "fp32" : "bf16");
    const TransformerConfig config = TinyConfig(storage);
    REQUIRE(config.Validate().ok());
    Transformer model(config);
    const uint32_t chunk_tokens = 16;
    const auto prompt = Prompt(41);  // two full chunks and a partial one
    PageBuffer buffer(model, chunk_tokens, prompt.size());
    for (uint32_t c = 0; c < buffer.chunks; ++c) model.PrefillChunk(prompt, c, chunk_tokens, buffer.pages);
    const std::vector<float> logits = model.NextTokenLogits(prompt, chunk_tokens, buffer.pages);
    const Reference ref = ReferenceForward(model, prompt);

    // fp32 agrees to float rounding; under bf16 a rounding step of a key or value can land on the neighbouring
    // bf16 value, hence the looser bound there (one bf16 step relative is 2^-8).
    const double tolerance = storage == Storage::kFp32 ? 2e-4 : 1.6e-2;
    const uint32_t width = config.kv_heads * config.head_dim();
    const uint32_t value_bytes = storage == Storage::kFp32 ? 4 : 2;
    double worst = 0;
    for (uint32_t l = 0; l < config.layers; ++l) {
      for (uint32_t which = 0; which < 2; ++which) {
        const auto& expected = which == 0 ? ref.keys[l] : ref.values[l];
        for (size_t p = 0; p < prompt.size(); ++p) {
          const std::byte* page = buffer.bytes.data() + buffer.pages.offsets[p / chunk_tokens];
          for (uint32_t i = 0; i < width; ++i) {
            const std::byte* at =
                page + ((l * 2 + which) * chunk_tokens + p % chunk_tokens) * width * value_bytes + i * value_bytes;
            const double e = expected[p * width + i];
            worst = std::max(worst, std::abs(ReadValue(at, storage) - e) / (1 + std::abs(e)));
          }
        }
      }
    }
    CHECK(worst <= tolerance);
    double worst_logit = 0;
    for (uint32_t t = 0; t < config.vocab; ++t) {
      worst_logit = std::max(worst_logit, std::abs(logits[t] - ref.logits[t]) / (1 + std::abs(ref.logits[t])));
    }
    CHECK(worst_logit <= tolerance);
    INFO("worst KV error " << worst << ", worst logit error " << worst_logit);
    const auto best = std::max_element(ref.logits.begin(), ref.logits.end()) - ref.logits.begin();
    // The greedy token agrees unless the reference's top two are closer than the tolerance.
    std::vector<double> sorted = ref.logits;
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] > 2 * tolerance * (1 + std::abs(sorted[0]))) {
      CHECK(model.FirstToken(prompt, chunk_tokens, buffer.pages) == static_cast<uint32_t>(best));
    }
  }
}

TEST_CASE("prefill is deterministic and follows the page table", "[engine]") {
  Transformer model(TinyConfig(Storage::kFp32));
  const uint32_t chunk_tokens = 16;
  const auto prompt = Prompt(64);
  PageBuffer in_order(model, chunk_tokens, prompt.size());
  PageBuffer reversed(model, chunk_tokens, prompt.size(), /*shuffled=*/true);
  for (uint32_t c = 0; c < in_order.chunks; ++c) {
    model.PrefillChunk(prompt, c, chunk_tokens, in_order.pages);
    model.PrefillChunk(prompt, c, chunk_tokens, reversed.pages);
  }
  CHECK(in_order.Ordered() == reversed.Ordered());
  CHECK(model.FirstToken(prompt, chunk_tokens, in_order.pages) ==
        model.FirstToken(prompt, chunk_tokens, reversed.pages));
  // A chunk recomputed after its successors' pages exist writes the same bytes: it reads only earlier tokens.
  const std::vector<std::byte> before = in_order.Ordered();
  model.PrefillChunk(prompt, 1, chunk_tokens, in_order.pages);
  CHECK(in_order.Ordered() == before);
  // The same seed is the same model; another seed is another model.
  Transformer again(TinyConfig(Storage::kFp32));
  CHECK(again.weights().layers[1].w_down == model.weights().layers[1].w_down);
  TransformerConfig other = TinyConfig(Storage::kFp32);
  other.seed = 8;
  CHECK(Transformer(other).weights().layers[1].w_down != model.weights().layers[1].w_down);
}

TEST_CASE("the page layout is the namespace's", "[engine]") {
  Transformer model(TinyConfig(Storage::kBf16));
  const NamespaceSpec spec = model.Namespace(16);
  auto ns = Namespace::Create(spec);
  REQUIRE(ns.ok());
  CHECK(ns->chunk_bytes() == model.PageBytes(16));
  CHECK(spec.dtype == DType::kBf16);
  CHECK(spec.num_kv_heads == 2);
  CHECK(spec.head_dim == 8);
}

TEST_CASE("bad transformer shapes are refused with the field named", "[engine]") {
  TransformerConfig c = TinyConfig(Storage::kFp32);
  c.kv_heads = 3;
  CHECK(c.Validate().message().find("kv_heads") != std::string::npos);
  c = TinyConfig(Storage::kFp32);
  c.hidden = 30;
  CHECK(c.Validate().message().find("hidden") != std::string::npos);
  c = TinyConfig(Storage::kFp32);
  c.layers = 0;
  CHECK(c.Validate().message().find("layers") != std::string::npos);
}

TEST_CASE("the chunk-time fit recovers a line and measures its error", "[engine]") {
  std::vector<double> line;
  for (int i = 0; i < 10; ++i) line.push_back(0.02 + 0.003 * i);
  LinearFit fit = FitChunkTimes(line);
  CHECK(std::abs(fit.first_s - 0.02) < 1e-12);
  CHECK(std::abs(fit.growth_s - 0.003) < 1e-12);
  CHECK(fit.r_squared > 0.999999);
  CHECK(fit.max_relative_error < 1e-9);
  line[4] *= 1.5;
  fit = FitChunkTimes(line);
  CHECK(fit.r_squared < 0.99);
  CHECK(fit.max_relative_error > 0.2);
}

TEST_CASE("bf16 rounds to nearest even", "[engine]") {
  CHECK(FloatToBf16(1.0f) == 0x3f80);
  CHECK(Bf16ToFloat(0x3f80) == 1.0f);
  // 1 + 2^-8 is halfway between 1 and the next bf16 (1 + 2^-7): ties go to the even one, 1.
  CHECK(FloatToBf16(1.0f + 0x1.0p-8f) == 0x3f80);
  CHECK(FloatToBf16(1.0f + 0x1.8p-8f) == 0x3f81);
  CHECK(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}
