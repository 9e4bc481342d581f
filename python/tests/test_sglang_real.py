"""cake.sglang on SGLang's own code, on this CPU, against a real caked (test_sglang.py runs the same backend on
hand-written stand-ins, for machines without SGLang; the venv has the release requirements-venv-nodeps.txt pins).

Real SGLang here: HiCacheStorage (the base class: no abstract method left, every signature compatible);
StorageBackendFactory (the "dynamic" backend loaded from the extra-config JSON, issubclass-checked); HiCacheController
constructed on CPU with storage_backend="dynamic", so its attach, its storage config, its prefetch, I/O and backup
threads, _storage_hit_query (batch_exists), _page_transfer (batch_get_v1, or batch_get for the flat-page interface)
and _page_backup (batch_set_v1 or batch_set) make every call; the page keys (get_storage_hash_str, which the
controller computes itself for a prefetch: its native SHA-256, built once by torch's cpp_extension); the device pool
MHATokenToKVPool, its PagedTokenToKVPoolAllocator and MHATokenToKVPoolHost in each layout, on CPU; the pools the
backend refuses (MLATokenToKVPoolHost, AsymmetricMHATokenToKVPoolHost, the page_unified layout); StorageMetrics and
StorageMetricsCollector.

Stand-ins, and why:
- Modules SGLang imports at the top of files on this path but never calls here, where the venv lacks them: triton
  (the GPU kernel compiler, about 1 GB), torchvision (a CUDA build tied to one torch), IPython (the frontend's
  notebook display, a dozen packages), orjson and sentencepiece (compiled wheels). Each is a permissive empty module
  (SGLang does the same for triton on Apple silicon, sglang/_platform_stubs.py), there only while SGLang is imported.
- The scheduler's share of a prefetch (UnifiedRadixCache allocating host slots for a hit and queueing the transfer):
  two lines in prefetch() below, in SGLang's order.
- The parallel topology: get_parallel().override(...) of one rank, as SGLang's own unit-test kits do without
  torch.distributed.
"""
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import threading
import types

import pytest

# Not pytest.importorskip("sglang"): `import sglang` itself needs the stand-ins below.
if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("SGLang is not installed (requirements-venv-nodeps.txt puts it in the suite's venv)",
                allow_module_level=True)
import torch  # noqa: E402

STAND_INS = ("triton", "torchvision", "IPython", "orjson", "sentencepiece")


class _StandIn(types.ModuleType):
    """An absent module SGLang imports but does not run here: any attribute is a nested stand-in (or a class, for
    a capitalised name), and calling one is a pass-through decorator (@triton.jit)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {}) if name[:1].isupper() else _StandIn(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else (lambda fn: fn)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _import_sglang():
    # torch, transformers and vLLM look for triton and torchvision when first imported: they must decide on the
    # real environment, before any stand-in exists.
    for name in ("torch._dynamo", "torch._inductor.compile_fx", "transformers.modeling_utils",
                 "transformers.image_utils", "vllm._custom_ops"):
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)
    if "sglang" not in sys.modules:  # what an import that failed without stand-ins left (cake.sglang tries one)
        for name in [m for m in sys.modules if m.startswith("sglang.")]:
            del sys.modules[name]
    finder = _StandInFinder({n for n in STAND_INS if importlib.util.find_spec(n) is None})
    sys.meta_path.insert(0, finder)
    try:
        # What the tests use, and what HiCacheController imports when it attaches a backend.
        return {name: importlib.import_module(f"sglang.srt.{name}") for name in (
            "mem_cache.hicache_storage", "mem_cache.memory_pool", "mem_cache.pool_host.mha",
            "mem_cache.pool_host.mla", "mem_cache.allocator.paged", "mem_cache.utils", "managers.cache_controller",
            "runtime_context", "observability.metrics_collector", "mem_cache.storage",
            "mem_cache.deepseek_v4_memory_pool")}
    finally:  # SGLang's modules keep what they took; nothing imported later finds a stand-in
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.split(".")[0] in finder.names]:
            del sys.modules[name]


try:
    sgl = _import_sglang()
except Exception as error:  # a release whose imports reach further than these stand-ins: say which
    pytest.skip(f"SGLang does not import on this CPU: {type(error).__name__}: {error}", allow_module_level=True)
HiCacheStorage = sgl["mem_cache.hicache_storage"].HiCacheStorage
STORAGE_BATCH_SIZE = sgl["mem_cache.hicache_storage"].STORAGE_BATCH_SIZE
get_storage_hash_str = sgl["mem_cache.utils"].get_storage_hash_str
HiCacheController = sgl["managers.cache_controller"].HiCacheController

if getattr(sys.modules.get("cake.sglang"), "_Base", HiCacheStorage) is not HiCacheStorage:
    # Imported earlier in this process without SGLang (test_sglang.py): a new module for SGLang's factory to find,
    # the old one left to the tests that hold it.
    del sys.modules["cake.sglang"]
from cake.sglang import CakeHiCacheStorage, engine_key  # noqa: E402

PAGE = 16
LAYERS, HEADS, DIM = 3, 4, 8  # every axis a different size, so a wrong permutation cannot round-trip; 6 KiB pages
LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")  # what MHATokenToKVPoolHost pages


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    with sgl["runtime_context"].get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                                       attn_dcp_size=1, attn_dcp_rank=0):
        yield


def pools(layout="page_first", device_tokens=1024, host_ratio=8, dtype=torch.float16, v_head_dim=None, mla=False):
    """SGLang's device pool and allocator on CPU, and its host pool over them, built as SGLang builds them."""
    mem = sgl["mem_cache.memory_pool"]
    if mla:
        device = mem.MLATokenToKVPool(device_tokens, PAGE, dtype, 32, 16, LAYERS, "cpu", False, 0, LAYERS - 1)
    else:
        device = mem.MHATokenToKVPool(device_tokens, PAGE, dtype, HEADS, DIM, LAYERS, "cpu", False,
                                      v_head_dim=v_head_dim, start_layer=0, end_layer=LAYERS - 1)
    allocator = sgl["mem_cache.allocator.paged"].PagedTokenToKVPoolAllocator(device_tokens, PAGE, dtype, "cpu",
                                                                             device, need_sort=False)
    host_class = (sgl["mem_cache.pool_host.mla"].MLATokenToKVPoolHost if mla
                  else sgl["mem_cache.pool_host.mha"].AsymmetricMHATokenToKVPoolHost if v_head_dim
                  else sgl["mem_cache.pool_host.mha"].MHATokenToKVPoolHost)
    more = {"target_layer_num": LAYERS} if mla else {}
    host = host_class(device.get_device_pool_infos()[0].buffer_info, host_ratio, 0, PAGE, layout, pin_memory=False,
                      device="cpu", device_capacity_tokens=device.size, start_layer=0, end_layer=LAYERS - 1, **more)
    return allocator, host


