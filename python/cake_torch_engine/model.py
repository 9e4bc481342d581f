"""A Llama-shaped decoder in plain PyTorch, with weights drawn from a seed so every machine builds the same model and
nothing is downloaded. Attention is torch's scaled_dot_product_attention where the installed torch has it (2.0 and
later: pip's), and written out on Debian's 1.13, which has none (TorchLlama's `attention`: "auto", "sdpa" or
"explicit").

Bit-exactness rests on one property: a chunk's computation depends only on the tokens, the weights and the KV
cache rows before it, and it always runs with the same shapes (one chunk of queries against the cache up to the
chunk's end). So a cache whose loaded rows equal the computed ones, bit for bit, makes every later chunk and the
first token's logits bit-identical too. The first token is always computed the same way, the last prompt
position run again as one query against the whole cache (what engines do on a full hit), so it does not depend
on which chunk happened to be computed last."""
import math
from dataclasses import dataclass

import torch

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    layers: int = 8
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 8
    intermediate: int = 1408
    vocab: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 1
    dtype: str = "fp32"    # weights, activations and the KV cache: fp32 or bf16 (fp16 on CUDA)

    @property
    def head_dim(self):
        return self.hidden // self.heads

    def validate(self):
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.intermediate, self.vocab) <= 0:
            raise ValueError(f"every size must be positive: {self}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden must be a multiple of heads, and heads a multiple of kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary embeddings rotate pairs)")
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(TORCH_DTYPES)}")

    def describe(self):
        return (f"{self.layers} layers, hidden {self.hidden}, {self.heads} heads, {self.kv_heads} KV heads, "
                f"MLP {self.intermediate}, {self.dtype}")

    def model_id(self):
        return (f"cake-torch-engine/l{self.layers}-h{self.hidden}-a{self.heads}-kv{self.kv_heads}-"
                f"m{self.intermediate}-v{self.vocab}-s{self.seed}-{self.dtype}")


