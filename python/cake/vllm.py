"""caked behind vLLM: a KV connector (vLLM's KVConnectorBase_V1) on the Python client.

Enable it with (docs/engines.md, "vLLM"):

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "CakeConnector", "kv_connector_module_path": "cake.vllm",
        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"cake_socket": "/run/cake/caked.sock", "cake_chunk_tokens": 256}}'

Written against vllm-project/vllm's v1 connector interface: kv_connector/v1/base.py at
003df2961dd8830c317a61f9745ccd557da9fa06 (and the older 13f4ad0f55b08ca1d37d1459f50ce950feaeb547), the factory at
a4cd9d0d28bdb41db8dfe0acdafac2bf2f608630, the scheduler that calls it (v1/core/sched/scheduler.py at
00024d314514900f361ad072af6931e403b7f589), the worker's call order (v1/worker/kv_connector_model_runner_mixin.py at
23ec7c7fab7aa8edb1c14195c048113e210683fa) and the example connector (example_connector.py at
4c1654210cfd5f3d07459cc3a23eef6aaea20706 and 00231834dc62bb1127ec5c8f2e6762c87d2f477e). vLLM itself was not run.

What it does:
- Scheduler side: get_num_new_matched_tokens sends the prompt's tokens to caked's Lookup on a thread of its own
  and answers None (ask again) until the answer is in; then the tokens cached beyond vLLM's own prefix hit, in whole
  chunks (a chunk is a multiple of vLLM's block size), leaving at least one token to compute. Loads are
  asynchronous by default (the request waits in WAITING_FOR_REMOTE_KVS while the worker loads).
- Worker side: an I/O-only Load of the chunks into a region of the daemon's (device memory over CUDA IPC when the
  KV cache is on a GPU, host shared memory otherwise), then a scatter of each chunk's tokens into vLLM's blocks, one
  indexed copy per layer for K and V, in the layout the registered KV caches have (FlashAttention's
  [2, blocks, block_size, heads, dim], FlashInfer's [blocks, 2, ...], or the [blocks, heads, block_size, K|V] view).
  Chunks that fail to load become load errors on their blocks, which vLLM recomputes.
- Stores: when a request finishes, the scheduler holds its blocks (request_finished returns True) and the worker
  gathers the prompt's full chunks out of them into the region and Stores them, then reports the request as sent.
- Cake's split (compute the front while the back loads): with "cake_split": true in kv_connector_extra_config
  and vLLM's scheduler class cake.vllm_scheduler.CakeScheduler (CakeAsyncScheduler under async scheduling), an
  eligible request computes forward from vLLM's local hit while a cake-mode load fills a window of the worker's
  split region from the tail; the scheduler jumps the request over what every rank holds and the worker splices
  those rows into the blocks before the step's forward (cake/vllm_split.py, cake/split.py). Without the scheduler
  class, or for requests the split does not take, the connector loads the cached suffix I/O-only, which stock vLLM
  supports.
- A silent daemon never stalls vLLM: every call to it has a deadline (cake_timeout_s, 30 s), after which the
  lookup is a miss and the load's blocks are load errors vLLM recomputes; a load or store that finds the region in
  use waits for it at most cake_region_wait_s (1 s) and then does the same, so one call stuck on the daemon holds up
  no other.
"""
import concurrent.futures
import enum
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from cake.client import Client
from cake.errors import CakeError
from cake.layout import ChunkLayout
from cake.namespace import Namespace
from cake.regions import RegionClaim
from cake.split import SplitConfig, parse_flag
from cake.vllm_layout import Geometry, LayoutError, learn_layers, writer_of
from cake.vllm_log import RegionSlot, forget_all, log, once, region_unknown
from cake.vllm_split import SplitScheduler, SplitWorker

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                   KVConnectorRole)
except ImportError:  # tests, and machines without vLLM: the same methods on plain bases
    KVConnectorBase_V1 = object
    KVConnectorMetadata = object

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1