def extra(daemon, v1=True, **more):
    # --hicache-storage-backend-extra-config, as docs/engines.md gives it
    config = {"backend_name": "cake", "module_path": "cake.sglang", "class_name": "CakeHiCacheStorage",
              "cake_socket": daemon.socket_path, **more}
    return {**config, "interface_v1": 1} if v1 else config


@contextlib.contextmanager
def controller(daemon, allocator, host, model, v1=True, metrics=False):
    """SGLang's HiCacheController with caked as its "dynamic" storage backend; detached (threads stopped, backend
    closed) at the end."""
    cc = HiCacheController(allocator, host, PAGE, None, threading.Event(), io_backend="direct",
                           storage_backend="dynamic", model_name=model, enable_storage_metrics=metrics,
                           storage_backend_extra_config=extra(daemon, v1))
    try:
        yield cc
    finally:
        cc.detach_storage_backend()


def tokens_of(pages, seed):
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, 1 << 31, (pages * PAGE,), generator=g)]


def fill(host, indices, seed):
    """Distinct values in every slot of the pages `indices` name, through SGLang's own page view."""
    g = torch.Generator().manual_seed(seed)
    for start in range(0, len(indices), PAGE):
        page = host.get_data_page(int(indices[start]), flat=False)
        page.copy_(torch.randn(page.shape, generator=g).to(host.dtype))


def pages(host, indices):
    return [host.get_data_page(int(indices[s]), flat=False).clone() for s in range(0, len(indices), PAGE)]