class TorchLlama:
    """Weights and the forward pass. The KV cache is the caller's: [layers, 2, tokens, kv_heads, head_dim],
    the same order as a Cake chunk, so a chunk is the slice [:, :, start:end]."""

    def __init__(self, config, device="cpu", max_tokens=1 << 15, attention="auto"):
        config.validate()
        self.config = config
        sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
        if attention not in ("auto", "sdpa", "explicit"):
            raise ValueError(f"attention {attention!r} is not one of auto, sdpa, explicit")
        if attention == "sdpa" and sdpa is None:
            raise ValueError(f"torch {torch.__version__} has no scaled_dot_product_attention")
        self._sdpa = sdpa if attention in ("auto", "sdpa") else None
        self.attention = "sdpa" if self._sdpa is not None else "explicit"
        self.device = torch.device(device)
        self.dtype = TORCH_DTYPES[config.dtype]
        g = torch.Generator().manual_seed(config.seed)
        c = config

        def weight(*shape, scale):
            return (torch.randn(*shape, generator=g) * scale).to(self.dtype).to(self.device)

        d, kv = c.head_dim, c.kv_heads * c.head_dim
        self.embed = weight(c.vocab, c.hidden, scale=1.0)
        self.layers = []
        for _ in range(c.layers):
            self.layers.append({
                "attn_norm": (1 + 0.1 * torch.randn(c.hidden, generator=g)).to(self.dtype).to(self.device),
                "wq": weight(c.hidden, c.hidden, scale=1 / math.sqrt(c.hidden)),
                "wk": weight(c.hidden, kv, scale=1 / math.sqrt(c.hidden)),
                "wv": weight(c.hidden, kv, scale=1 / math.sqrt(c.hidden)),
                "wo": weight(c.hidden, c.hidden, scale=1 / math.sqrt(c.hidden)),
                "mlp_norm": (1 + 0.1 * torch.randn(c.hidden, generator=g)).to(self.dtype).to(self.device),
                "w_gate": weight(c.hidden, c.intermediate, scale=1 / math.sqrt(c.hidden)),
                "w_up": weight(c.hidden, c.intermediate, scale=1 / math.sqrt(c.hidden)),
                "w_down": weight(c.intermediate, c.hidden, scale=1 / math.sqrt(c.intermediate)),
            })
        self.final_norm = (1 + 0.1 * torch.randn(c.hidden, generator=g)).to(self.dtype).to(self.device)
        self.lm_head = weight(c.hidden, c.vocab, scale=1 / math.sqrt(c.hidden))
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = torch.arange(max_tokens, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.cos = angles.cos().to(self.dtype).to(self.device)  # [tokens, head_dim / 2]
        self.sin = angles.sin().to(self.dtype).to(self.device)
        self.max_tokens = max_tokens

    def model_id(self):
        """The namespace's model id: the config's, and the attention's when it is torch's fused one. The two
        attentions give KV that differs in the last bits, and a load is bit-exact only within one of them."""
        return self.config.model_id() + ("-sdpa" if self.attention == "sdpa" else "")

    def new_cache(self, tokens):
        c = self.config
        return torch.zeros(c.layers, 2, tokens, c.kv_heads, c.head_dim, dtype=self.dtype, device=self.device)

    def _rms_norm(self, x, weight):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.config.norm_eps)).to(self.dtype) * weight

    def _rope(self, x, start):
        # x: [tokens, heads, head_dim]; rotates (even, odd) pairs by each position's angles.
        t = x.shape[0]
        cos = self.cos[start:start + t][:, None, :]
        sin = self.sin[start:start + t][:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def _attention(self, q, keys, values, start):
        # q: [t, heads, d]; keys/values: [n, kv_heads, d] with n = start + t; query i sits at position start + i.
        c = self.config
        t, n, group = q.shape[0], keys.shape[0], c.heads // c.kv_heads
        q = q.view(t, c.kv_heads, group, c.head_dim).permute(1, 2, 0, 3)        # [kv, g, t, d]
        k = keys.permute(1, 2, 0).unsqueeze(1)                                    # [kv, 1, d, n]
        v = values.permute(1, 0, 2).unsqueeze(1)                                  # [kv, 1, n, d]
        future = torch.arange(n, device=self.device)[None, :] > (start + torch.arange(t, device=self.device))[:, None]
        if self._sdpa is not None:
            # The same shapes for a chunk whether its cache rows were computed or loaded: bit-exact either way.
            out = self._sdpa(q, k.transpose(2, 3).expand(-1, group, -1, -1), v.expand(-1, group, -1, -1),
                             attn_mask=~future)                                   # [kv, g, t, d]
            return out.permute(2, 0, 1, 3).reshape(t, c.hidden)
        scores = torch.matmul(q, k).float() / math.sqrt(c.head_dim)               # [kv, g, t, n]
        scores.masked_fill_(future, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(self.dtype)
        out = torch.matmul(probs, v)                                              # [kv, g, t, d]
        return out.permute(2, 0, 1, 3).reshape(t, c.hidden)

    def forward(self, tokens, start, cache, write_cache=True):
        """Runs tokens at positions [start, start + len(tokens)) against cache rows [0, start + len(tokens)).
        With write_cache the chunk's keys and values go into the cache first; without, the cache must already
        hold them (the first-token query). Returns the last position's hidden state."""
        c = self.config
        t = len(tokens)
        end = start + t
        if end > cache.shape[2] or end > self.max_tokens:
            raise ValueError(f"positions up to {end} exceed the cache's {cache.shape[2]} tokens")
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        h = self.embed[ids]
        for index, w in enumerate(self.layers):
            a = self._rms_norm(h, w["attn_norm"])
            q = self._rope((a @ w["wq"]).view(t, c.heads, c.head_dim), start)
            if write_cache:
                k = self._rope((a @ w["wk"]).view(t, c.kv_heads, c.head_dim), start)
                v = (a @ w["wv"]).view(t, c.kv_heads, c.head_dim)
                cache[index, 0, start:end] = k
                cache[index, 1, start:end] = v
            h = h + self._attention(q, cache[index, 0, :end], cache[index, 1, :end], start) @ w["wo"]
            m = self._rms_norm(h, w["mlp_norm"])
            h = h + (torch.nn.functional.silu(m @ w["w_gate"]) * (m @ w["w_up"])) @ w["w_down"]
        return h[-1:]

    def first_token_logits(self, prompt, cache):
        """The logits of the token after the prompt: the last position as one query against the whole cache."""
        last = len(prompt) - 1
        h = self.forward(prompt[last:], last, cache, write_cache=False)
        return (self._rms_norm(h, self.final_norm) @ self.lm_head).float()[0]
