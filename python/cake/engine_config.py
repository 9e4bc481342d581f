"""What the engine adapters (cake.vllm, cake.sglang) read alike from their engine's configuration: switches and
KV dtypes.

Imports nothing beyond the standard library (no torch, no engine): both adapters import it at module level, and
the engines' configurations arrive as strings and JSON values, never as tensors.
"""
from __future__ import annotations

from typing import Optional

# The engine's KV dtype, as str() of a torch dtype (a model's or a host pool's dtype) or as a configuration word
# (vLLM's cache_dtype), to Cake's namespace dtype. fp8 caches hold their bytes as uint8 in some engines.
TORCH_TO_CAKE_DTYPE = {
    "torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float8_e4m3fn": "fp8",
    "torch.float8_e5m2": "fp8", "torch.uint8": "fp8", "torch.int8": "int8",
    "float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}


def cake_dtype(engine_dtype: object) -> Optional[str]:
    """Cake's dtype for an engine's KV dtype (a torch dtype or its configuration word); None when Cake has none."""
    return TORCH_TO_CAKE_DTYPE.get(str(engine_dtype))


def parse_flag(value: object, name: str = "flag") -> bool:
    """A boolean of an engine's extra configuration (vLLM's kv_connector_extra_config, SGLang's
    --hicache-storage-backend-extra-config) or of a request's kv_transfer_params: JSON gives true/false, a CLI or an
    env file may give strings. `name` is the key, for the error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name}: {value!r} is not a boolean")
