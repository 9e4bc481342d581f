"""caked as SGLang's HiCache L3 storage: a dynamic storage backend on the Python client.

Enable it with (docs/engines.md, "SGLang"):

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "cake", "module_path": "cake.sglang",
        "class_name": "CakeHiCacheStorage", "interface_v1": 1, "cake_socket": "/run/cake/caked.sock"}'

Written against sgl-project/sglang's HiCacheStorage (python/sglang/srt/mem_cache/hicache_storage.py, read at
commits 001067fffe33427bee0ed2f007fb7551a1d76b44 and bb424de23a4659f89cfd97dcad3aa1935a1e1d3e), its dynamic
backend factory (storage/backend_factory.py, 001067ff), the controller that calls it
(managers/cache_controller.py, 001067ff and 350cb87962ba6b74fa9f69814e88bf2c21e179ea) and the MHA host pool
(mem_cache/pool_host/mha.py, 0047d999bb3a3ad311df5a4b6356bfb5586e0d66); tests/test_sglang_real.py runs it on
SGLang 0.5.23's own classes on CPU (its HiCacheController, backend factory and host pools).

How SGLang's calls map onto caked's:
- A HiCache page is one Cake chunk (chunk_tokens = SGLang's page size); the namespace names the model, the
  layout (layers, KV heads of this rank, head dim, dtype) and the tensor-parallel rank.
- SGLang's page keys are chained SHA-256 digests (each names its whole prefix): they go to the daemon as the
  engine's own chunk keys (the first 16 bytes of each digest), which the daemon salts with the namespace.
- batch_exists -> Lookup (the number of leading pages cached); batch_get_v1 -> an I/O-only Load into a region of
  this process, then a copy into the host pool's pages; batch_set_v1 -> a copy of the pages into a region, then
  Store. The daemon cannot write into SGLang's own host pool (it is SGLang's memory, not shared), hence the one
  copy each way, which runs at memory speed.
- SGLang's threads call concurrently (prefetch, I/O, backup): each kind of call has its own region. A call never
  raises or returns None (either would kill the SGLang thread that made it): a refusal or an unreachable daemon is
  a miss (0, or False per page).
- A silent daemon is a miss too, never a stall: every call to it has a deadline (cake_timeout_s, 30 s), and a call
  that finds its region in use waits for it at most cake_region_wait_s (1 s), so one call stuck on the daemon holds
  up no other.
"""
import hashlib
import logging
import os
import threading
import time

import numpy as np

from cake.client import Client
from cake.engine_config import cake_dtype, parse_flag
from cake.layout import ChunkLayout
from cake.namespace import Namespace
from cake.regions import RegionClaim

try:  # SGLang present: the factory checks issubclass(backend, HiCacheStorage)
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # tests, and machines without SGLang: the same methods on a plain base
    _Base = object

log = logging.getLogger("cake.sglang")

# SGLang's STORAGE_BATCH_SIZE: the most pages one call names. The regions are sized for it.
SGLANG_BATCH_PAGES = 128


def engine_key(page_key):
    """A page's 16-byte chunk key for the daemon: SGLang's key is the hex SHA-256 of the page and its prefix, of
    which 16 bytes are as unique as the daemon's keys; any other string is hashed first."""
    try:
        raw = bytes.fromhex(page_key)
        if len(raw) >= 16:
            return raw[:16]
    except (ValueError, TypeError):
        pass
    return hashlib.sha256(str(page_key).encode()).digest()[:16]


def _config_value(config, name, default):
    return getattr(config, name, default) if config is not None else default