_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float8_e4m3fn": "fp8",
           "torch.float8_e5m2": "fp8", "torch.uint8": "fp8", "torch.int8": "int8", "float32": "fp32",
           "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}


@dataclass
class LoadSpec:
    """One request's load: its prompt's tokens through the cached chunks, the tokens [start, end) to put into
    `block_ids` (start is vLLM's own prefix hit), whether vLLM waits for it asynchronously, and the request's
    namespace suffix (LoRA, cache salt) beyond the model's."""
    request_id: str
    tokens: list
    block_ids: list
    start: int
    end: int
    is_async: bool
    model_id: str = ""


@dataclass
class StoreSpec:
    """One finished request's store: the prompt's computed full chunks and the blocks holding them. ranges: the
    chunk ranges [first, end) to store (None: all of tokens' full chunks); a split request stores only the chunks
    it computed, not those spliced in from the cache."""
    request_id: str
    tokens: list
    block_ids: list
    model_id: str = ""
    ranges: list = None


@dataclass
class CakeConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    stores: list = field(default_factory=list)
    split: object = None  # cake.vllm_split.SplitMetadata, in split mode on steps with something to do


def _extra(vllm_config):
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    return dict(getattr(transfer, "kv_connector_extra_config", None) or {})


def namespace_for(vllm_config, tp_rank=None):
    """The namespace both sides use: the model, this rank's share of the KV heads, the dtype, the chunk size."""
    extra = _extra(vllm_config)
    model, parallel, cache = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    chunk_tokens = int(extra.get("cake_chunk_tokens", 256))
    block_size = int(cache.block_size)
    if chunk_tokens % block_size != 0:
        raise ValueError(f"cake_chunk_tokens ({chunk_tokens}) must be a multiple of vLLM's block size ({block_size})")
    cache_dtype = str(getattr(cache, "cache_dtype", "auto"))
    dtype = _DTYPES.get(str(model.dtype) if cache_dtype == "auto" else cache_dtype)
    if dtype is None:
        raise ValueError(f"KV dtype {model.dtype if cache_dtype == 'auto' else cache_dtype} has no Cake equivalent")
    tp_size = int(getattr(parallel, "tensor_parallel_size", 1))
    rank = int(getattr(parallel, "rank", 0) if tp_rank is None else tp_rank) % tp_size
    model_id = str(extra.get("cake_model_id") or f"vllm:{model.model}")
    if dtype == "fp8":  # e4m3 and e5m2 are different bytes under one element size
        model_id += f"|{cache_dtype if cache_dtype != 'auto' else model.dtype}"
    pp_size = int(getattr(parallel, "pipeline_parallel_size", 1) or 1)
    if pp_size > 1:  # each stage holds other layers
        model_id += f"|pp{_pipeline_rank(parallel)}of{pp_size}"
    return Namespace(model_id,
                     num_layers=int(model.get_num_layers(parallel)),
                     num_kv_heads=int(model.get_num_kv_heads(parallel)), head_dim=int(model.get_head_size()),
                     dtype=dtype, tp_rank=rank, tp_size=tp_size, chunk_tokens=chunk_tokens,
                     tenant=str(extra.get("cake_tenant", "")),
                     stored_precision=str(extra.get("cake_stored_precision", "exact")))


def _pipeline_rank(parallel):
    try:
        from vllm.distributed.parallel_state import get_pp_group
        return get_pp_group().rank_in_group
    except Exception:  # the scheduler (no groups), or no vLLM: the config's word
        return int(getattr(parallel, "pipeline_parallel_rank", 0) or 0)


