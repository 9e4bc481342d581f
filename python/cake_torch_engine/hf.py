"""Cake with a Hugging Face transformers model: a chunked prefill's KV stored through caked, and a loaded suffix
spliced into a DynamicCache after the front the engine computed.

transformers 5 has no legacy-cache helpers; a DynamicCache grows per layer through cache.update(keys, values,
layer), keys and values [batch, kv_heads, tokens, head_dim], which is how the splice appends the loaded chunks after
the computed ones. A Cake chunk is [layer][K, V][token][kv_head][head_dim] (cake.ChunkLayout), so each piece is a
transpose of the other.

check_splits() is the whole round trip, used by the test suite on the CPU (python/tests/test_hf_splice.py, with
transformers from PyPI) and by scripts/device-check on a GPU (device regions over CUDA IPC).
"""
import torch

import cake
from cake_torch_engine.engine import same_bits


def cache_layer(cache, layer):
    """(keys, values) of one layer, [batch, kv_heads, tokens, head_dim], across transformers versions."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    if hasattr(cache, "key_cache"):
        return cache.key_cache[layer], cache.value_cache[layer]
    return cache[layer][0], cache[layer][1]


def chunked_prefill(model, prompt, cache, begin, end, chunk):
    """Positions [begin, end) of prompt ([1, n] token ids) into cache, chunk tokens per forward; returns the last
    position's logits (None when the range is empty)."""
    logits = None
    for start in range(begin, end, chunk):
        stop = min(start + chunk, end)
        positions = torch.arange(start, stop, device=prompt.device)
        try:
            out = model(prompt[:, start:stop], past_key_values=cache, use_cache=True, cache_position=positions)
        except TypeError:  # a transformers without cache_position: positions follow the cache's length
            out = model(prompt[:, start:stop], past_key_values=cache, use_cache=True)
        logits = out.logits[0, -1]
    return logits


def write_chunks(cache, layout, raw, first, count, chunk_tokens):
    """Chunks [first, first + count) of the cache's KV into raw (a region's flat tensor), one after another."""
    for i in range(count):
        view = layout.chunk(raw, i * layout.chunk_bytes)
        c = first + i
        for layer in range(layout.num_layers):
            k, v = cache_layer(cache, layer)
            view[layer, 0].copy_(k[0, :, c * chunk_tokens:(c + 1) * chunk_tokens].transpose(0, 1))
            view[layer, 1].copy_(v[0, :, c * chunk_tokens:(c + 1) * chunk_tokens].transpose(0, 1))


def splice_loaded(cache, load, raw, layout, first, end):
    """Appends the loaded chunks [first, end) to every layer of cache (which holds [0, first) already)."""
    for layer in range(layout.num_layers):
        keys, values = [], []
        for c in range(first, end):
            k, v = layout.layer_kv(raw, load.region_offset(c), layer)
            keys.append(k.transpose(0, 1)[None])
            values.append(v.transpose(0, 1)[None])
        if keys:
            # clone: the cache must own its rows, the region is released (and reused) right after.
            cache.update(torch.cat(keys, dim=2).clone(), torch.cat(values, dim=2).clone(), layer)


def check_splits(client, device="cpu", splits=(0, 3, None), chunk=64, seed=0):
    """A LlamaForCausalLM from a small config with seeded random weights (fp32), a prompt of 8 chunks and a tail:
    its chunked prefill's KV stored through caked; then, for each split m (None: H, every full chunk), compute
    [0, m) into a fresh DynamicCache, load [m, H) I/O-only into a region, splice it in, compute the tail. Returns
    {split: {first_token_equal, logits_bit_identical, max_abs_logit_diff}} against full compute."""
    import transformers
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096)
    model = LlamaForCausalLM(config).to(device=device, dtype=torch.float32).eval()
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = config.hidden_size // config.num_attention_heads
    prompt = torch.tensor([[(i * 37 + 5) % 1000 for i in range(chunk * 8 + 21)]], device=device)
    n = prompt.shape[1]
    full_chunks = n // chunk
    ns = cake.Namespace(f"cake-torch-engine/hf-llama-{transformers.__version__}-s{seed}", num_layers=layers,
                        num_kv_heads=kv_heads, head_dim=head_dim, dtype="fp32", chunk_tokens=chunk)
    layout = cake.ChunkLayout.of(ns)
    tokens = prompt[0].tolist()
    on_gpu = str(device).startswith("cuda")

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    results = {}
    with torch.no_grad():
        reference_cache = DynamicCache()
        reference = chunked_prefill(model, prompt, reference_cache, 0, n, chunk)
        region = client.register_region(full_chunks * ns.chunk_bytes, kind="cuda" if on_gpu else "host")
        try:
            raw = region.torch()
            write_chunks(reference_cache, layout, raw, 0, full_chunks, chunk)
            sync()
            client.store(ns, tokens=tokens, first_chunk=0, chunk_count=full_chunks, region=region)
            raw.zero_()
            sync()
            for split in splits:
                split = full_chunks if split is None else split
                cache = DynamicCache()
                chunked_prefill(model, prompt, cache, 0, split * chunk, chunk)  # the engine's front
                with client.load(ns, tokens=tokens, region=region, mode="io_only", computed_through=split) as load:
                    done = load.wait_done(60)
                    if done.meeting_chunk != split or done.failed_chunks:
                        raise AssertionError(f"split {split}: the load ended with {done}")
                    splice_loaded(cache, load, raw, layout, split, full_chunks)
                    sync()
                    load.release()
                logits = chunked_prefill(model, prompt, cache, full_chunks * chunk, n, chunk)
                results[split] = {"first_token_equal": int(logits.argmax()) == int(reference.argmax()),
                                  "logits_bit_identical": same_bits(logits, reference),
                                  "max_abs_logit_diff": float((logits - reference).abs().max())}
        finally:
            client.release_region(region)
    return results
