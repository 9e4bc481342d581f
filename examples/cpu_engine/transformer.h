// A small decoder-only transformer in the Llama shape (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU
// MLP) that prefills on the CPU through OpenBLAS, chunk by chunk, into a paged KV cache laid out as the daemon's
// namespace declares it. It exists so Cake's split can be measured with real compute and the KV cache Cake
// assembles (computed front, loaded back) can be proven equal to full compute, byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "keys/namespace.h"

namespace cake::engine {

// How the KV cache (and the weights' values) are stored; activations are always fp32.
enum class Storage { kFp32, kBf16 };

struct TransformerConfig {
  uint32_t layers = 8;
  uint32_t hidden = 512;
  uint32_t heads = 8;
  uint32_t kv_heads = 8;
  uint32_t intermediate = 1408;
  uint32_t vocab = 512;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  uint64_t seed = 1;
  Storage storage = Storage::kFp32;

  uint32_t head_dim() const { return hidden / heads; }
  // INVALID_ARGUMENT naming the first bad field.
  absl::Status Validate() const;
  // Multiply-adds of the weights per token, times two: the cost model's "2 x parameters" per token.
  double FlopPerToken() const;
};

// Row-major weights: a projection is [inputs x outputs], so activations (rows) times weights is one GEMM. Under
// bf16 storage every value is rounded to bf16 and kept as fp32 for the BLAS.
struct LayerWeights {
  std::vector<float> attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
};
struct Weights {
  std::vector<float> embed;  // [vocab x hidden], also the output projection (tied)
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
};

// Where each chunk's KV page lives. A page holds one chunk of `chunk_tokens` tokens, layer-major: for each layer
// the keys then the values, each [chunk_tokens][kv_heads][head_dim] in the storage type (vLLM's block layout).
// Its size is exactly the namespace's chunk bytes, so a page is what the daemon stores and loads.
struct KvPages {
  std::byte* base = nullptr;
  std::vector<uint64_t> offsets;  // page c at base + offsets[c]
};

class Transformer {
 public:
  // Weights drawn from config.seed: the same seed gives the same model on every machine.
  explicit Transformer(const TransformerConfig& config);

  const TransformerConfig& config() const { return config_; }
  const Weights& weights() const { return weights_; }

  // The namespace whose layout the pages follow, with `chunk_tokens` tokens per chunk.
  NamespaceSpec Namespace(uint32_t chunk_tokens, std::string model_id = "") const;
  uint64_t PageBytes(uint32_t chunk_tokens) const;

  // Computes chunk `chunk` of `prompt` (tokens [chunk x T, min((chunk + 1) x T, size))), reading every earlier
  // token's keys and values from `pages` and writing the chunk's own into its page. The chunk's own keys are read
  // back from the page too, so a chunk computed after loaded pages sees exactly what it would after computed ones.
  // Not thread-safe (scratch buffers are reused).
  void PrefillChunk(std::span<const uint32_t> prompt, uint32_t chunk, uint32_t chunk_tokens, const KvPages& pages);

  // The logits of the token after the prompt: the last prompt position run again as a single query against the
  // whole cached prompt in `pages` (as an engine does on a full cache hit), writing nothing.
  std::vector<float> NextTokenLogits(std::span<const uint32_t> prompt, uint32_t chunk_tokens, const KvPages& pages);
  // Greedy: the highest logit, the lowest id on a tie.
  uint32_t FirstToken(std::span<const uint32_t> prompt, uint32_t chunk_tokens, const KvPages& pages);

 private:
  // Positions [first, first + count) of the prompt through every layer, attending to keys [0, first + count) from
  // the pages; writes their keys and values into the pages when `write_kv`. Leaves the final hidden states
  // (after the last norm) in hidden_.
  void Forward(std::span<const uint32_t> prompt, uint32_t first, uint32_t count, uint32_t chunk_tokens,
               const KvPages& pages, bool write_kv);
  void StoreKv(const float* rows, uint32_t first, uint32_t count, uint32_t layer, uint32_t which, uint32_t chunk_tokens,
               const KvPages& pages) const;
  void GatherKv(uint32_t tokens, uint32_t layer, uint32_t which, uint32_t kv_head, uint32_t chunk_tokens,
                const KvPages& pages, float* out) const;

  TransformerConfig config_;
  Weights weights_;
  uint32_t value_bytes_;
  // Scratch, reused across calls.
  std::vector<float> x_, normed_, q_, k_, v_, attn_, gate_, up_, scores_, keys_, values_, hidden_;
};

// bf16 round to nearest even, and back.
uint16_t FloatToBf16(float value);
float Bf16ToFloat(uint16_t value);

// Sets OpenBLAS's thread count (the engine's compute threads).
void SetBlasThreads(int threads);

}  // namespace cake::engine
