"""Plain vLLM (no connector, no prefix cache): the reference tokens of test_vllm_cpu.py, in a process of its own.

    python vllm_cpu_reference.py MODEL_DIR PROMPTS_JSON OUT_JSON BATCHED_TOKENS MAX_TOKENS

PROMPTS_JSON holds {name: [token ids]}; OUT_JSON gets {name: [greedy token ids]}. Same dtype, block size and prefill
chunk (max_num_batched_tokens) as the engine under test; every prompt alone, one after another."""
import json
import os
import sys


def main(model_dir, prompts_path, out_path, batched, max_tokens):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    with open(prompts_path) as f:
        prompts = json.load(f)
    llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=4096,
              max_num_batched_tokens=int(batched), enforce_eager=True, seed=0, block_size=32,
              enable_prefix_caching=False)
    params = SamplingParams(max_tokens=int(max_tokens), temperature=0.0, ignore_eos=True, detokenize=False)
    out = {}
    for name, tokens in prompts.items():
        result = llm.generate([TokensPrompt(prompt_token_ids=tokens)], params, use_tqdm=False)
        out[name] = list(result[0].outputs[0].token_ids)
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(*sys.argv[1:6])