class _PageCopier:
    """Moves pages between the host pool's layout and Cake's chunk layout, [layer][K, V][token][head][dim]."""

    # The page shape of each host layout (what get_data_page(index) slices), and the permutation that turns a
    # chunk (L, 2, P, H, D) into it.
    _TO_PAGE = {"layer_first": (1, 0, 2, 3, 4),          # (2, L, P, H, D)
                "page_first": (1, 2, 0, 3, 4),           # (2, P, L, H, D)
                "page_first_direct": (1, 0, 2, 3, 4),    # (2, L, P, H, D), one page of (2, page_num, L, P, H, D)
                "page_head": (1, 3, 2, 0, 4)}            # (2, H, P, L, D)

    def __init__(self, pool):
        if pool.layout not in self._TO_PAGE:
            raise ValueError(f"host pool layout {pool.layout!r} is not one caked's adapter knows "
                             f"({', '.join(self._TO_PAGE)})")
        self.pool = pool
        self.page_size = pool.page_size
        self.to_page = self._TO_PAGE[pool.layout]
        # The inverse permutation: page -> chunk.
        self.to_chunk = tuple(int(i) for i in np.argsort(self.to_page))

    def page_view(self, start_token):
        """The host pool's page that starts at token slot `start_token`, as a view in the layout's page shape."""
        kv, layout, p = self.pool.kv_buffer, self.pool.layout, self.page_size
        if layout == "layer_first":
            return kv[:, :, start_token:start_token + p]
        if layout == "page_first":
            return kv[:, start_token:start_token + p]
        return kv[:, start_token // p]

    def flat_view(self, flat):
        """A flat page tensor (SGLang's generic path) in the layout's page shape."""
        pool, p = self.pool, self.page_size
        shape = {"layer_first": (2, pool.layer_num, p, pool.head_num, pool.head_dim),
                 "page_first": (2, p, pool.layer_num, pool.head_num, pool.head_dim),
                 "page_first_direct": (2, pool.layer_num, p, pool.head_num, pool.head_dim),
                 "page_head": (2, pool.head_num, p, pool.layer_num, pool.head_dim)}[pool.layout]
        return flat.view(shape)

    def into_page(self, page, chunk):
        page.copy_(chunk.permute(*self.to_page))

    def into_chunk(self, chunk, page):
        chunk.copy_(page.permute(*self.to_chunk))


class CakeHiCacheStorage(_Base):
    """SGLang's HiCacheStorage on caked. `storage_config` is SGLang's HiCacheStorageConfig; its extra_config
    (the JSON of --hicache-storage-backend-extra-config) may carry cake_socket, cake_model_id, cake_tenant,
    cake_timeout_s and cake_region_wait_s. The geometry comes from the host pool, in register_mem_pool_host."""

    def __init__(self, storage_config=None, kwargs=None, client=None):
        extra = dict(_config_value(storage_config, "extra_config", None) or {})
        self._config = storage_config
        self._tp_rank = int(_config_value(storage_config, "tp_rank", 0))
        self._tp_size = int(_config_value(storage_config, "tp_size", 1))
        if _config_value(storage_config, "is_mla_model", False):
            raise ValueError("caked's SGLang backend serves MHA host pools (K and V per layer); MLA is not built")
        model = extra.get("cake_model_id") or _config_value(storage_config, "model_name", None) or "sglang-model"
        # The pipeline and context-parallel ranks hold other layers or tokens: part of the model's identity here.
        for name in ("pp", "attn_cp"):
            size = int(_config_value(storage_config, f"{name}_size", 1) or 1)
            if size > 1:
                model = f"{model}|{name}{_config_value(storage_config, f'{name}_rank', 0)}of{size}"
        self._model_id = f"sglang:{model}"
        self._tenant = str(extra.get("cake_tenant", ""))
        self._timeout_s = float(extra.get("cake_timeout_s", 30.0))
        self._region_wait_s = float(extra.get("cake_region_wait_s", 1.0))
        # batch_exists runs on SGLang's prefetch thread as a request enters the queue: the daemon then copies the
        # pages it finds on disk or in Redis into DRAM while the request waits (cake_prefetch = false: not).
        self._prefetch = parse_flag(extra.get("cake_prefetch", True), "cake_prefetch")
        # Lossy storage on disk and in Redis (docs/protocol.md, "Lossy storage"): "exact", "int8" or "int4".
        self._stored_precision = str(extra.get("cake_stored_precision", "exact"))
        self._client = client or Client(extra.get("cake_socket") or None, client_id=f"sglang-{os.getpid()}",
                                        timeout_s=self._timeout_s, load_timeout_s=self._timeout_s)
        self._owns_client = client is None
        self.mem_pool_host = None
        self.ns = None
        self._copier = None
        self._regions = {}
        self._claims = {"get": RegionClaim(), "set": RegionClaim()}
        self.stats = {"exists_calls": 0, "pages_found": 0, "pages_loaded": 0, "pages_stored": 0, "errors": 0}
        # SGLang's --enable-storage-metrics: the pages and GB/s of each read and write, until get_stats takes them.
        self._metrics_on = bool(_config_value(storage_config, "enable_storage_metrics", False))
        self._metrics = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}
        self._metrics_lock = threading.Lock()

    # --- set-up ---------------------------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host):
        """Learns the geometry from SGLang's host pool and registers one region per kind of call, sized for a
        whole batch of pages."""
        v_head_dim = getattr(mem_pool_host, "v_head_dim", mem_pool_host.head_dim)
        if v_head_dim != mem_pool_host.head_dim:  # SGLang's AsymmetricMHATokenToKVPoolHost: K and V apart
            raise ValueError(f"caked's SGLang backend serves host pools whose K and V have one head dim; this one's "
                             f"are {mem_pool_host.head_dim} and {v_head_dim}")
        if _Base is not object:
            super().register_mem_pool_host(mem_pool_host)
        self.mem_pool_host = mem_pool_host
        dtype = cake_dtype(mem_pool_host.dtype)
        if dtype is None:
            raise ValueError(f"host pool dtype {mem_pool_host.dtype} has no Cake equivalent")
        self.ns = Namespace(self._model_id, num_layers=mem_pool_host.layer_num, num_kv_heads=mem_pool_host.head_num,
                            head_dim=mem_pool_host.head_dim, dtype=dtype, tp_rank=self._tp_rank,
                            tp_size=self._tp_size, chunk_tokens=mem_pool_host.page_size, tenant=self._tenant,
                            stored_precision=self._stored_precision)
        self._layout = ChunkLayout.of(self.ns)
        self._torch_dtype = mem_pool_host.dtype
        self._copier = _PageCopier(mem_pool_host)
        for kind in self._claims:
            self._regions[kind] = self._client.register_region(SGLANG_BATCH_PAGES * self.ns.chunk_bytes)

    def _chunk(self, region, index):
        flat = region.torch()[index * self.ns.chunk_bytes:(index + 1) * self.ns.chunk_bytes]
        return flat.view(self._torch_dtype).view(self._layout.shape)

    def _keys(self, keys):
        return [engine_key(k) for k in keys]

    def _page_starts(self, keys, host_indices):
        p = self.ns.chunk_tokens
        if len(host_indices) != len(keys) * p:
            raise ValueError(f"{len(keys)} pages need {len(keys) * p} host indices, got {len(host_indices)}")
        return [int(host_indices[i * p]) for i in range(len(keys))]

    def _record(self, kind, pages, started):
        if self._metrics_on and pages:
            seconds = max(time.perf_counter() - started, 1e-9)
            with self._metrics_lock:
                self._metrics[f"{kind}_pgs"].append(pages)
                self._metrics[f"{kind}_bandwidth"].append(pages * self.ns.chunk_bytes / seconds / 1e9)

    def _failed(self, what, error):
        self.stats["errors"] += 1
        log.warning("caked %s failed, treated as a miss: %s", what, error)

    # --- the v1 (zero-copy in SGLang's terms) interface -----------------------------------------------------
    def batch_exists(self, keys, extra_info=None):
        """How many leading pages of `keys` the cache holds (a page after a missing one is of no use)."""
        self.stats["exists_calls"] += 1
        if not keys or self.ns is None:
            return 0
        try:
            found = self._client.lookup(self.ns, chunk_keys=self._keys(keys), prefetch=self._prefetch).cached_chunks
        except Exception as error:  # anything: an exception here would end SGLang's prefetch thread for good
            self._failed("lookup", error)
            return 0
        self.stats["pages_found"] += found
        return found

    def _load_pages(self, keys, write_page):
        """Loads up to len(keys) <= SGLANG_BATCH_PAGES pages into the get region and hands each loaded page to
        write_page(i, chunk). Returns one bool per key: True for the leading pages that arrived."""
        results = [False] * len(keys)
        with self._claims["get"].claimed(self._region_wait_s) as claimed:
            if not claimed:
                self._failed("load", f"the get region stayed in use by another load for {self._region_wait_s} s")
                return results
            region, started = self._regions["get"], time.perf_counter()
            try:
                with self._client.load(self.ns, chunk_keys=self._keys(keys), region=region,
                                       mode="io_only") as load:
                    for _ in load:
                        pass
                    done = load.wait_done(self._timeout_s)
                    loaded = [load.is_resident(i) for i in range(min(load.plan.cached_chunks, len(keys)))]
                    for i, ok in enumerate(loaded):
                        if not ok:
                            break  # SGLang keeps only the leading run
                        write_page(i, self._chunk(region, load.region_offset(i) // self.ns.chunk_bytes))
                        results[i] = True
                    load.release()
                if done is not None and done.failed_chunks:
                    log.info("caked: %d of %d pages failed to read; SGLang recomputes them", done.failed_chunks,
                             len(keys))
            except Exception as error:  # anything: SGLang's I/O thread must get its list of bools
                self._failed("load", error)
                return [False] * len(keys)
        self.stats["pages_loaded"] += sum(results)
        self._record("prefetch", sum(results), started)
        return results

    def _per_batch(self, what, keys, host_indices, transfer, stop_at_failure):
        """Runs transfer(batch, page_starts) -> list of bools over batches of at most SGLANG_BATCH_PAGES pages of
        `keys` and their `host_indices`; a batch after a failed one is not tried when stop_at_failure (a read past
        a missing page is of no use). Never raises: what could not be done is False."""
        if self.ns is None or not keys:
            return [False] * len(keys)
        results, p = [], self.ns.chunk_tokens
        for start in range(0, len(keys), SGLANG_BATCH_PAGES):
            batch = keys[start:start + SGLANG_BATCH_PAGES]
            try:
                starts = self._page_starts(batch, host_indices[start * p:(start + len(batch)) * p])
            except Exception as error:
                self._failed(what, error)
                break
            part = transfer(batch, starts)
            results += part
            if stop_at_failure and not all(part):
                break
        return results + [False] * (len(keys) - len(results))

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        def load(batch, starts):
            return self._load_pages(
                batch, lambda i, chunk: self._copier.into_page(self._copier.page_view(starts[i]), chunk))
        return self._per_batch("get", keys, host_indices, load, stop_at_failure=True)

    def _store_pages(self, keys, read_page):
        """Copies each page (read_page(i, chunk) fills chunk i) into the set region and stores them all."""
        with self._claims["set"].claimed(self._region_wait_s) as claimed:
            if not claimed:
                self._failed("store", f"the set region stayed in use by another store for {self._region_wait_s} s")
                return [False] * len(keys)
            region, started = self._regions["set"], time.perf_counter()
            try:
                for i in range(len(keys)):
                    read_page(i, self._chunk(region, i))
                stored = self._client.store(self.ns, chunk_keys=self._keys(keys), first_chunk=0,
                                            chunk_count=len(keys), region=region)
            except Exception as error:  # anything: SGLang's backup thread must get its list of bools
                self._failed("store", error)
                return [False] * len(keys)
        ok = stored.stored_chunks + stored.already_cached == len(keys)
        self.stats["pages_stored"] += stored.stored_chunks
        self._record("backup", len(keys) if ok else 0, started)
        return [ok] * len(keys)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        def store(batch, starts):
            return self._store_pages(
                batch, lambda i, chunk: self._copier.into_chunk(chunk, self._copier.page_view(starts[i])))
        return self._per_batch("set", keys, host_indices, store, stop_at_failure=False)

    # --- the generic interface (flat page tensors), which SGLang uses without "interface_v1" -----------------
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Fills each flat page of target_locations; None for a page not loaded (and every page after it)."""
        if self.ns is None or not keys or target_locations is None:
            return [None] * len(keys)
        out = []
        for start in range(0, len(keys), SGLANG_BATCH_PAGES):
            batch = keys[start:start + SGLANG_BATCH_PAGES]
            targets = target_locations[start:start + len(batch)]
            part = self._load_pages(
                batch, lambda i, chunk: self._copier.into_page(self._copier.flat_view(targets[i]), chunk))
            out += [t if ok else None for t, ok in zip(targets, part)]
            if not all(part):
                break
        return out + [None] * (len(keys) - len(out))

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        if self.ns is None or not keys or values is None:
            return False
        for start in range(0, len(keys), SGLANG_BATCH_PAGES):
            batch = keys[start:start + SGLANG_BATCH_PAGES]
            pages = values[start:start + len(batch)]
            part = self._store_pages(
                batch, lambda i, chunk: self._copier.into_chunk(chunk, self._copier.flat_view(pages[i])))
            if not all(part):
                return False
        return True

    def get(self, key, target_location=None, target_sizes=None):
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value] if value is not None else None)

    def exists(self, key):
        return self.batch_exists([key]) == 1

    # --- the rest -------------------------------------------------------------------------------------------
    def clear(self):
        """SGLang asks to drop its cache: a shared daemon's cache is not one engine's to drop, so nothing is."""
        log.info("caked: clear() ignored; evict with cakectl evict if the operator means it")

    def get_stats(self):
        """The counters (self.stats); under SGLang's --enable-storage-metrics, which hands get_stats() to its metrics
        collector, SGLang's StorageMetrics instead, the one type that takes (a dict stops the scheduler): the pages
        and GB/s of each read and write since the last call, or None where SGLang has no such class."""
        if not self._metrics_on:
            return dict(self.stats)
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:
            try:  # older SGLang
                from sglang.srt.metrics.collector import StorageMetrics
            except ImportError:
                return None
        metrics = StorageMetrics()
        with self._metrics_lock:
            for name, values in self._metrics.items():
                getattr(metrics, name).extend(values)
                values.clear()
        return metrics

    def close(self):
        if self._owns_client:
            self._client.close()
        self._regions.clear()