def _request_namespace(ns, request):
    """The namespace a request's KV lives in, or None for one whose KV depends on more than its tokens (images,
    audio: the cache would hand one image's KV to another's request). A LoRA adapter and a cache salt each give
    their own namespace: the same tokens under another adapter, or another user's salt, never share KV."""
    if getattr(request, "mm_features", None) or getattr(request, "mm_hashes", None) or \
            getattr(request, "mm_positions", None):
        return None
    extra = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        extra.append(f"lora={getattr(lora, 'lora_name', None) or getattr(lora, 'name', '')}:"
                     f"{getattr(lora, 'lora_int_id', '')}")
    salt = getattr(request, "cache_salt", None)
    if salt:
        extra.append(f"salt={salt}")
    if not extra:
        return ns
    import dataclasses
    return dataclasses.replace(ns, model_id="|".join([ns.model_id, *extra]))


def _request_flag(request, name):
    """A per-request switch in the request's kv_transfer_params (vLLM's SamplingParams.extra_args
    {"kv_transfer_params": {...}}): "cake_load": false computes the request without the cache, "cake_split": false
    keeps it off the split (I/O-only). None when the request does not say."""
    params = getattr(request, "kv_transfer_params", None)
    if not isinstance(params, dict) or name not in params:
        return None
    return parse_flag(params[name])


def _connect(vllm_config, who):
    """The connector's client. A daemon that does not answer now costs the cache, not vLLM's start: the client
    then connects on its first call that finds the daemon (every call until then is a miss or a failed transfer,
    which vLLM computes), and the worker registers its regions then (cake.vllm_log.RegionSlot)."""
    extra = _extra(vllm_config)
    timeout_s = float(extra.get("cake_timeout_s", 30.0))
    kwargs = dict(client_id=f"vllm-{who}-{os.getpid()}", timeout_s=timeout_s, load_timeout_s=timeout_s)
    socket = extra.get("cake_socket") or None
    try:
        return Client(socket, connect_timeout_s=min(5.0, timeout_s), **kwargs)
    except CakeError as error:
        if getattr(error.code, "name", None) != "UNAVAILABLE" or socket is None:
            raise  # no socket named and none found, or a refusal: a configuration to fix, said at start
        once(logging.WARNING, "connect", "caked does not answer on %s: vLLM starts without its cache, which comes "
             "on once caked answers (%s)", socket, error)
        return Client(socket, connect_timeout_s=None, **kwargs)


