"""Namespace: the model layout and tenant every request names (docs/protocol.md, "Namespace")."""
from dataclasses import dataclass

from cake._stubs import kv_pb2

# The element types the daemon knows, with their sizes in bytes.
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
_PROTO_DTYPE = {"fp32": kv_pb2.DTYPE_FP32, "fp16": kv_pb2.DTYPE_FP16, "bf16": kv_pb2.DTYPE_BF16,
                "fp8": kv_pb2.DTYPE_FP8, "int8": kv_pb2.DTYPE_INT8}


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

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")

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
                                tp_size=self.tp_size, chunk_tokens=self.chunk_tokens, tenant=self.tenant)
