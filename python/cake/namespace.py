"""Namespace: the model layout and tenant every request names (docs/protocol.md, "Namespace")."""
from dataclasses import dataclass

from cake._stubs import kv_pb2

# The element types the daemon knows, with their sizes in bytes.
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
_PROTO_DTYPE = {"fp32": kv_pb2.DTYPE_FP32, "fp16": kv_pb2.DTYPE_FP16, "bf16": kv_pb2.DTYPE_BF16,
                "fp8": kv_pb2.DTYPE_FP8, "int8": kv_pb2.DTYPE_INT8}
_PROTO_PRECISION = {"exact": kv_pb2.STORED_PRECISION_EXACT, "int8": kv_pb2.STORED_PRECISION_INT8,
                    "int4": kv_pb2.STORED_PRECISION_INT4}


@dataclass(frozen=True)
class Namespace:
    """A KV cache is reusable only by the same model with the same layout, per tensor-parallel rank and tenant.
    chunk_tokens 0 takes the daemon's default (256); the client's layout helpers need it set."""
    model_id: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bf16"
    tp_rank: int = 0
    tp_size: int = 1
    chunk_tokens: int = 256
    tenant: str = ""
    # "exact", or "int8" / "int4": the disk and remote tiers store this namespace's chunks quantized, and loads from
    # them deliver approximations (docs/protocol.md, "Lossy storage"); DRAM keeps them exact.
    stored_precision: str = "exact"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.stored_precision not in _PROTO_PRECISION:
            raise ValueError(f"stored_precision {self.stored_precision!r} is not one of "
                             f"{', '.join(_PROTO_PRECISION)}")

    @property
    def dtype_bytes(self):
        return DTYPES[self.dtype]

    @property
    def bytes_per_token(self):
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def chunk_bytes(self):
        return self.chunk_tokens * self.bytes_per_token

    @property
    def proto_dtype(self):
        return _PROTO_DTYPE[self.dtype]

    def to_proto(self):
        return kv_pb2.Namespace(model_id=self.model_id, num_layers=self.num_layers, num_kv_heads=self.num_kv_heads,
                                head_dim=self.head_dim, dtype=self.proto_dtype, tp_rank=self.tp_rank,
                                tp_size=self.tp_size, chunk_tokens=self.chunk_tokens, tenant=self.tenant,
                                stored_precision=_PROTO_PRECISION[self.stored_precision])
