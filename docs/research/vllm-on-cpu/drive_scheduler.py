"""Drive vLLM's REAL v1 Scheduler / AsyncScheduler on the CPU, with a KV connector loaded by module path and a
Cake-style scheduler mixin that jumps a running request's num_computed_tokens forward (front F -> cached end H).

    python drive_scheduler.py [--async] [--no-jump] [--cake]

No model runs: each step's ModelRunnerOutput is built by hand (one sampled token per request that finished its
prefill, none for a prefill chunk), worker metadata comes from two fake TP ranks merged by vLLM's KVOutputAggregator.
"""
import argparse
import os
import sys
import time
from collections import deque

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig,  # noqa: E402
                         VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import demo_connector  # noqa: E402

BLOCK = 16
PROMPT_LEN = {}


from cake_sched_proto import JUMPS, CakeAsyncScheduler, CakeScheduler  # noqa: E402,F401


def make_vllm_config(async_scheduling, connector="DemoConnector", module="demo_connector", extra=None):
    model = ModelConfig(model=os.path.join(HERE, "tiny-llama"), skip_tokenizer_init=True, dtype="float32",
                        seed=0, max_model_len=1024)
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=1024,
                            enable_chunked_prefill=True, is_encoder_decoder=False,
                            async_scheduling=async_scheduling,
                            scheduler_cls=("cake_sched_proto.CakeAsyncScheduler" if async_scheduling
                                           else "cake_sched_proto.CakeScheduler"))
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    kv = KVTransferConfig(kv_connector=connector, kv_connector_module_path=module, kv_role="kv_both",
                          kv_load_failure_policy="recompute",
                          kv_connector_extra_config=extra or {"external_tokens": 32, "load_async": False})
    return VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache, kv_transfer_config=kv,
                      device_config=DeviceConfig("cpu"))


def make_scheduler(vllm_config, num_blocks=64):
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                                          FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16,
                                                            dtype=torch.float32))])
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    cls = vllm_config.scheduler_config.get_scheduler_cls()  # resolves scheduler_cls by qualified name
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK,
               hash_block_size=None, log_stats=True)


def make_request(req_id, n_prompt, max_tokens=3, seed=1):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, 2)
    PROMPT_LEN[req_id] = n_prompt
    return Request(request_id=req_id, prompt_token_ids=[(seed * 7 + i) % 500 + 3 for i in range(n_prompt)],
                   sampling_params=params, pooling_params=None, mm_features=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def runner_output(scheduler, sched_out, aggregator, step):
    """What a model runner hands back: per rank, then merged by vLLM's own KVOutputAggregator."""
    req_ids = list(sched_out.num_scheduled_tokens)
    # pre-step num_computed_tokens as the worker sees it (new and cached request data)
    pre = {n.req_id: n.num_computed_tokens for n in sched_out.scheduled_new_reqs}
    pre.update(zip(sched_out.scheduled_cached_reqs.req_ids, sched_out.scheduled_cached_reqs.num_computed_tokens))
    sampled = []
    for r in req_ids:
        # the runner samples only for a request whose prefill ends in this step (its last chunk) or a decode
        done_prefill = pre[r] + sched_out.num_scheduled_tokens[r] >= PROMPT_LEN[r]
        sampled.append([100 + step] if done_prefill else [])
    per_rank = []
    for rank in range(2):
        meta = demo_connector.DemoWorkerMeta({r: rank + step for r in req_ids})  # ranks disagree: max wins
        per_rank.append(ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, logprobs=None,
                                          prompt_logprobs_dict={}, pooler_output=[],
                                          kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=meta)))
    return aggregator.aggregate(per_rank)


def describe(scheduler, out, step, label):
    meta = out.kv_connector_metadata
    cached = out.scheduled_cached_reqs
    print(f"[{label} step {step}] scheduled={dict(out.num_scheduled_tokens)} "
          f"new={[r.req_id for r in out.scheduled_new_reqs]} "
          f"cached_pre_step_computed={dict(zip(cached.req_ids, cached.num_computed_tokens))} "
          f"has_sync_kv_loads={out.has_sync_kv_loads} "
          f"meta.loads={meta.loads} meta.splices={meta.splices}")
    print(f"    after schedule: " + ", ".join(
        f"{r}: computed={q.num_computed_tokens}/{q.num_tokens} status={q.status.name} "
        f"blocks={len(scheduler.kv_cache_manager.get_block_ids(r)[0])}"
        for r, q in scheduler.requests.items()))


def run(async_scheduling, jump=True):
    label = "async" if async_scheduling else "sync"
    t = time.time()
    cfg = make_vllm_config(async_scheduling)
    scheduler = make_scheduler(cfg)
    print(f"== {label}: {type(scheduler).__mro__[1:3]} built in {time.time() - t:.1f}s; connector "
          f"{type(scheduler.connector).__name__}; free blocks "
          f"{scheduler.kv_cache_manager.block_pool.get_num_free_blocks()}")
    init_none_hash(sha256)
    a = make_request("A", 80, seed=1)           # connector offers 32 external tokens (sync load)
    b = make_request("B-split", 160, seed=2)    # computes its front; the mixin jumps it to H=128
    if jump:
        scheduler._cake_targets["B-split"] = (16, 128)
    scheduler.add_request(a)
    scheduler.add_request(b)
    aggregator = KVOutputAggregator(expected_finished_count=2)
    in_flight = deque()
    step = 0
    while scheduler.has_requests() and step < 30:
        if step == 1 and jump:
            # a request sharing B's first 144 tokens arrives in the jump step: does it hit the spliced blocks?
            params = SamplingParams(max_tokens=3, ignore_eos=True)
            params.update_from_generation_config({}, 2)
            c = Request(request_id="C", prompt_token_ids=[int(t) for t in b.prompt_token_ids[:144]] + [7] * 32,
                        sampling_params=params, pooling_params=None, mm_features=None,
                        block_hasher=get_request_block_hasher(BLOCK, sha256))
            PROMPT_LEN["C"] = 176
            scheduler.add_request(c)
        out = scheduler.schedule()
        describe(scheduler, out, step, label)
        in_flight.append((out, step))
        if async_scheduling and len(in_flight) < 2 and step == 0:
            step += 1
            continue  # keep one step in flight: schedule(N+1) before update_from_output(N)
        done_out, done_step = in_flight.popleft()
        mro = runner_output(scheduler, done_out, aggregator, done_step)
        engine_outputs = scheduler.update_from_output(done_out, mro)
        finished = [o.request_id for eo in engine_outputs.values() for o in eo.outputs if o.finish_reason]
        if finished:
            print(f"    finished: {finished}")
        step += 1
    while in_flight:
        done_out, done_step = in_flight.popleft()
        scheduler.update_from_output(done_out, runner_output(scheduler, done_out, aggregator, done_step))
    print(f"   jumps={JUMPS}  worker-meta seen (aggregated max) last="
          f"{scheduler.connector.worker_meta_seen[-1] if scheduler.connector.worker_meta_seen else None}")
    print(f"   requests left={len(scheduler.requests)} free blocks="
          f"{scheduler.kv_cache_manager.block_pool.get_num_free_blocks()}")
    print("   connector calls:", [c[:3] for c in demo_connector.CALLS if c[0] != "build_connector_meta"])
    JUMPS.clear()
    demo_connector.CALLS.clear()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--async", dest="is_async", action="store_true")
    p.add_argument("--no-jump", action="store_true")
    args = p.parse_args()
    run(args.is_async, jump=not args.no_jump)
