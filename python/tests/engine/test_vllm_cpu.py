"""A real vLLM engine (vllm-cpu) with caked's connector and Cake's split, against plain vLLM's greedy tokens.

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so the test can read the scheduler's split book):
a Llama with seeded random weights (4 layers, hidden 256, 2 KV heads; real weights make every token depend on every
position's KV), fp32, vLLM blocks of 32 tokens, prefill steps of max_num_batched_tokens = 100 (not a multiple of the
block size: the front computed when a split jumps, F, is then inside a block), Cake chunks of 96 tokens.
The reference is plain vLLM (no connector, no prefix cache) in a process of its own (vllm_cpu_reference.py), same
model, dtype, block size and prefill step. Every case compares 12 greedy tokens, not only the first.

Cases (issue 45): a split whose jump lands inside a block; four split requests in flight in one batch; a prompt
whose tail was computed after a mid-block jump, stored, then loaded I/O-only (a poisoned store would show there);
caked restarted under the engine, after which the connector registers its regions again and stores and splits work.

Runs in the vllm-cpu venv scripts/setup makes (python/requirements-vllm-cpu.txt); ctest's python-vllm-cpu entry.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
pytest.importorskip("vllm")
from vllm.platforms import current_platform  # noqa: E402

if not current_platform.is_cpu():
    pytest.skip("not vllm-cpu: these tests run a real engine on this CPU", allow_module_level=True)

from cake.namespace import Namespace  # noqa: E402
from cake.testing import SpawnedDaemon  # noqa: E402
from cake_bench.vllm_ttft import make_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 4, 4, 2, 1024
BLOCK, BATCHED, CHUNK, MAX_TOKENS = 32, 100, 96, 12


def prompt(seed, n):
    return [(i * 7919 + seed * 104729 + 13) % (VOCAB - 3) + 3 for i in range(n)]


# name -> token ids. The store case's prefix is its prompt's first 8 chunks (plus one token: a stored prefix's last
# chunk must be full and not the prompt's last token).
PROMPTS = {
    "single": prompt(1, 1537),
    "batch0": prompt(2, 1100), "batch1": prompt(3, 1300), "batch2": prompt(4, 997), "batch3": prompt(5, 1450),
    "stored": prompt(6, 1537),
    "restart": prompt(7, 1201),
}
PREFIX = {"stored": PROMPTS["stored"][:8 * CHUNK + 1]}


@pytest.fixture(scope="module")
def work():
    with tempfile.TemporaryDirectory(prefix="cake-vllm-cpu-") as folder:
        make_model(os.path.join(folder, "llama"), HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, 0)
        yield folder


@pytest.fixture(scope="module")
def reference(work):
    """Plain vLLM's greedy tokens for every prompt, each run alone."""
    prompts, out = os.path.join(work, "prompts.json"), os.path.join(work, "reference.json")
    with open(prompts, "w") as f:
        json.dump(PROMPTS, f)
    done = subprocess.run([sys.executable, os.path.join(HERE, "vllm_cpu_reference.py"), os.path.join(work, "llama"),
                           prompts, out, str(BATCHED), str(MAX_TOKENS)], cwd=work, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert done.returncode == 0, f"the reference vLLM failed:\n{done.stdout[-6000:]}"
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def daemon():
    # A read cap caked can change at run time (cap_reads below); 1000 Gbit/s is no cap here.
    with SpawnedDaemon(["--dram-capacity-mib", "512", "--dram-read-gbps", "1000"]) as d:
        yield d


class Engine:
    """One vllm.LLM with CakeConnector (split on) and CakeScheduler; records every jump the split book notes."""

    def __init__(self, model_dir, daemon):
        from vllm import LLM
        from vllm.config import KVTransferConfig
        self.daemon, self.model_dir = daemon, model_dir
        self.llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=4096,
                       max_num_batched_tokens=BATCHED, enforce_eager=True, seed=0, block_size=BLOCK,
                       enable_prefix_caching=True, scheduler_cls="cake.vllm_scheduler.CakeScheduler",
                       kv_transfer_config=KVTransferConfig(
                           kv_connector="CakeConnector", kv_connector_module_path="cake.vllm", kv_role="kv_both",
                           kv_load_failure_policy="recompute",
                           kv_connector_extra_config={"cake_socket": daemon.socket_path, "cake_chunk_tokens": CHUNK,
                                                      "cake_split": True, "cake_lookup_wait_s": 1.0,
                                                      "cake_region_chunks": 64, "cake_region_retry_s": 0.2}))
        self.core = self.llm.llm_engine.engine_core.engine_core  # in this process: no engine-core process
        book = self.core.scheduler.connector.cake_split.book
        self.jumps = []
        note = book.note_jump

        def noted(req_id, from_tokens, to_tokens):
            self.jumps.append((req_id, from_tokens, to_tokens))
            return note(req_id, from_tokens, to_tokens)
        book.note_jump = noted
        self.ns = Namespace(f"vllm:{model_dir}", num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=HIDDEN // HEADS,
                            dtype="fp32", chunk_tokens=CHUNK)

    def idle(self):
        """What vLLM's engine-core loop does between requests, which an engine in this process does only when asked:
        a step while finished requests still hold blocks for the connector (their stores end there)."""
        if self.core.scheduler.has_requests():
            self.core.step()
        else:
            time.sleep(0.02)

    def empty_prefix_cache(self):
        """vLLM's own prefix cache must not serve a prompt: empty it once the last run's stores hand their blocks
        back (vLLM refuses while blocks are held)."""
        deadline = time.monotonic() + 60
        while not self.llm.reset_prefix_cache():
            assert time.monotonic() < deadline, "vLLM's prefix cache could not be emptied within 60 s"
            self.idle()

    def generate(self, names, params=None, prompts=PROMPTS):
        """{name: greedy tokens}, the prompts in one batch; params: kv_transfer_params for every request."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        self.empty_prefix_cache()
        sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, detokenize=False,
                                  extra_args={"kv_transfer_params": dict(params or {})})
        out = self.llm.generate([TokensPrompt(prompt_token_ids=prompts[n]) for n in names], sampling,
                                use_tqdm=False)
        return {n: list(o.outputs[0].token_ids) for n, o in zip(names, out)}

    def store(self, names, prompts=PROMPTS):
        """Compute the prompts without loading (compute-only), then wait until caked holds every full chunk."""
        self.generate(names, {"cake_load": False}, prompts)
        with self.daemon.client() as admin:
            for n in names:
                full = (len(prompts[n]) - 1) // CHUNK
                deadline = time.monotonic() + 60
                while admin.lookup(self.ns, tokens=prompts[n][:full * CHUNK]).cached_chunks < full:
                    assert time.monotonic() < deadline, f"{n}: its KV was not stored within 60 s"
                    self.idle()

    def split(self, names):
        """The prompts with Cake's split, and the jumps the book noted while they ran."""
        before = len(self.jumps)
        tokens = self.generate(names)
        return tokens, self.jumps[before:]

    def cap_reads(self, names):
        """Cap caked's DRAM reads so that loading the prompts' cached chunks takes about as long as computing them:
        the split then meets in the middle, not at the first or the last step."""
        started = time.monotonic()
        self.generate(names, {"cake_load": False})
        seconds = time.monotonic() - started
        cached = sum((len(PROMPTS[n]) - 1) // CHUNK for n in names) * self.ns.chunk_bytes
        with self.daemon.client() as admin:
            admin.set_read_cap("dram", max(0.001, cached * 8 / seconds / 1e9))

    def stats(self):
        with self.daemon.client() as admin:
            return admin.stats()


@pytest.fixture(scope="module")
def engine(work, daemon):
    e = Engine(os.path.join(work, "llama"), daemon)
    yield e
    e.empty_prefix_cache()  # the last stores are done before the daemon stops


def mid_block(jumps):
    return [j for j in jumps if j[1] % BLOCK != 0]


def test_a_jump_inside_a_block_gives_plain_vllms_tokens(engine, reference):
    engine.store(["single"])
    engine.cap_reads(["single"])
    tokens, jumps = engine.split(["single"])
    assert jumps, "the split never jumped: nothing here tested it"
    assert tokens["single"] == reference["single"], f"jumps {jumps}"
    # Prefill steps of 100 tokens: the front is a multiple of 100, inside a block unless it is 800 or 1600.
    assert mid_block(jumps) or all(j[1] in (800, 1600) for j in jumps), jumps


def test_four_split_requests_in_flight_give_plain_vllms_tokens(engine, reference):
    names = ["batch0", "batch1", "batch2", "batch3"]
    engine.store(names)
    engine.cap_reads(names)
    tokens, jumps = engine.split(names)
    assert len({j[0] for j in jumps}) >= 2, f"fewer than two requests jumped: {jumps}"
    assert mid_block(jumps), f"no jump inside a block: {jumps}"
    for n in names:
        assert tokens[n] == reference[n], f"{n}: jumps {jumps}"


def test_chunks_computed_after_a_mid_block_jump_are_stored_right(engine, reference):
    """The prefix is cached, the prompt's split jumps inside a block and computes the rest, which the connector
    stores; an I/O-only load of the whole prompt then serves those chunks. Poisoned chunks give other tokens."""
    engine.store(["stored"], prompts=PREFIX)
    engine.cap_reads(["stored"])
    tokens, jumps = engine.split(["stored"])
    assert jumps and tokens["stored"] == reference["stored"], f"jumps {jumps}"
    full = (len(PROMPTS["stored"]) - 1) // CHUNK
    with engine.daemon.client() as admin:
        deadline = time.monotonic() + 60
        while admin.lookup(engine.ns, tokens=PROMPTS["stored"][:full * CHUNK]).cached_chunks < full:
            assert time.monotonic() < deadline, "the chunks computed after the jump were not stored"
            engine.idle()
        admin.set_read_cap("dram", 1000)
    before = engine.stats()
    tokens = engine.generate(["stored"], {"cake_split": False})
    after = engine.stats()
    assert after.get("loads_io_only", 0) == before.get("loads_io_only", 0) + 1
    assert after.get("load_chunks_loaded", 0) - before.get("load_chunks_loaded", 0) == full
    assert tokens["stored"] == reference["stored"]


def test_after_caked_restarts_the_connector_registers_again_and_splits(engine, reference):
    engine.daemon.restart(kill=True)
    engine.store(["restart"])  # a store needs the region back: it fails for good without re-registering
    engine.cap_reads(["restart"])
    tokens, jumps = engine.split(["restart"])
    assert jumps, "no split after the restart"
    assert tokens["restart"] == reference["restart"], f"jumps {jumps}"
