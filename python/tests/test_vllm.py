"""caked behind vLLM, without vLLM: the scheduler's and the worker's halves of cake.vllm.CakeConnector driven in
the order vLLM's scheduler (v1/core/sched/scheduler.py at 00024d31) and model runner
(kv_connector_model_runner_mixin.py at 23ec7c7f) call them, with a paged KV pool in each layout vLLM hands a
connector, against a real caked: misses, hits after a store, vLLM's own prefix hit, partial prefixes, None until
the lookup is known, asynchronous completion, load errors leading to recomputation, every loaded token
bit-exact."""
import os
import pickle
import signal
import threading
import time
import zlib

import pytest
import torch

from cake.testing.vllm_layouts import LAYOUTS, PagedCache, forward_context
from cake.vllm import CakeConnector, CakeConnectorMetadata, KVConnectorRole, LoadSpec

BLOCK, CHUNK = 16, 32          # a chunk is two of vLLM's blocks
LAYERS, HEADS, DIM = 3, 4, 16  # every axis a different size, so a wrong index cannot round-trip; 24 KiB chunks
BLOCKS = 64


class ModelConfig:
    model, dtype = "test/llama", torch.float16

    def get_num_layers(self, parallel):
        return LAYERS

    def get_num_kv_heads(self, parallel):
        return HEADS

    def get_head_size(self):
        return DIM


class VllmConfig:
    def __init__(self, daemon, **extra):
        self.model_config = ModelConfig()
        self.parallel_config = type("Parallel", (), {"tensor_parallel_size": 1, "rank": 0})()
        self.cache_config = type("Cache", (), {"block_size": BLOCK, "cache_dtype": "auto"})()
        self.compilation_config = type("Compilation", (), {"static_forward_context": {}})()
        self.kv_transfer_config = type("KVTransfer", (), {
            "kv_role": "kv_both", "kv_connector": "CakeConnector", "kv_connector_module_path": "cake.vllm",
            "kv_connector_extra_config": {"cake_socket": daemon.socket_path, "cake_chunk_tokens": CHUNK,
                                          "cake_lookup_wait_s": 5.0, **extra}})()


class Request:
    """The fields of vLLM's Request a connector reads."""

    def __init__(self, request_id, tokens, **more):
        self.request_id, self.prompt_token_ids = request_id, list(tokens)
        self.num_tokens = len(tokens)
        self.num_computed_tokens = 0
        self.status = "RequestStatus.WAITING"
        self.mm_features, self.lora_request, self.cache_salt = [], None, None
        for name, value in more.items():
            setattr(self, name, value)


class Blocks:
    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self):
        return (self.ids,)


def reference_kv(tokens):
    """The KV a model would compute: a function of each token's whole prefix, exact in fp16. [L, 2, T, H, D]."""
    prefix, h = [], 0
    for t in tokens:
        h = (h * 1000003 + t) % (1 << 31)
        prefix.append(h)
    base = torch.tensor(prefix, dtype=torch.int64).view(1, 1, -1, 1, 1)
    grid = (torch.arange(LAYERS).view(-1, 1, 1, 1, 1) * 7 + torch.arange(2).view(1, -1, 1, 1, 1) * 13
            + torch.arange(HEADS).view(1, 1, 1, -1, 1) * 17 + torch.arange(DIM).view(1, 1, 1, 1, -1) * 19)
    return (((base + grid) % 251).to(torch.float32) / 8).to(torch.float16)


