"""A Hugging Face transformers LlamaForCausalLM on the CPU with Cake: its chunked prefill's KV stored through a real
caked, then the suffix [m, H) loaded and spliced into a DynamicCache (cache.update, transformers 5's way) after the
front [0, m) it computed, at m = 0, 3 and H (cake_torch_engine.hf). The first token must equal full compute's;
whether the logits are bit-identical is printed (transformers' attention over a cache built in two pieces need not
sum in the same order). Skipped where transformers is not installed (Debian's interpreter); the venv pins 5.22.2."""
import pytest

transformers = pytest.importorskip("transformers", reason="transformers is not installed (the venv of "
                                   "scripts/setup pins it)")

from cake_torch_engine.hf import check_splits  # noqa: E402


def test_loaded_suffix_spliced_into_a_dynamic_cache(client, capsys):
    results = check_splits(client, "cpu", splits=(0, 3, None))
    with capsys.disabled():
        print(f"\ntransformers {transformers.__version__}: {results}")
    assert len(results) == 3 and all(r["first_token_equal"] for r in results.values()), results
    # Loading everything (m = 0) or nothing but the tail (m = H) changes nothing the model computes in fp32 here.
    assert all(r["max_abs_logit_diff"] < 1e-3 for r in results.values()), results


def test_a_wrong_splice_is_caught(client, monkeypatch):
    """The negative control: the loaded chunks spliced in the wrong order change the logits."""
    import cake_torch_engine.hf as hf
    real = hf.splice_loaded

    def reversed_splice(cache, load, raw, layout, first, end):
        class Reversed:
            def region_offset(self, c):
                return load.region_offset(first + end - 1 - c)
        real(cache, Reversed(), raw, layout, first, end)

    monkeypatch.setattr(hf, "splice_loaded", reversed_splice)
    results = hf.check_splits(client, "cpu", splits=(3,), seed=1)
    assert results[3]["max_abs_logit_diff"] > 0 and not results[3]["logits_bit_identical"], results
