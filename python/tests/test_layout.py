"""cake.layout: [layer][K,V][token][kv_head][head_dim] views of a chunk, numpy and torch, without copies."""
import numpy as np
import pytest

import cake


def test_layout_offsets_and_numpy_views():
    ns = cake.Namespace("m", num_layers=3, num_kv_heads=2, head_dim=4, dtype="fp32", chunk_tokens=5)
    layout = cake.ChunkLayout.of(ns)
    assert layout.chunk_bytes == ns.chunk_bytes == 3 * 2 * 5 * 2 * 4 * 4
    buffer = np.zeros(2 * layout.chunk_bytes + 16, dtype=np.uint8)
    view = layout.chunk(buffer, layout.chunk_bytes)
    assert view.shape == (3, 2, 5, 2, 4) and view.dtype == np.float32
    k, v = layout.layer_kv(buffer, layout.chunk_bytes, 1)
    v[2, 1, 3] = 1.5  # layer 1, values, token 2, head 1, element 3
    element = layout.chunk_bytes + layout.offset(1, 1, 2) + (1 * 4 + 3) * 4
    assert buffer[element:element + 4].view(np.float32)[0] == 1.5
    assert np.count_nonzero(buffer) == 2  # 1.5f is 0x3fc00000: two non-zero bytes, nothing else written
    with pytest.raises(IndexError):
        layout.chunk(buffer, layout.chunk_bytes + 17)
    with pytest.raises(IndexError):
        layout.offset(3, 0)


def test_torch_views_share_memory():
    torch = pytest.importorskip("torch")
    ns = cake.Namespace("m", num_layers=2, num_kv_heads=1, head_dim=2, dtype="bf16", chunk_tokens=3)
    layout = cake.ChunkLayout.of(ns)
    raw = torch.zeros(layout.chunk_bytes, dtype=torch.uint8)
    k, v = layout.layer_kv(raw, 0, 1)
    assert k.dtype == torch.bfloat16 and k.shape == (3, 1, 2)
    k.fill_(2.0)
    assert raw[layout.offset(1, 0):layout.offset(1, 1)].view(torch.bfloat16).eq(2.0).all()
    assert raw[:layout.offset(1, 0)].eq(0).all() and raw[layout.offset(1, 1):].eq(0).all()


def test_numpy_bf16_views_as_uint16():
    ns = cake.Namespace("m", num_layers=1, num_kv_heads=1, head_dim=2, dtype="bf16", chunk_tokens=1)
    assert cake.ChunkLayout.of(ns).chunk(np.zeros(8, dtype=np.uint8)).dtype == np.uint16


def test_host_region_torch_view(client):
    torch = pytest.importorskip("torch")
    region = client.register_region(1 << 16)
    t = region.torch()
    t[:10] = 7
    assert region.numpy()[:10].tolist() == [7] * 10
    client.release_region(region)