def token_kv(host, slot):
    """Slot `slot`'s K and V, [2, layers, heads, dim], indexed straight from the dims of MHATokenToKVPoolHost's
    init_kv_buffer, independently of any page shape or permutation."""
    kv, p = host.kv_buffer, PAGE
    if host.layout == "layer_first":         # (2, L, size, H, D)
        return kv[:, :, slot]
    if host.layout == "page_first":          # (2, size, L, H, D)
        return kv[:, slot]
    if host.layout == "page_first_direct":   # (2, page_num, L, P, H, D)
        return kv[:, slot // p, :, slot % p]
    return kv[:, slot // p, :, slot % p].permute(0, 2, 1, 3)  # page_head (2, page_num, H, P, L, D)


def backup(cc, host, tokens, seed):
    """The tree's write_backup_storage: host slots holding the prompt's pages, keyed as SGLang keys them, queued to
    the backup thread. Returns (tokens backed up, the slots, the keys)."""
    indices = host.alloc(len(tokens))
    fill(host, indices, seed)
    keys = get_storage_hash_str(tokens, None, page_size=PAGE)
    op_id = cc.write_storage(indices, tokens, hash_value=keys)
    done = cc.ack_backup_queue.get(timeout=30)
    assert done.id == op_id
    return done.completed_tokens, indices, keys


def prefetch(cc, tokens, rid="r"):
    """A request's prefetch: the controller hashes the prompt and asks batch_exists (prefetch thread); the scheduler
    allocates host slots for the hit and queues the transfer; the I/O thread reads (batch_get_v1 or batch_get) and
    acknowledges. Returns (tokens hit, tokens read, the slots)."""
    operation = cc.prefetch(rid, tokens, None)
    hit = cc.prefetch_hit_queue.get(timeout=30)
    assert hit is operation
    if hit.storage_hit_count == 0:
        return 0, 0, None
    hit.host_indices = cc.alloc_prefetch_host_buffers(hit, hit.storage_hit_count)  # the scheduler's share
    cc.prefetch_buffer.put(hit)
    completed = 0
    while not (ack := cc.ack_prefetch_queue.get(timeout=30)).completed_req:
        completed = ack.completed_tokens
    return hit.storage_hit_count, completed, hit.host_indices


def test_it_is_an_sglang_hicache_storage_with_compatible_signatures():
    assert issubclass(CakeHiCacheStorage, HiCacheStorage) and not inspect.isabstract(CakeHiCacheStorage)
    for name, base in inspect.getmembers(HiCacheStorage, inspect.isfunction):
        ours = getattr(CakeHiCacheStorage, name)
        if ours is base or name.startswith("_"):
            continue  # inherited: SGLang's own
        theirs, mine = list(inspect.signature(base).parameters), inspect.signature(ours).parameters
        assert list(mine)[:len(theirs)] == theirs, name  # SGLang's arguments, by position and by name
        assert all(p.default is not p.empty for p in list(mine.values())[len(theirs):]), name
    # The dynamic factory calls backend_class(storage_config, kwargs).
    assert list(inspect.signature(CakeHiCacheStorage).parameters)[:2] == ["storage_config", "kwargs"]


@pytest.mark.parametrize("v1", [True, False], ids=["interface_v1", "flat_pages"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backup_then_prefetch_through_sglangs_controller_is_bit_exact(daemon, layout, v1):
    allocator, host = pools(layout)
    with controller(daemon, allocator, host, f"real/{layout}/{v1}", v1=v1) as cc:
        assert isinstance(cc.storage_backend, CakeHiCacheStorage)
        assert cc.page_get_func.__name__ == ("_page_get_zero_copy" if v1 else "_generic_page_get")
        tokens = tokens_of(6, seed=1)
        assert prefetch(cc, tokens)[:2] == (0, 0)  # a cold cache
        backed_up, written, keys = backup(cc, host, tokens, seed=2)
        assert backed_up == 6 * PAGE
        # SGLang's keys are SHA-256 hex digests; the daemon gets their first 16 bytes.
        assert [engine_key(k) for k in keys] == [bytes.fromhex(k)[:16] for k in keys]
        hit, completed, read = prefetch(cc, tokens)  # the controller hashes the prompt itself: the keys agree
        assert (hit, completed) == (6 * PAGE, 6 * PAGE)
        assert all(torch.equal(a, b) for a, b in zip(pages(host, read), pages(host, written)))
        assert cc.storage_backend.stats["pages_stored"] == 6 and cc.storage_backend.stats["errors"] == 0
        assert backup(cc, host, tokens, seed=2)[0] == 6 * PAGE  # already cached: still a success


def test_pages_written_in_one_layout_read_back_in_every_other_token_by_token(daemon):
    """The chunk between them is Cake's layout: what one of SGLang's host layouts stores, the others read."""
    allocator, source = pools("page_first")
    tokens = tokens_of(3, seed=13)
    with controller(daemon, allocator, source, "real/cross-layout") as cc:
        written = backup(cc, source, tokens, seed=14)[1]
    for layout in ("layer_first", "page_first_direct", "page_head"):
        allocator, host = pools(layout)
        with controller(daemon, allocator, host, "real/cross-layout") as cc:
            hit, completed, read = prefetch(cc, tokens)
        assert (hit, completed) == (3 * PAGE, 3 * PAGE)
        for slot_read, slot_written in zip(read.tolist(), written.tolist()):
            assert torch.equal(token_kv(host, slot_read), token_kv(source, slot_written)), layout


def test_a_partial_prefix_over_more_than_one_batch(daemon):
    """SGLang asks in batches of STORAGE_BATCH_SIZE pages up to the first short one, and reads batch by batch."""
    allocator, host = pools("page_first_direct", host_ratio=12)
    total, cached = STORAGE_BATCH_SIZE + 12, STORAGE_BATCH_SIZE + 5
    tokens = tokens_of(total, seed=3)
    with controller(daemon, allocator, host, "real/partial") as cc:
        backed_up, written, _ = backup(cc, host, tokens[:cached * PAGE], seed=4)
        assert backed_up == cached * PAGE
        # A page after the gap, alone: of no use without the pages before it.
        keys = get_storage_hash_str(tokens, None, page_size=PAGE)
        lone = host.alloc(PAGE)
        assert all(cc.storage_backend.batch_set_v1(keys[cached + 2:cached + 3], lone))
        hit, completed, read = prefetch(cc, tokens)
        assert (hit, completed) == (cached * PAGE, cached * PAGE)
        assert all(torch.equal(a, b) for a, b in zip(pages(host, read), pages(host, written)))
        assert cc.storage_backend.stats["exists_calls"] == 2  # 128 found, then 5 of 12


def test_ranks_do_not_share_pages(daemon):
    """The tensor-parallel rank SGLang's storage config carries is part of the namespace."""
    tokens = tokens_of(2, seed=7)
    allocator, host = pools()
    with controller(daemon, allocator, host, "real/tp") as cc:
        assert backup(cc, host, tokens, seed=8)[0] == 2 * PAGE
    with sgl["runtime_context"].get_parallel().override(tp_rank=1, tp_size=2):
        allocator, host = pools()
        with controller(daemon, allocator, host, "real/tp") as cc:
            assert cc.storage_config.tp_rank == 1
            assert prefetch(cc, tokens)[:2] == (0, 0)  # rank 1 holds other heads


def test_a_daemon_gone_is_a_miss_and_sglangs_threads_live_on(fresh_daemon):
    """A call that raised would end the SGLang thread that made it, for the life of the server."""
    daemon = fresh_daemon()
    allocator, host = pools()
    tokens = tokens_of(2, seed=11)
    with controller(daemon, allocator, host, "real/gone") as cc:
        assert backup(cc, host, tokens, seed=12)[0] == 2 * PAGE
        daemon.stop()
        assert prefetch(cc, tokens)[:2] == (0, 0)
        assert backup(cc, host, tokens, seed=12)[0] == 0
        # A read the daemon drops mid-prefetch (exists had said yes): nothing read, acknowledged all the same.
        operation = cc.prefetch("late", tokens, None)
        assert cc.prefetch_hit_queue.get(timeout=30) is operation
        operation.hash_value, operation.host_indices = get_storage_hash_str(tokens, None, PAGE), host.alloc(2 * PAGE)
        cc.prefetch_buffer.put(operation)
        acks = [cc.ack_prefetch_queue.get(timeout=30) for _ in range(2)]
        assert [(a.completed_tokens, a.completed_req) for a in acks] == [(0, None), (None, True)]
        assert all(t.is_alive() for t in (cc.prefetch_thread, cc.prefetch_io_aux_thread, cc.backup_thread))
        assert cc.storage_backend.stats["errors"] >= 3


def test_storage_metrics_are_what_sglangs_collector_takes(daemon):
    """--enable-storage-metrics: SGLang hands get_stats() to its metrics collector, which takes None or a
    StorageMetrics (it sets prefetch_stats on it first, and asserts the type)."""
    metrics_module = sgl["observability.metrics_collector"]
    allocator, host = pools()
    with controller(daemon, allocator, host, "real/metrics", metrics=True) as cc:
        tokens = tokens_of(4, seed=15)
        backup(cc, host, tokens, seed=16)
        prefetch(cc, tokens)
        metrics = cc.storage_backend.get_stats()
        assert isinstance(metrics, metrics_module.StorageMetrics)
        assert (metrics.backup_pgs, metrics.prefetch_pgs) == ([4], [4])
        assert min(metrics.backup_bandwidth + metrics.prefetch_bandwidth) > 0
        metrics.prefetch_stats = None  # what UnifiedRadixCache does before logging
        metrics_module.StorageMetricsCollector(labels={"storage_backend": "cake"}).log_storage_metrics(metrics)
        assert cc.storage_backend.get_stats().backup_pgs == []  # handed over once


@pytest.mark.parametrize("pool, refusal", [
    ({"mla": True}, "MLA"),                     # SGLang's storage config says is_mla_model: no V to store
    ({"v_head_dim": 4}, "K and V"),             # AsymmetricMHATokenToKVPoolHost: K and V in separate buffers
    ({"layout": "page_unified"}, "page_unified"),  # a layout the adapter has no copier for
], ids=["mla", "asymmetric_k_v", "page_unified"])
def test_pools_it_cannot_serve_are_refused_when_sglang_attaches_it(daemon, pool, refusal):
    allocator, host = pools(**pool)
    with pytest.raises(ValueError, match=refusal):
        with controller(daemon, allocator, host, "real/refused"):
            pass
