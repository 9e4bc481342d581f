"""cake.engine_config, what the vLLM and SGLang adapters read alike from their engines' configurations (switches,
KV dtypes), and cake.vllm.scheduler.split_config, the split's configuration from vLLM's kv_connector_extra_config.
No torch, engine or daemon."""
import subprocess
import sys

import pytest

from cake import engine_config
from cake.engine_config import cake_dtype, parse_flag
from cake.split import DEFAULT_MIN_CHUNKS
from cake.vllm.scheduler import split_config


def test_flags_from_json_a_cli_or_an_env_file():
    for value in (True, 1, 7, "1", "true", "TRUE", " yes ", "on"):
        assert parse_flag(value) is True, value
    for value in (False, 0, "0", "false", "No", "off", "", "  "):
        assert parse_flag(value) is False, value
    with pytest.raises(ValueError, match="cake_prefetch: 'maybe' is not a boolean"):
        parse_flag("maybe", "cake_prefetch")  # the error names the key it was read from


def test_engine_dtypes_map_to_cakes():
    """str() of a torch dtype (a model's, a host pool's) and vLLM's cache_dtype words: one table for both
    adapters."""
    expected = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
                "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8", "torch.uint8": "fp8", "torch.int8": "int8",
                "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8",
                "fp8_e5m2": "fp8", "float32": "fp32"}
    for name, dtype in expected.items():
        assert cake_dtype(name) == dtype, name
    assert cake_dtype("torch.float64") is None and cake_dtype("auto") is None
    torch = pytest.importorskip("torch")
    assert cake_dtype(torch.bfloat16) == "bf16" and cake_dtype(torch.float16) == "fp16"


def test_the_module_imports_nothing_beyond_the_standard_library():
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('engine_config', %r); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "bad = [n for n in ('torch', 'vllm', 'sglang', 'grpc', 'numpy') if n in sys.modules]; assert not bad, bad"
            % engine_config.__file__)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_split_config_from_vllms_extra_config():
    c = split_config({"cake_split": "true", "cake_split_min_chunks": "3", "cake_chunk_tokens": 64}, block_size=16,
                     world_size=2)
    assert (c.enabled, c.min_chunks, c.chunk_tokens, c.block_size, list(c.ranks)) == (True, 3, 64, 16, [0, 1])
    assert not split_config({}, block_size=16).enabled
    assert split_config({"cake_split": True}, block_size=16).min_chunks == DEFAULT_MIN_CHUNKS
    assert not split_config({"cake_split": "off"}, block_size=16).enabled
    with pytest.raises(ValueError, match="cake_split"):
        split_config({"cake_split": "maybe"}, block_size=16)
    with pytest.raises(ValueError):
        split_config({"cake_chunk_tokens": 24}, block_size=16)  # not a multiple of the block size