class _SchedulerSide:
    """Lookups, the block ids vLLM gave each load, and what the next step's metadata carries."""

    def __init__(self, vllm_config, client):
        extra = _extra(vllm_config)
        self.client = client
        self.ns = namespace_for(vllm_config, tp_rank=0)  # every rank stores its shard alike: rank 0 stands for all
        self.block_size = int(vllm_config.cache_config.block_size)
        self.load_async = bool(extra.get("cake_load_async", True))
        self.lookup_wait_s = float(extra.get("cake_lookup_wait_s", 0.002))
        # The first lookup of a waiting request asks the daemon to copy its hit from disk or Redis into DRAM
        # meanwhile (cake_prefetch = false: not), so the load that follows reads it from memory.
        self.prefetch = parse_flag(extra.get("cake_prefetch", True))
        # A lookup still unanswered after this long (queued behind lookups a silent daemon holds) is a miss.
        self.lookup_timeout_s = float(extra.get("cake_timeout_s", 30.0))
        # The worker's region holds this many chunks: a longer hit could not land whole, so none is promised.
        self.region_chunks = int(extra.get("cake_region_chunks", 64))
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="cake-lookup")
        self._lookups = {}        # request id -> Future of cached chunks
        self._lookup_started = {}  # request id -> monotonic time its lookup was asked for
        self._matched = {}        # request id -> (start, end, model id): the tokens promised to vLLM
        self._loads = []
        self._stores = []
        self._lock = threading.Lock()
        # Split mode: the book of split loads, which cake.vllm_scheduler's mixin binds to (and jumps by).
        self.split = None
        if parse_flag(extra.get("cake_split", False)):
            world = int(getattr(vllm_config.parallel_config, "tensor_parallel_size", 1) or 1)
            self.split = SplitScheduler(SplitConfig.from_extra(extra, block_size=self.block_size, world_size=world),
                                        speculative=getattr(vllm_config, "speculative_config", None) is not None)
        self.block_ids_of = None  # the connector sets it: vLLM's KVCacheManager.get_block_ids

    def _lookup(self, ns, tokens):
        try:
            cached = self.client.lookup(ns, tokens=tokens, prefetch=self.prefetch).cached_chunks
        except Exception as error:  # anything: a lookup thread that raised would leave the request unanswered
            reason = getattr(getattr(error, "code", None), "name", None) or type(error).__name__
            once(logging.WARNING, f"lookup:{reason}", "caked lookup failed, computing instead (said once until "
                 "lookups work again): %s", error)
            return 0
        if forget_all("lookup:"):
            log.info("caked lookups work again")
        return cached

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens = list(request.prompt_token_ids or [])
        chunk = self.ns.chunk_tokens
        ns = _request_namespace(self.ns, request)
        if len(tokens) < chunk or ns is None or _request_flag(request, "cake_load") is False:
            return 0, False
        with self._lock:
            future = self._lookups.get(request.request_id)
            first_ask = future is None
            if first_ask:
                future = self._pool.submit(self._lookup, ns, tokens[:len(tokens) // chunk * chunk])
                self._lookups[request.request_id] = future
                self._lookup_started[request.request_id] = time.monotonic()
            started = self._lookup_started.get(request.request_id, time.monotonic())
        # Only the first ask waits (a little): a step with many waiting requests must not wait on each of them.
        if not future.done() and not first_ask:
            if time.monotonic() - started < self.lookup_timeout_s:
                return None, False
            future.cancel()  # still queued: never sent; running: its own deadline ends it
            with self._lock:
                self._lookups.pop(request.request_id, None)
                self._lookup_started.pop(request.request_id, None)
            once(logging.WARNING, "lookup:unanswered", "caked lookup of request %s unanswered after %.1f s, "
                 "computing instead (said once until lookups work again)", request.request_id, self.lookup_timeout_s)
            return 0, False
        try:
            cached_chunks = future.result(timeout=self.lookup_wait_s)
        except concurrent.futures.TimeoutError:
            return None, False  # not known yet: vLLM asks again on a later step
        if self.split is not None and _request_flag(request, "cake_split") is not False and \
                self.split.admit(request, ns, num_computed_tokens, cached_chunks):
            return 0, False  # the engine computes from its local hit; the split's load starts when it runs
        # No more than the worker's region holds past vLLM's own hit.
        cached_chunks = min(cached_chunks, num_computed_tokens // chunk + self.region_chunks)
        cached = cached_chunks * chunk
        # At least one token is computed (vLLM needs one to sample from): a whole chunk less, so loads stay
        # chunk- and block-aligned.
        while cached >= request.num_tokens and cached > 0:
            cached -= chunk
        external = cached - num_computed_tokens
        if external <= 0:
            with self._lock:
                self._lookups.pop(request.request_id, None)
                self._lookup_started.pop(request.request_id, None)
            return 0, False
        with self._lock:
            self._matched[request.request_id] = (num_computed_tokens, cached, ns.model_id)
        return external, self.load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        with self._lock:
            self._lookups.pop(request.request_id, None)
            self._lookup_started.pop(request.request_id, None)
            matched = self._matched.pop(request.request_id, None)
        if num_external_tokens <= 0 or matched is None:
            return  # nothing to load (or the second call after an asynchronous load)
        start, end, model_id = matched
        if end - start != num_external_tokens:
            log.warning("vLLM allocated %d external tokens for request %s, %d were offered; loading what it took",
                        num_external_tokens, request.request_id, end - start)
            end = start + min(end - start, num_external_tokens) // self.block_size * self.block_size
        block_ids = list(blocks.get_block_ids()[0])
        with self._lock:
            self._loads.append(LoadSpec(request.request_id, list(request.prompt_token_ids)[:end], block_ids, start,
                                        end, self.load_async, model_id))

    def build_connector_meta(self, scheduler_output):
        with self._lock:
            meta = CakeConnectorMetadata(loads=self._loads, stores=self._stores)
            self._loads, self._stores = [], []
        if self.split is not None:
            meta.split = self.split.build(scheduler_output, self.block_ids_of)
        return meta

    def shutdown(self):
        self._pool.shutdown(wait=True)

    def request_finished(self, request, block_ids):
        """Holds the finished request's blocks until the worker has stored the full chunks of its prompt that
        were computed: a request aborted mid-prefill, or before its load ended, stores only what its blocks truly
        hold (nothing, for one still waiting on its load)."""
        with self._lock:
            self._lookups.pop(request.request_id, None)
            self._lookup_started.pop(request.request_id, None)
            self._matched.pop(request.request_id, None)
        ranges = self.split.finished(request) if self.split is not None else None
        if "WAITING" in str(getattr(request, "status", "")):
            return False, None  # never ran: its blocks hold nothing of it (and vLLM frees them its own way)
        ns = _request_namespace(self.ns, request)
        tokens = list(request.prompt_token_ids or [])
        chunk = self.ns.chunk_tokens
        computed = min(len(tokens), int(getattr(request, "num_computed_tokens", 0) or 0))
        if ranges is None:
            ranges = [(0, computed // chunk)] if computed >= chunk else []
        ranges = [(first, end) for first, end in ranges if end > first]
        full = max((end for _, end in ranges), default=0) * chunk
        blocks_needed = full // self.block_size
        if ns is None or full == 0 or len(block_ids) < blocks_needed:
            return False, None
        with self._lock:
            self._stores.append(StoreSpec(request.request_id, tokens[:full], list(block_ids[:blocks_needed]),
                                          ns.model_id, [tuple(r) for r in ranges]))
        return True, None


def _tensor_parallel_rank():
    """This worker's tensor-parallel rank, from vLLM's process groups where they exist."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return get_tensor_model_parallel_rank()
    except Exception:  # no vLLM, or its groups are not set up: the config's rank
        return None


class _WorkerSide:
    """The region, the loads and stores of each step, and what get_finished and the load errors report."""

    def __init__(self, vllm_config, client):
        extra = _extra(vllm_config)
        self.vllm_config = vllm_config
        self.client = client
        self.ns = namespace_for(vllm_config, tp_rank=_tensor_parallel_rank())
        self.layout = ChunkLayout.of(self.ns)
        self.region_chunks = int(extra.get("cake_region_chunks", 64))
        self.region_wait_s = float(extra.get("cake_region_wait_s", 1.0))
        self.layers = []
        self.region_slot = None  # cake.vllm_log.RegionSlot, made with the KV caches
        self.retry_s = float(extra.get("cake_region_retry_s", 1.0))
        self._region_claim = RegionClaim()  # one load or store uses the region at a time
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cake-transfer")
        self._lock = threading.Lock()
        self._recved, self._sent, self._errors = set(), set(), set()
        self.split_enabled = parse_flag(extra.get("cake_split", False))
        self.split_region_chunks = int(extra.get("cake_split_region_chunks", self.region_chunks))
        self.split = None  # SplitWorker, made with the KV caches

    def register_kv_caches(self, kv_caches):
        """Learns each layer's layout from its attention backend and proves it (cake.vllm_layout), then registers
        the regions. A layout the connector cannot prove is refused here, before any byte is loaded or stored."""
        if len(kv_caches) != self.ns.num_layers:
            raise ValueError(f"{len(kv_caches)} KV caches were registered; the model has {self.ns.num_layers} "
                             "attention layers (hybrid, sliding-window and MLA models are not supported yet)")
        self.block_size = int(self.vllm_config.cache_config.block_size)
        compilation = getattr(self.vllm_config, "compilation_config", None)
        context = getattr(compilation, "static_forward_context", None) or {}
        writers = {name: writer_of(context.get(name), cache) for name, cache in kv_caches.items()}
        cache_config = self.vllm_config.cache_config
        geometry = Geometry(block_size=self.block_size, heads=self.ns.num_kv_heads, head_dim=self.ns.head_dim,
                            model_dtype=self.vllm_config.model_config.dtype,
                            cache_dtype=str(getattr(cache_config, "cache_dtype", "auto")))
        try:
            self.layers = learn_layers(kv_caches, geometry, {n: w for n, w in writers.items() if w is not None})
        except LayoutError as error:
            log.error("caked's connector refuses this KV cache: %s", error)
            raise
        first = self.layers[0]
        log.info("caked's connector learned the KV cache layout from the attention backend and proved it on %d "
                 "layers (%s)", len(self.layers), first.kind)
        self.device = first.cache.device
        # Device memory where the daemon serves it (CUDA IPC), host shared memory otherwise. The ordinal is this
        # process's: under CUDA_VISIBLE_DEVICES it must be the daemon's numbering too (docs/engines.md).
        # A daemon that is down now, restarts later or lets a region lapse while unreachable costs the cache, never
        # the engine: the slots register their regions (again) when they can (cake.vllm_log.RegionSlot).
        kind = "auto" if self.device.type == "cuda" else "host"
        self.region_slot = RegionSlot(self.client, self.region_chunks * self.ns.chunk_bytes, kind,
                                      self.device.index or 0, "load and store", self.retry_s)
        self.region_slot.get()
        if self.split_enabled:
            # The split's loads run while the engine computes, several at once, each in a window of its own: a
            # region of their own, so an I/O-only load or a store never waits behind them.
            split_slot = RegionSlot(self.client, self.split_region_chunks * self.ns.chunk_bytes, kind,
                                    self.device.index or 0, "split", self.retry_s)
            split_slot.get()
            self.split = SplitWorker(self.client, self.ns, split_slot, self.ns.tp_rank, self.block_size,
                                     self.layers, self.device, self._chunk_view)

    def _chunk_view(self, index, region):
        from cake.layout import _TORCH
        import torch
        flat = region.torch()[index * self.ns.chunk_bytes:(index + 1) * self.ns.chunk_bytes]
        return flat.view(getattr(torch, _TORCH[self.ns.dtype])).view(self.layout.shape)

    def _slots(self, block_ids, first, last):
        import torch
        positions = torch.arange(first, last)
        blocks = torch.tensor(block_ids, dtype=torch.int64)[positions // self.block_size]
        return blocks.to(self.device), (positions % self.block_size).to(self.device)

    def _blocks_of(self, spec, first, last):
        bs = self.block_size
        return set(spec.block_ids[first // bs:(last + bs - 1) // bs]) if last > first else set()

    def _sync(self, region):
        # Copies into or out of a device region run on the current stream: done before the region is reused
        # (another load) or read by the daemon (Store).
        if self.device.type == "cuda" or getattr(region, "kind", "host") == "cuda":
            import torch
            torch.cuda.synchronize(self.device if self.device.type == "cuda" else None)

    def _spec_namespace(self, spec):
        import dataclasses
        return self.ns if not spec.model_id or spec.model_id == self.ns.model_id else dataclasses.replace(
            self.ns, model_id=spec.model_id)

    def _load(self, spec):
        """Loads chunks of [spec.start, spec.end) into the region and scatters their tokens into the blocks. The
        tokens that did not arrive (read failures, chunks evicted since the lookup, a window too small) make their
        blocks load errors: vLLM recomputes from the first."""
        chunk = self.ns.chunk_tokens

        def load_into(region):
            """The loaded tokens, [lo, hi): the daemon reports a suffix of the cached chunks."""
            valid = (spec.end, spec.end)
            with self.client.load(self._spec_namespace(spec), tokens=spec.tokens, region=region,
                                  mode="io_only", computed_through=spec.start // chunk) as load:
                for event in load:
                    lo = max(spec.start, event.chunk * chunk)
                    hi = min(spec.end, (event.chunk + 1) * chunk)
                    if lo >= hi:
                        continue
                    view = self._chunk_view(event.region_offset // self.ns.chunk_bytes, region)
                    blocks, offsets = self._slots(spec.block_ids, lo, hi)
                    rows = slice(lo - event.chunk * chunk, hi - event.chunk * chunk)
                    for layer_index, layer in enumerate(self.layers):
                        layer.write(blocks, offsets, view[layer_index, 0, rows].to(layer.cache.dtype),
                                    view[layer_index, 1, rows].to(layer.cache.dtype))
                plan = load.plan
                if load.loaded_low < plan.cached_chunks:
                    valid = (max(spec.start, load.loaded_low * chunk), min(spec.end, plan.cached_chunks * chunk))
                self._sync(region)  # the scatter has read the region before the region is let go
                load.release()
            return valid

        valid = (spec.end, spec.end)  # nothing loaded, until the load says otherwise
        try:
            valid = self._with_region(load_into, "load of request %s failed, vLLM recomputes it",
                                      spec.request_id) or valid
        finally:
            failed = self._blocks_of(spec, spec.start, valid[0]) | self._blocks_of(spec, valid[1], spec.end)
            with self._lock:
                self._errors |= failed
                if spec.is_async:
                    self._recved.add(spec.request_id)

    def _store(self, spec):
        chunk = self.ns.chunk_tokens

        def store_from(region):
            ranges = spec.ranges or [(0, len(spec.tokens) // chunk)]
            batches = [(first, min(end, first + self.region_chunks)) for lo, end in ranges
                       for first in range(lo, end, self.region_chunks)]
            for first, end in batches:
                for i in range(end - first):
                    lo = (first + i) * chunk
                    blocks, offsets = self._slots(spec.block_ids, lo, lo + chunk)
                    view = self._chunk_view(i, region)
                    for layer_index, layer in enumerate(self.layers):
                        k, v = layer.read(blocks, offsets)
                        view[layer_index, 0].copy_(k)
                        view[layer_index, 1].copy_(v)
                self._sync(region)  # the gather has written the region before the daemon reads it
                self.client.store(self._spec_namespace(spec), tokens=spec.tokens, first_chunk=first,
                                  chunk_count=end - first, region=region)

        try:
            self._with_region(store_from, "store of request %s failed (the cache stays without it)", spec.request_id)
        finally:
            with self._lock:
                self._sent.add(spec.request_id)

    def _with_region(self, work, what, request_id):
        """work(region) under the region claim (one load or store uses the region at a time). A region the daemon
        no longer holds (NOT_FOUND: it restarted, or the lease ran out while it was unreachable) is registered again
        and the work tried once more, so the first transfer after a restart works. Any failure is logged (once per
        kind of failure) and gives None."""
        try:
            with self._region_claim.claimed(self.region_wait_s) as claimed:
                if not claimed:
                    raise TimeoutError(f"the region stayed in use by another transfer for {self.region_wait_s} s")
                for attempt in (0, 1):
                    region = self.region_slot.get()
                    if region is None:
                        raise RuntimeError("no region: caked could not be reached to register one")
                    try:
                        result = work(region)
                    except Exception as error:
                        if attempt == 0 and region_unknown(error):
                            self.region_slot.lost()  # under the claim: nobody else uses the region
                            continue
                        raise
                    self._transfer_worked()
                    return result
        except Exception as error:  # anything: the request must still be reported (and its blocks given back)
            reason = "region" if region_unknown(error) else getattr(getattr(error, "code", None), "name", None) \
                or type(error).__name__
            once(logging.WARNING, f"transfer:{reason}", "caked " + what + ": %s (said once for this kind of "
                 "failure, until a transfer works again)", request_id, error)
            log.debug("caked " + what + ": %s", request_id, error)
        return None

    @staticmethod
    def _transfer_worked():
        if forget_all("transfer:"):
            log.info("caked's connector: loads and stores work again")

    def start_load_kv(self, metadata):
        if metadata is None:
            return
        if self.split is not None:
            # Splices first: vLLM runs this step's forward on those blocks right after (has_sync_kv_loads).
            self.split.apply(getattr(metadata, "split", None), self._namespace_of)
        for spec in metadata.stores:
            self._pool.submit(self._store, spec)
        for spec in metadata.loads:
            if spec.is_async:
                self._pool.submit(self._load, spec)
            else:
                self._load(spec)  # vLLM computes this step on top of it: it must be in the blocks first

    def get_finished(self, finished_req_ids):
        with self._lock:
            sent, recved = self._sent, self._recved
            self._sent, self._recved = set(), set()
        return (sent or None), (recved or None)

    def get_block_ids_with_load_errors(self):
        with self._lock:
            errors, self._errors = self._errors, set()
        if self.split is not None:
            errors |= self.split.load_errors()
        return errors

    def build_connector_worker_meta(self):
        return None if self.split is None else self.split.meta()

    def _namespace_of(self, model_id):
        import dataclasses
        return self.ns if not model_id or model_id == self.ns.model_id else dataclasses.replace(self.ns,
                                                                                             model_id=model_id)

    def shutdown(self):
        if self.split is not None:
            self.split.shutdown()
        self._pool.shutdown(wait=True)


class CakeConnector(KVConnectorBase_V1):
    """vLLM's KVConnectorBase_V1 on caked. One instance per process and role; the scheduler's and the workers'
    halves talk through CakeConnectorMetadata, which vLLM carries from one to the other each step."""

    def __init__(self, vllm_config, role, kv_cache_config=None, client=None):
        if KVConnectorBase_V1 is not object:
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._metadata = None
        self._role = role
        self._client = client or _connect(vllm_config, "scheduler" if role == KVConnectorRole.SCHEDULER else "worker")
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler, self._worker = _SchedulerSide(vllm_config, self._client), None
            self._scheduler.block_ids_of = self._block_ids_of
        else:
            self._scheduler, self._worker = None, _WorkerSide(vllm_config, self._client)

    def _block_ids_of(self, request_id):
        manager = getattr(self, "_kv_cache_manager", None)  # vLLM binds it (bind_kv_cache_manager)
        if manager is None:
            raise RuntimeError("Cake's split needs vLLM's KV cache manager (bind_kv_cache_manager, vLLM 0.34 and "
                               "later)")
        return manager.get_block_ids(request_id)

    @property
    def requires_kv_delivery(self):
        return False  # a cache: a request never waits on it to be delivered elsewhere

    # --- scheduler side -------------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output):
        if self._scheduler.split is not None:
            self._scheduler.split.on_worker_meta(getattr(connector_output, "kv_connector_worker_meta", None))

    @property
    def cake_split(self):
        """The split's book (cake.vllm_split.SplitScheduler) for cake.vllm_scheduler's mixin; None when split mode
        is off or on a worker."""
        return None if self._scheduler is None else self._scheduler.split

    def request_finished(self, request, block_ids):
        return self._scheduler.request_finished(request, block_ids)

    # --- worker side ----------------------------------------------------------------------------------------
    def bind_connector_metadata(self, connector_metadata):
        self._metadata = connector_metadata

    def clear_connector_metadata(self):
        self._metadata = None

    def register_kv_caches(self, kv_caches):
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context, **kwargs):
        self._worker.start_load_kv(self._metadata)

    def wait_for_layer_load(self, layer_name):
        pass  # synchronous loads are whole before the forward; asynchronous ones before the request is scheduled

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass  # stores happen when the request finishes, from its held blocks

    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids):
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        return self._worker.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self):
        return self._worker.build_connector_worker_meta()

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()
        self._client.close()