class PagedPool:
    """vLLM's per-layer paged KV caches in one backend's layout (cake.testing.vllm_layouts, which the connector
    learns through the backend's writer, as on a real engine), and a free list of blocks. The engine's "forward"
    writes and reads through the backend's placement, never through the connector's."""

    def __init__(self, layout):
        self.layout = layout
        self.paged = {f"model.layers.{i}.self_attn.attn": PagedCache(layout, BLOCKS, BLOCK, HEADS, DIM,
                                                                     torch.float16, fill=float("nan"))
                      for i in range(LAYERS)}
        self.caches = {name: p.cache for name, p in self.paged.items()}
        self.forward_context = forward_context(self.paged)
        self.free = list(range(BLOCKS))

    def alloc(self, n):
        ids, self.free = self.free[:n], self.free[n:]
        return ids

    @staticmethod
    def _slots(block_ids, first, last):
        return [block_ids[t // BLOCK] * BLOCK + t % BLOCK for t in range(first, last)]

    def write(self, block_ids, first, last, kv):
        if last <= first:
            return
        slots = self._slots(block_ids, first, last)
        for layer, p in enumerate(self.paged.values()):
            p.write(kv[layer, 0, first:last], kv[layer, 1, first:last], slots)

    def read(self, block_ids, first, last):
        """[layers, 2, tokens, heads, dim] of tokens [first, last)."""
        if last <= first:
            return torch.empty((LAYERS, 2, 0, HEADS, DIM), dtype=torch.float16)
        slots = self._slots(block_ids, first, last)
        return torch.stack([torch.stack([k.view(-1, HEADS, DIM), v.view(-1, HEADS, DIM)])
                            for k, v in (p.read(slots) for p in self.paged.values())])


class Engine:
    """One vLLM instance: a scheduler-side and a worker-side connector, a paged pool, and the step loop."""

    def __init__(self, daemon, layout="flash_attn", scheduler_client=None, **extra):
        config = VllmConfig(daemon, **extra)
        self.scheduler = CakeConnector(config, KVConnectorRole.SCHEDULER, client=scheduler_client)
        self.worker = CakeConnector(config, KVConnectorRole.WORKER)
        self.pool = PagedPool(layout)
        config.compilation_config.static_forward_context = self.pool.forward_context
        self.worker.register_kv_caches(self.pool.caches)
        self.nones = 0

    def step(self):
        """One engine step as the model runner makes it: bind, start_load_kv, (forward: a few milliseconds),
        wait_for_save, get_finished, load errors, clear."""
        meta = pickle.loads(pickle.dumps(self.scheduler.build_connector_meta(None)))  # as vLLM ships it
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        for name in self.pool.caches:
            self.worker.wait_for_layer_load(name)
        time.sleep(0.002)
        self.worker.wait_for_save()
        sending, recving = self.worker.get_finished(set())
        errors = self.worker.get_block_ids_with_load_errors()
        self.worker.clear_connector_metadata()
        return sending or set(), recving or set(), errors

    def serve(self, request_id, tokens, local_hit=0, **request_fields):
        """Prefills a prompt as vLLM would: ask the connector (again while it answers None), allocate, load, compute
        what is left, finish (the blocks held until the store is done). Returns what happened."""
        request = Request(request_id, tokens, **request_fields)
        reference = reference_kv(tokens)
        while True:
            external, is_async = self.scheduler.get_num_new_matched_tokens(request, local_hit)
            if external is not None:
                break
            self.nones += 1
            self.step()
        assert local_hit + external < len(tokens), "the connector must leave a token to compute"
        assert (local_hit + external) % BLOCK == 0
        block_ids = self.pool.alloc((len(tokens) + BLOCK - 1) // BLOCK)
        self.pool.write(block_ids, 0, local_hit, reference)  # vLLM's own prefix cache hit
        self.scheduler.update_state_after_alloc(request, Blocks(block_ids), external)
        errors = set()
        if is_async and external > 0:
            for _ in range(5000):
                _, recving, step_errors = self.step()
                errors |= step_errors
                if request_id in recving:
                    break
            else:
                raise AssertionError("the asynchronous load was never reported finished")
            self.scheduler.update_state_after_alloc(request, Blocks(block_ids), 0)  # as vLLM calls it again
        elif external > 0:
            _, _, errors = self.step()
        computed = local_hit + external
        if errors:  # vLLM's _update_requests_with_invalid_blocks: recompute from the first bad block
            first_bad = min(block_ids.index(b) for b in errors)
            computed = min(computed, first_bad * BLOCK)
        loaded_exact = bool(torch.equal(self.pool.read(block_ids, local_hit, computed),
                                        reference[:, :, local_hit:computed])) if computed > local_hit else True
        self.pool.write(block_ids, computed, len(tokens), reference)  # the forward computes the rest
        assert torch.equal(self.pool.read(block_ids, 0, len(tokens)), reference)
        request.num_computed_tokens, request.status = len(tokens), "RequestStatus.FINISHED_LENGTH_CAPPED"
        hold, _ = self.scheduler.request_finished(request, block_ids)
        stored = False
        if hold:
            for _ in range(5000):
                sending, _, _ = self.step()
                if request_id in sending:
                    stored = True
                    break
        self.pool.free += block_ids
        return {"external": external, "async": is_async, "loaded_exact": loaded_exact, "errors": len(errors),
                "computed_from": computed, "stored": stored}

    def close(self):
        self.worker.shutdown()
        self.scheduler.shutdown()


def prompt(tokens, seed):
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, 32000, (tokens,), generator=g)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("load_async", [True, False])
def test_a_stored_prompt_loads_bit_exact_into_the_blocks(daemon, layout, load_async):
    tokens = prompt(5 * CHUNK + 7, seed=zlib.crc32(f"{layout}-{load_async}".encode()))
    first = Engine(daemon, layout, cake_load_async=load_async)
    second = Engine(daemon, layout, cake_load_async=load_async)
    try:
        cold = first.serve("r1", tokens)
        assert cold["external"] == 0 and cold["stored"]
        warm = second.serve("r2", tokens)
        assert warm == {"external": 5 * CHUNK, "async": load_async, "loaded_exact": True, "errors": 0,
                        "computed_from": 5 * CHUNK, "stored": True}
    finally:
        first.close()
        second.close()


def test_a_prompt_stored_in_one_layout_loads_into_another(daemon):
    tokens = prompt(3 * CHUNK + 1, seed=71)
    writer, reader = Engine(daemon, "flash_attn"), Engine(daemon, "cpu_amx")
    try:
        writer.serve("w", tokens)
        assert reader.serve("r", tokens)["loaded_exact"]
    finally:
        writer.close()
        reader.close()


def test_aborted_requests_store_only_what_was_computed(daemon):
    tokens = prompt(4 * CHUNK, seed=81)
    engine = Engine(daemon)
    try:
        block_ids = engine.pool.alloc(8)
        # Aborted after one chunk of prefill: that chunk alone is stored.
        aborted = Request("a", tokens, num_computed_tokens=CHUNK + 5, status="RequestStatus.FINISHED_ABORTED")
        engine.pool.write(block_ids, 0, CHUNK + 5, reference_kv(tokens))
        hold, _ = engine.scheduler.request_finished(aborted, block_ids)
        assert hold
        assert any("a" in engine.step()[0] for _ in range(5000))
        assert engine.scheduler._scheduler.client.lookup(engine.scheduler._scheduler.ns, tokens=tokens).cached_chunks == 1
        # Aborted while waiting for its load: nothing of it is in its blocks; nothing is held or stored.
        waiting = Request("b", prompt(4 * CHUNK, seed=82), status="RequestStatus.WAITING_FOR_REMOTE_KVS")
        assert engine.scheduler.request_finished(waiting, block_ids) == (False, None)
    finally:
        engine.close()


def test_requests_whose_kv_depends_on_more_than_tokens(daemon):
    tokens = prompt(3 * CHUNK + 1, seed=91)
    engine = Engine(daemon)
    try:
        engine.serve("plain", tokens)
        # Images: never looked up, never stored. A cache salt or a LoRA adapter: a namespace of their own.
        assert engine.serve("image", tokens, mm_features=["an image"]) ["external"] == 0
        assert engine.serve("salted", tokens, cache_salt="user-7")["external"] == 0
        assert engine.serve("salted-again", tokens, cache_salt="user-7")["external"] == 3 * CHUNK
        lora = type("Lora", (), {"lora_name": "sql", "lora_int_id": 3})()
        assert engine.serve("lora", tokens, lora_request=lora)["external"] == 0
        assert engine.serve("plain-again", tokens)["external"] == 3 * CHUNK
    finally:
        engine.close()


def test_a_hit_longer_than_the_region_is_promised_only_as_far_as_it_fits(daemon):
    tokens = prompt(6 * CHUNK + 1, seed=101)
    writer, reader = Engine(daemon), Engine(daemon, cake_region_chunks=2)
    try:
        writer.serve("w", tokens)
        result = reader.serve("r", tokens)
        assert result["external"] == 2 * CHUNK and result["errors"] == 0 and result["loaded_exact"]
    finally:
        writer.close()
        reader.close()


def test_a_full_prompt_hit_leaves_the_last_chunk_to_compute(daemon):
    tokens = prompt(3 * CHUNK, seed=21)
    engine = Engine(daemon)
    try:
        engine.serve("a", tokens)
        again = engine.serve("b", tokens)
        assert again["external"] == 2 * CHUNK and again["loaded_exact"]
    finally:
        engine.close()


def test_vllms_own_prefix_hit_and_a_partial_prefix(daemon):
    shared = prompt(3 * CHUNK, seed=31)
    engine = Engine(daemon, "flashinfer")
    try:
        engine.serve("a", shared + prompt(CHUNK + 3, seed=32))
        # vLLM already holds one block (half a chunk): only the rest comes from caked, from mid-chunk on.
        other = engine.serve("b", shared + prompt(2 * CHUNK, seed=33), local_hit=BLOCK)
        assert other["external"] == 3 * CHUNK - BLOCK and other["loaded_exact"] and other["errors"] == 0
    finally:
        engine.close()


def test_none_until_the_lookup_is_known(daemon):
    gate = threading.Event()

    class GatedClient:
        """The scheduler's client, whose Lookup waits for the test: vLLM must be told to ask again."""

        def __init__(self, real):
            self.real = real

        def lookup(self, *args, **kwargs):
            gate.wait(30)
            return self.real.lookup(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.real, name)

    tokens = prompt(2 * CHUNK + 1, seed=41)
    writer = Engine(daemon)
    writer.serve("w", tokens)
    writer.close()
    real = daemon.client()
    engine = Engine(daemon, scheduler_client=GatedClient(real), cake_lookup_wait_s=1.0)
    try:
        request = Request("r", tokens)
        assert engine.scheduler.get_num_new_matched_tokens(request, 0) == (None, False)
        started = time.monotonic()
        assert engine.scheduler.get_num_new_matched_tokens(request, 0) == (None, False)  # still unknown
        assert time.monotonic() - started < 0.5  # only the first ask waits (1 s here): a step asks every request
        assert len(engine.scheduler._scheduler._lookups) == 1  # one Lookup in flight, not one per ask
        gate.set()
        result = engine.serve("r", tokens)
        assert result["external"] == 2 * CHUNK and result["loaded_exact"]
    finally:
        engine.close()


def test_chunks_gone_between_lookup_and_load_are_load_errors_vllm_recomputes(fresh_daemon):
    daemon = fresh_daemon()
    tokens = prompt(4 * CHUNK + 1, seed=51)
    engine = Engine(daemon)
    try:
        engine.serve("w", tokens)
        request = Request("r", tokens)
        external, is_async = engine.scheduler.get_num_new_matched_tokens(request, 0)
        assert external == 4 * CHUNK
        with daemon.client() as admin:
            admin.evict("dram")  # gone before the worker loads
        block_ids = engine.pool.alloc(5)
        engine.scheduler.update_state_after_alloc(request, Blocks(block_ids), external)
        errors = set()
        for _ in range(5000):
            _, recving, step_errors = engine.step()
            errors |= step_errors
            if "r" in recving:
                break
        # Every block the load promised is reported: vLLM recomputes from the first (block 0 here).
        assert errors == set(block_ids[:4 * CHUNK // BLOCK])
    finally:
        engine.close()


def test_an_unreachable_daemon_is_a_miss(fresh_daemon):
    daemon = fresh_daemon()
    engine = Engine(daemon)
    daemon.stop()
    try:
        assert engine.scheduler.get_num_new_matched_tokens(Request("x", prompt(3 * CHUNK, seed=61)), 0) == (0, False)
    finally:
        engine.worker._worker._pool.shutdown()


def test_a_lookup_unanswered_past_the_timeout_is_a_miss(daemon):
    gate = threading.Event()

    class StuckClient:
        """The scheduler's client, whose Lookup is stuck (queued behind lookups a silent daemon holds)."""

        def __init__(self, real):
            self.real = real

        def lookup(self, *args, **kwargs):
            gate.wait(30)
            return self.real.lookup(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.real, name)

    real = daemon.client()
    engine = Engine(daemon, scheduler_client=StuckClient(real), cake_lookup_wait_s=0.01, cake_timeout_s=0.3)
    try:
        request = Request("r", prompt(2 * CHUNK + 1, seed=121))
        assert engine.scheduler.get_num_new_matched_tokens(request, 0) == (None, False)  # asked; not known yet
        time.sleep(0.4)
        assert engine.scheduler.get_num_new_matched_tokens(request, 0) == (0, False)  # given up: vLLM computes
        assert engine.scheduler._scheduler._lookups == {}
    finally:
        gate.set()
        engine.close()
        real.close()


def _in_thread(call):
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_a_silent_daemon_is_recomputed_within_the_timeout_and_holds_up_no_other_load(fresh_daemon):
    """A daemon that stops answering (SIGSTOP: connected, alive, silent): a load stuck on it gives up after
    cake_timeout_s and its blocks become load errors vLLM recomputes; a second load meanwhile waits for the region no
    longer than cake_region_wait_s; a lookup is a miss after the timeout."""
    timeout_s, region_wait_s = 2.0, 0.1
    daemon = fresh_daemon()
    tokens = prompt(4 * CHUNK + 1, seed=111)
    writer = Engine(daemon)
    writer.serve("w", tokens)
    writer.close()
    engine = Engine(daemon, cake_timeout_s=timeout_s, cake_region_wait_s=region_wait_s, cake_lookup_wait_s=30.0)
    worker = engine.worker._worker

    def load(request_id):
        """A synchronous load of the whole hit, as the model runner starts it for one step (each on its own thread
        here: two steps' loads at once)."""
        spec = LoadSpec(request_id, tokens[:4 * CHUNK], engine.pool.alloc(4 * CHUNK // BLOCK), 0, 4 * CHUNK,
                        is_async=False)
        return spec, lambda: worker.start_load_kv(CakeConnectorMetadata(loads=[spec]))

    os.kill(daemon.process.pid, signal.SIGSTOP)
    try:
        first, run_first = load("first")
        started = time.monotonic()
        first_thread = _in_thread(run_first)
        # The first load takes the region before it calls the daemon.
        while time.monotonic() - started < 5 and not worker._region_claim.busy:
            time.sleep(0.005)
        second, run_second = load("second")
        second_started = time.monotonic()
        second_thread = _in_thread(run_second)
        second_thread.join(timeout_s)
        assert not second_thread.is_alive(), "the second load waited on the region the stuck one holds"
        assert time.monotonic() - second_started < region_wait_s + 1.0  # the stuck one holds it for 2 s
        assert worker.get_block_ids_with_load_errors() == set(second.block_ids)  # recomputed, not waited for
        first_thread.join(timeout_s + 3)
        assert not first_thread.is_alive(), "the load on a silent daemon never gave up"
        assert worker.get_block_ids_with_load_errors() == set(first.block_ids)
        # The scheduler's lookup: a miss after the timeout, however long vLLM was told to wait for it.
        asked = time.monotonic()
        assert engine.scheduler.get_num_new_matched_tokens(Request("r", tokens), 0) == (0, False)
        assert time.monotonic() - asked < timeout_s + 2
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    engine.close()


def test_the_chunk_must_be_whole_blocks(daemon):
    with pytest.raises(ValueError, match="multiple of vLLM's block size"):
        CakeConnector(VllmConfig(daemon, cake_chunk_tokens=24), KVConnectorRole.SCHEDULER)
    worker = CakeConnector(VllmConfig(daemon), KVConnectorRole.WORKER)
    try:
        with pytest.raises(ValueError, match="1 KV caches were registered; the model has 3"):
            worker.register_kv_caches({"only": torch.zeros((2, 4, BLOCK, HEADS, DIM), dtype=torch.float16)})
    finally:
        worker.shutdown()


def test_a_kv_cache_whose_layout_cannot_be_proven_is_refused(daemon):
    """No backend writer in the forward context (an unknown backend, or one that writes in its forward): the
    connector refuses the cache at start-up instead of guessing from its shape."""
    from cake.vllm.layout import LayoutError
    worker = CakeConnector(VllmConfig(daemon), KVConnectorRole.WORKER)
    caches = {f"model.layers.{i}.self_attn.attn": torch.zeros((2, BLOCKS, BLOCK, HEADS, DIM), dtype=torch.float16)
              for i in range(LAYERS)}
    try:
        with pytest.raises(LayoutError, match="cannot prove"):
            worker.register_kv_caches(caches)
    finally:
        worker.shutdown()


def test_lossy_storage_is_asked_for_in_the_extra_config(daemon):
    from cake.vllm import namespace_for
    assert namespace_for(VllmConfig(daemon)).stored_precision == "exact"
    assert namespace_for(VllmConfig(daemon, cake_stored_precision="int8")).stored_precision == "int8"
    with pytest.raises(ValueError, match="stored_precision"):
        namespace_for(VllmConfig(daemon, cake_stored_precision="int3"))


def wait_cached(client_of, tokens, chunks, timeout=10.0):
    from cake.namespace import Namespace
    ns = Namespace("vllm:test/llama", num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, dtype="fp16",
                   chunk_tokens=CHUNK)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client_of().lookup(ns, tokens=tokens[:chunks * CHUNK]).cached_chunks >= chunks:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("kill", [True, False])
def test_after_the_daemon_restarts_the_connector_registers_again_and_the_cache_works(fresh_daemon, kill):
    """caked restarts (killed, or stopped by its operator) while vLLM runs: the regions it had are gone. The next
    store is answered NOT_FOUND on its region; the connector registers a new one and stores there, in the same
    transfer, and loads work too: without restarting vLLM."""
    daemon = fresh_daemon()
    first, second = Engine(daemon, "cpu_vec"), Engine(daemon, "cpu_vec")
    try:
        assert first.serve("before", prompt(3 * CHUNK + 1, seed=91))["stored"]
        old = first.worker._worker.region_slot.region.id
        daemon.restart(kill=kill)
        tokens = prompt(3 * CHUNK + 1, seed=92)
        assert first.serve("after", tokens)["stored"]
        assert first.worker._worker.region_slot.region.id != old
        with daemon.client() as c:
            assert wait_cached(lambda: c, tokens, 3)
        loaded = second.serve("load-after", tokens)
        assert loaded["external"] == 3 * CHUNK and loaded["loaded_exact"] and loaded["errors"] == 0
    finally:
        first.close()
        second.close()


def test_a_daemon_down_at_start_up_costs_the_cache_not_the_engine(fresh_daemon, tmp_path):
    """No daemon when vLLM starts: register_kv_caches succeeds without regions, requests compute; once caked
    answers, the connector registers its region and stores (at most one try a cake_region_retry_s)."""
    daemon = fresh_daemon()
    daemon.process.send_signal(signal.SIGSTOP)  # there, but silent: every call times out
    try:
        engine = Engine(daemon, "flash_attn", cake_timeout_s=0.5, cake_region_retry_s=0.2)
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    try:
        assert engine.worker._worker.region_slot.region is None
        daemon.restart()
        time.sleep(0.3)
        tokens = prompt(3 * CHUNK + 1, seed=93)
        result = engine.serve("late", tokens)
        assert result["stored"]
        with daemon.client() as c:
            assert wait_cached(lambda: c, tokens, 3)
    finally:
        engine.close()


def test_the_connector_logs_under_vllms_logger_once_per_reason(fresh_daemon, caplog):
    """vLLM's logging configuration prints the "vllm" logger's tree only: the connector logs as "vllm.cake", and a
    daemon that is down is one warning, not one per request."""
    import logging
    daemon = fresh_daemon()
    engine = Engine(daemon, cake_timeout_s=0.5)
    daemon.stop()
    try:
        with caplog.at_level(logging.INFO, logger="vllm.cake"):
            for i in range(4):
                assert engine.scheduler.get_num_new_matched_tokens(Request(f"x{i}", prompt(3 * CHUNK, seed=i)),
                                                                   0) == (0, False)
        lines = [r for r in caplog.records if r.name == "vllm.cake" and "lookup failed" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    finally:
        engine.worker._worker._pool.shutdown()


def test_a_daemon_paused_longer_than_the_lease_keeps_a_live_owners_regions(fresh_daemon, tmp_path):
    """caked stopped (SIGSTOP) for three leases while vLLM runs: on resuming it gives the leases the time it did not
    run, reads the renewals that waited, and the connector's region is the same one afterwards (no NOT_FOUND, no
    registration again)."""
    config = tmp_path / "caked.toml"
    config.write_text("[limits]\nregion_lease_ms = 1000\n")
    daemon = fresh_daemon("--config", str(config), "--dram-capacity-mib", "64")
    engine = Engine(daemon)
    try:
        region = engine.worker._worker.region_slot.region
        os.kill(daemon.process.pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.kill(daemon.process.pid, signal.SIGCONT)
        time.sleep(1.0)  # a lease's worth of running time: renewals (every third of it) are read
        assert engine.serve("after-pause", prompt(3 * CHUNK + 1, seed=94))["stored"]
        assert engine.worker._worker.region_slot.region is region
        assert engine.worker._worker.client.holds_region(region)
        assert "region leases get that time back" in daemon.log()
        assert "lease ran out" not in daemon.log()
    finally:
        engine.close()


def test_a_resumed_request_computes_from_its_output_tokens_not_a_chunk_of_its_prompt(daemon):
    """The "leave a token to compute" rule counts every token the request has (cake.split.split_end over
    num_tokens): a request preempted after output tokens, whose whole prompt of whole chunks is cached, loads all of
    the prompt and computes its output tokens."""
    tokens = prompt(3 * CHUNK, seed=111)
    engine = Engine(daemon)
    try:
        assert engine.serve("first", tokens)["stored"]
        assert engine.scheduler.get_num_new_matched_tokens(Request("fresh", tokens), 0) == (2 * CHUNK, True)
        resumed = Request("resumed", tokens, num_tokens=len(tokens) + 2)
        assert engine.scheduler.get_num_new_matched_tokens(resumed, 0) == (3 * CHUNK, True)
        assert engine.scheduler.get_num_new_matched_tokens(resumed, BLOCK) == (3 * CHUNK - BLOCK, True)
    finally:
        engine.close()


def test_one_record_per_asked_request_until_vllm_allocates(daemon):
    """A request's lookup and what was promised to vLLM are one record, gone once vLLM has allocated for the
    request, or the request finished, or nothing was promised."""
    tokens = prompt(3 * CHUNK + 1, seed=112)
    engine = Engine(daemon)
    side = engine.scheduler._scheduler
    try:
        engine.serve("w", tokens)
        assert side._lookups == {}
        request = Request("r", tokens)
        assert engine.scheduler.get_num_new_matched_tokens(request, 0) == (3 * CHUNK, True)
        record = side._lookups["r"]
        assert record.future.done() and record.matched == (0, 3 * CHUNK, "vllm:test/llama")
        engine.scheduler.update_state_after_alloc(request, Blocks(list(range(7))), 3 * CHUNK)
        assert side._lookups == {}
        assert engine.scheduler.get_num_new_matched_tokens(Request("hit", tokens), 3 * CHUNK) == (0, False)
        assert side._lookups == {}  # nothing beyond vLLM's own hit: forgotten at once
        assert engine.scheduler.get_num_new_matched_tokens(Request("gone", tokens), 0)[0] == 3 * CHUNK
        engine.scheduler.request_finished(Request("gone", tokens, status="RequestStatus.FINISHED_ABORTED"), [])
        assert side._lookups == {}
    finally:
        engine.close()


@pytest.mark.parametrize("layout", ["flash_attn", "cpu_amx"])
def test_scatter_rows_puts_every_run_of_rows_into_its_slots(layout):
    """cake.vllm.worker.scatter_rows, the one copy from region chunks into vLLM's blocks of both the I/O-only
    loads and the split's splices: runs of rows from several chunks, out of order (the daemon reports a load's
    chunks as they land), from mid-chunk and into a request's blocks from first_block on, converted to the cache's
    dtype; the slots around them untouched."""
    from cake.split import ChunkRows
    from cake.vllm.layout import Geometry, learn_layers, writer_of
    from cake.vllm.worker import scatter_rows
    paged = {f"layer.{i}": PagedCache(layout, BLOCKS, BLOCK, HEADS, DIM, torch.float16, fill=float("nan"))
             for i in range(LAYERS)}
    context = forward_context(paged)
    layers = learn_layers({name: p.cache for name, p in paged.items()}, Geometry(BLOCK, HEADS, DIM, torch.float16),
                          {name: writer_of(context[name], p.cache) for name, p in paged.items()})
    for p in paged.values():
        p.flat.fill_(float("nan"))
    tokens = prompt(4 * CHUNK, seed=113)
    reference = reference_kv(tokens).float()  # the chunks in fp32: the scatter converts to the cache's fp16
    chunks = [reference[:, :, c * CHUNK:(c + 1) * CHUNK] for c in range(4)]
    first_block, block_ids = 1, [9, 4, 30, 2, 17, 11, 5]  # the request's blocks 1..7, anywhere in the pool
    front, end = CHUNK + 5, 4 * CHUNK  # from mid-chunk (and mid-block) to the end of chunk 3
    rows = [ChunkRows(c, max(front, c * CHUNK), min(end, (c + 1) * CHUNK), max(front, c * CHUNK) - c * CHUNK,
                      min(end, (c + 1) * CHUNK) - c * CHUNK) for c in (3, 1, 2)]
    scatter_rows(layers, [(chunks[r.chunk], r) for r in rows], block_ids, BLOCK, torch.device("cpu"),
                 first_block=first_block)
    ids = [None] + block_ids  # token t lives in the request's block t // BLOCK
    slots = [ids[t // BLOCK] * BLOCK + t % BLOCK for t in range(front, end)]
    for layer, p in enumerate(paged.values()):
        k, v = p.read(slots)
        assert torch.equal(k.view(-1, HEADS, DIM), reference[layer, 0, front:end].half())
        assert torch.equal(v.view(-1, HEADS, DIM), reference[layer, 1, front:end].half())
        below = [ids[t // BLOCK] * BLOCK + t % BLOCK for t in range(BLOCK, front)]  # the rows below the front
        assert torch.isnan(p.read(below)[0].float()).all()
    scatter_rows(layers, [], block_ids, BLOCK, torch.device("cpu"))  # nothing to copy: nothing done


def test_the_older_module_paths_name_the_packages_objects():
    """Configurations and imports written before cake.vllm became a package keep working: the connector by module
    path "cake.vllm", the scheduler classes by cake.vllm_scheduler, and cake.vllm_split, cake.vllm_layout,
    cake.vllm_log, cake.vllm_plugin; all of them import without vLLM or torch."""
    import subprocess
    import sys
    code = """
import sys
sys.modules.update({"torch": None, "vllm": None})  # neither importable
import importlib
import cake.vllm as package
from cake.vllm import connector, data, layout, log, scheduler, worker
old = {name: importlib.import_module("cake." + name) for name in (
    "vllm_split", "vllm_scheduler", "vllm_layout", "vllm_log", "vllm_plugin")}
assert package.CakeConnector is connector.CakeConnector
assert package.namespace_for is importlib.import_module("cake.vllm.config").namespace_for
for name in ("SplitMetadata", "SplitScheduler", "SplitWorker", "WindowPool", "forced_split_at"):
    assert getattr(old["vllm_split"], name) is (getattr(data, name, None) or getattr(scheduler, name, None)
                                               or getattr(worker, name)), name
assert old["vllm_scheduler"].CakeSchedulerMixin is scheduler.CakeSchedulerMixin
for name in ("Geometry", "LayoutError", "PagedLayer", "learn_layers", "writer_of"):
    assert getattr(old["vllm_layout"], name) is getattr(layout, name), name
for name in ("RegionSlot", "forget", "forget_all", "log", "once", "region_unknown"):
    assert getattr(old["vllm_log"], name) is getattr(log, name), name
assert callable(old["vllm_plugin"].register)
try:
    old["vllm_scheduler"].CakeScheduler  # made on first use, from vLLM's Scheduler
except ImportError:
    pass
else:
    raise AssertionError("CakeScheduler without vLLM")
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_wheel_ships_every_package():
    """pyproject.toml names each package the wheel carries: a folder of cake left out is missing from the wheel."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    cake_dir = os.path.join(here, "..", "cake")
    found = {"cake"} | {f"cake.{name}" for name in os.listdir(cake_dir)
                        if os.path.isfile(os.path.join(cake_dir, name, "__init__.py"))}
    assert found <= listed, sorted(found - listed)
