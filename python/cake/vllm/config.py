"""What both halves of the connector read from vLLM's configuration and requests: the extra config, the namespace
of the model and of each request, and a request's own switches."""
from __future__ import annotations

import dataclasses
from typing import Optional

from cake.engine_config import cake_dtype, parse_flag
from cake.namespace import Namespace


def extra_config(vllm_config) -> dict:
    """vLLM's kv_connector_extra_config (the cake_* keys), empty when there is none."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    return dict(getattr(transfer, "kv_connector_extra_config", None) or {})


def namespace_for(vllm_config, tp_rank: Optional[int] = None) -> Namespace:
    """The namespace both sides use: the model, this rank's share of the KV heads, the dtype, the chunk size."""
    extra = extra_config(vllm_config)
    model, parallel, cache = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    chunk_tokens = int(extra.get("cake_chunk_tokens", 256))
    block_size = int(cache.block_size)
    if chunk_tokens % block_size != 0:
        raise ValueError(f"cake_chunk_tokens ({chunk_tokens}) must be a multiple of vLLM's block size ({block_size})")
    cache_dtype = str(getattr(cache, "cache_dtype", "auto"))
    dtype = cake_dtype(model.dtype if cache_dtype == "auto" else cache_dtype)
    if dtype is None:
        raise ValueError(f"KV dtype {model.dtype if cache_dtype == 'auto' else cache_dtype} has no Cake equivalent")
    tp_size = int(getattr(parallel, "tensor_parallel_size", 1))
    rank = int(getattr(parallel, "rank", 0) if tp_rank is None else tp_rank) % tp_size
    model_id = str(extra.get("cake_model_id") or f"vllm:{model.model}")
    if dtype == "fp8":  # e4m3 and e5m2 are different bytes under one element size
        model_id += f"|{cache_dtype if cache_dtype != 'auto' else model.dtype}"
    pp_size = int(getattr(parallel, "pipeline_parallel_size", 1) or 1)
    if pp_size > 1:  # each stage holds other layers
        model_id += f"|pp{pipeline_rank(parallel)}of{pp_size}"
    return Namespace(model_id,
                     num_layers=int(model.get_num_layers(parallel)),
                     num_kv_heads=int(model.get_num_kv_heads(parallel)), head_dim=int(model.get_head_size()),
                     dtype=dtype, tp_rank=rank, tp_size=tp_size, chunk_tokens=chunk_tokens,
                     tenant=str(extra.get("cake_tenant", "")),
                     stored_precision=str(extra.get("cake_stored_precision", "exact")))


def with_model_id(ns: Namespace, model_id: str) -> Namespace:
    """ns under a request's model id (the model's, plus its LoRA adapter or cache salt); ns itself when the same."""
    return ns if not model_id or model_id == ns.model_id else dataclasses.replace(ns, model_id=model_id)


def pipeline_rank(parallel) -> int:
    """This process's pipeline stage, from vLLM's process groups where they exist."""
    try:
        from vllm.distributed.parallel_state import get_pp_group
        return get_pp_group().rank_in_group
    except Exception:  # the scheduler (no groups), or no vLLM: the config's word
        return int(getattr(parallel, "pipeline_parallel_rank", 0) or 0)


def tensor_parallel_rank() -> Optional[int]:
    """This worker's tensor-parallel rank, from vLLM's process groups where they exist."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return get_tensor_model_parallel_rank()
    except Exception:  # no vLLM, or its groups are not set up: the config's rank
        return None


def request_namespace(ns: Namespace, request) -> Optional[Namespace]:
    """The namespace a request's KV lives in, or None for one whose KV depends on more than its tokens (images,
    audio: the cache would hand one image's KV to another's request). A LoRA adapter and a cache salt each give
    their own namespace: the same tokens under another adapter, or another user's salt, never share KV."""
    if getattr(request, "mm_features", None) or getattr(request, "mm_hashes", None) or \
            getattr(request, "mm_positions", None):
        return None
    extra = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        extra.append(f"lora={getattr(lora, 'lora_name', None) or getattr(lora, 'name', '')}:"
                     f"{getattr(lora, 'lora_int_id', '')}")
    salt = getattr(request, "cache_salt", None)
    if salt:
        extra.append(f"salt={salt}")
    if not extra:
        return ns
    return dataclasses.replace(ns, model_id="|".join([ns.model_id, *extra]))


def request_flag(request, name: str) -> Optional[bool]:
    """A per-request switch in the request's kv_transfer_params (vLLM's SamplingParams.extra_args
    {"kv_transfer_params": {...}}): "cake_load": false computes the request without the cache, "cake_split": false
    keeps it off the split (I/O-only). None when the request does not say."""
    params = getattr(request, "kv_transfer_params", None)
    if not isinstance(params, dict) or name not in params:
        return None
    return parse_flag(params[name], name)
