"""The chunk layout an engine and the daemon agree on, so an engine never computes an offset by hand.

A chunk is `chunk_bytes` opaque bytes to the daemon; Cake's engines lay it out as

    [layer][K, V][token][kv_head][head_dim]     (row-major, the namespace's dtype)

so layer l's keys for the chunk's tokens are one contiguous [chunk_tokens, kv_heads, head_dim] block, followed
by its values. `ChunkLayout.chunk(buffer, offset)` views the chunk at byte `offset` of a flat uint8 buffer (a
region's numpy() or torch(), on the host or a device) as a [layers, 2, tokens, kv_heads, head_dim] array of the
element type, without a copy; `layer_kv` gives one layer's (K, V). numpy has no bf16 or fp8: those chunks view as
uint16 and uint8 in numpy (the bits are exact), and as torch.bfloat16 / uint8 in torch.
"""
from dataclasses import dataclass

_NUMPY = {"fp32": "float32", "fp16": "float16", "bf16": "uint16", "fp8": "uint8", "int8": "int8"}
_TORCH = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "uint8", "int8": "int8"}


@dataclass(frozen=True)
class ChunkLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    chunk_tokens: int

    @classmethod
    def of(cls, ns):
        if ns.chunk_tokens == 0:
            raise ValueError("the layout needs the namespace's chunk_tokens (0 would be the daemon's default)")
        return cls(ns.num_layers, ns.num_kv_heads, ns.head_dim, ns.dtype, ns.chunk_tokens)

    @property
    def dtype_bytes(self):
        from cake.namespace import DTYPES
        return DTYPES[self.dtype]

    @property
    def shape(self):
        return (self.num_layers, 2, self.chunk_tokens, self.num_kv_heads, self.head_dim)

    @property
    def chunk_bytes(self):
        return self.num_layers * 2 * self.chunk_tokens * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def offset(self, layer, kv, token=0):
        """Byte offset, inside a chunk, of `token`'s row of layer `layer`'s keys (kv=0) or values (kv=1)."""
        if not (0 <= layer < self.num_layers and kv in (0, 1) and 0 <= token < self.chunk_tokens):
            raise IndexError(f"layer {layer}, kv {kv}, token {token} is outside the chunk's {self.shape}")
        row = self.num_kv_heads * self.head_dim * self.dtype_bytes
        return ((layer * 2 + kv) * self.chunk_tokens + token) * row

    def chunk(self, buffer, offset=0):
        """The chunk at byte `offset` of a flat uint8 numpy array or torch tensor, as a [layers, 2, tokens,
        kv_heads, head_dim] view of the element type."""
        end = offset + self.chunk_bytes
        if offset < 0 or end > _length(buffer):
            raise IndexError(f"a {self.chunk_bytes}-byte chunk at {offset} runs past the {_length(buffer)}-byte buffer")
        piece = buffer[offset:end]
        if _is_torch(buffer):
            import torch
            return piece.view(getattr(torch, _TORCH[self.dtype])).view(self.shape)
        import numpy
        return piece.view(numpy.dtype(_NUMPY[self.dtype])).reshape(self.shape)

    def layer_kv(self, buffer, offset, layer):
        """Layer `layer`'s (keys, values) of the chunk at `offset`, each [tokens, kv_heads, head_dim]."""
        view = self.chunk(buffer, offset)
        return view[layer, 0], view[layer, 1]


def _is_torch(buffer):
    return type(buffer).__module__.startswith("torch")


def _length(buffer):
    return buffer.numel() if _is_torch(buffer) else len(buffer)
