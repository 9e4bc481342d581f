import os, sys, time
sys.path.insert(0, "/tmp/vllm-research")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["PYTHONPATH"] = "/tmp/vllm-research"
from vllm import LLM, SamplingParams
from vllm.config import KVTransferConfig
from vllm.inputs import TokensPrompt


def main():
    t = time.time()
    llm = LLM(model="/tmp/vllm-research/tiny-llama-rand", skip_tokenizer_init=True,
              dtype="bfloat16", max_model_len=512, max_num_batched_tokens=64, enforce_eager=True, seed=0,
              block_size=32, scheduler_cls="cake_sched_proto.CakeAsyncScheduler",
              kv_transfer_config=KVTransferConfig(kv_connector="ProbeConnector",
                                                  kv_connector_module_path="cpu_probe_connector", kv_role="kv_both",
                                                  kv_connector_extra_config={"external_tokens": 0}))
    print("LLM built in %.1fs" % (time.time() - t))
    sp = SamplingParams(max_tokens=4, temperature=0.0, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(range(3, 203)))], sp)
    print("generated token ids:", outs[0].outputs[0].token_ids)


if __name__ == "__main__":
    main()
