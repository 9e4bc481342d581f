"""caked as SGLang's HiCache storage backend, without SGLang: a host pool that lays out pages as SGLang's
MHATokenToKVPoolHost does (pool_host/mha.py at 0047d999), and a controller that makes the calls SGLang's
HiCacheController makes (managers/cache_controller.py at 001067ff): existence in batches of 128 pages stopping at
the first short batch, reads keeping only the leading run of pages, writes judged by all(). Every call goes to a
real caked."""
import hashlib
import json
import os
import signal
import threading
import time

import pytest
import torch

from cake.sglang import SGLANG_BATCH_PAGES, CakeHiCacheStorage, engine_key

PAGE = 16
LAYERS, HEADS, DIM = 3, 4, 8  # every axis a different size, so a wrong permutation cannot round-trip; 6 KiB pages


def get_hash_str(token_ids, prior_hash=None):
    """SGLang's page key (hicache_storage.py at bb424de): SHA-256 over the prior page's digest and the tokens."""
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def page_keys(tokens):
    keys, last = [], None
    for start in range(0, len(tokens) - len(tokens) % PAGE, PAGE):
        last = get_hash_str(tokens[start:start + PAGE], last)
        keys.append(last)
    return keys


class HostPool:
    """The parts of SGLang's MHATokenToKVPoolHost a storage backend touches: geometry, kv_buffer in one of the
    layouts, page-aligned slot allocation, and the flat-page helpers of the generic path."""

    def __init__(self, layout, pages=512, dtype=torch.float16):
        self.page_size, self.layout, self.dtype = PAGE, layout, dtype
        self.layer_num, self.head_num, self.head_dim = LAYERS, HEADS, DIM
        self.page_num = pages
        self.size = pages * PAGE
        dims = {"layer_first": (2, LAYERS, self.size, HEADS, DIM),
                "page_first": (2, self.size, LAYERS, HEADS, DIM),
                "page_first_direct": (2, pages, LAYERS, PAGE, HEADS, DIM),
                "page_head": (2, pages, HEADS, PAGE, LAYERS, DIM)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self._next = 0

    def get_size_per_token(self):
        return self.head_dim * self.head_num * self.layer_num * self.dtype.itemsize * 2

    def alloc(self, tokens):
        assert tokens % PAGE == 0
        indices = torch.arange(self._next, self._next + tokens, dtype=torch.int64)
        self._next += tokens
        return indices

    def get_data_page(self, index, flat=True):
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + PAGE]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index:index + PAGE]
        else:
            page = self.kv_buffer[:, index // PAGE:index // PAGE + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros((2, LAYERS, PAGE, HEADS, DIM), dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index, data_page):
        target = self.get_data_page(index, flat=False)
        target.copy_(data_page.reshape(target.shape))

    def fill(self, indices, seed):
        """Distinct values in every slot of the pages `indices` name (K and V differ, as do layers and heads)."""
        g = torch.Generator().manual_seed(seed)
        for start in range(0, len(indices), PAGE):
            page = self.get_data_page(int(indices[start]), flat=False)
            page.copy_(torch.randn(page.shape, generator=g).to(self.dtype))

    def pages(self, indices):
        return [self.get_data_page(int(indices[s]), flat=False).clone() for s in range(0, len(indices), PAGE)]

    def token_kv(self, slot):
        """Slot `slot`'s K and V, [2, layers, heads, dim], indexed straight from kv_buffer's documented dims
        (mha.py's init_kv_buffer), independently of any page shape or permutation."""
        kv, p = self.kv_buffer, PAGE
        if self.layout == "layer_first":      # (2, L, size, H, D)
            return kv[:, :, slot]
        if self.layout == "page_first":       # (2, size, L, H, D)
            return kv[:, slot]
        if self.layout == "page_first_direct":  # (2, page_num, L, P, H, D)
            return kv[:, slot // p, :, slot % p]
        return kv[:, slot // p, :, slot % p].permute(0, 2, 1, 3)  # page_head (2, page_num, H, P, L, D)

    def tokens(self, indices):
        return torch.stack([self.token_kv(int(i)) for i in indices])


class Config:
    """SGLang's HiCacheStorageConfig, the fields the backend reads."""

    def __init__(self, extra, tp_rank=0, tp_size=1, model_name="test/model", is_mla_model=False):
        self.tp_rank, self.tp_size, self.model_name, self.is_mla_model = tp_rank, tp_size, model_name, is_mla_model
        self.pp_rank, self.pp_size, self.attn_cp_rank, self.attn_cp_size = 0, 1, 0, 1
        self.is_page_first_layout = True
        self.enable_storage_metrics = False
        self.extra_config = extra


def controller_prefetch(backend, keys, pool):
    """HiCacheController's prefetch: batch_exists per 128 pages until a short batch, then batch_get_v1 per batch
    into freshly allocated host slots, keeping only the leading run. Returns (pages hit, pages read, indices)."""
    hit = []
    for start in range(0, len(keys), SGLANG_BATCH_PAGES):
        batch = keys[start:start + SGLANG_BATCH_PAGES]
        n = backend.batch_exists(batch, None)
        hit += batch[:n]
        if n < len(batch):
            break
    indices = pool.alloc(len(hit) * PAGE)
    completed = 0
    for start in range(0, len(hit), SGLANG_BATCH_PAGES):
        batch = hit[start:start + SGLANG_BATCH_PAGES]
        results = backend.batch_get_v1(batch, indices[start * PAGE:(start + len(batch)) * PAGE], None)
        run = 0
        for ok in results:
            if not ok:
                break
            run += 1
        completed += run
        if run != len(batch):
            break
    return len(hit), completed, indices


def controller_backup(backend, keys, indices):
    """HiCacheController's backup: batch_set_v1 per 128 pages, each batch a success only if all() of it is."""
    for start in range(0, len(keys), SGLANG_BATCH_PAGES):
        batch = keys[start:start + SGLANG_BATCH_PAGES]
        if not all(backend.batch_set_v1(batch, indices[start * PAGE:(start + len(batch)) * PAGE], None)):
            return False
    return True


def extra(daemon, **more):
    # The JSON an operator passes in --hicache-storage-backend-extra-config, as SGLang hands it over.
    return json.loads(json.dumps({"backend_name": "cake", "module_path": "cake.sglang",
                                  "class_name": "CakeHiCacheStorage", "interface_v1": 1,
                                  "cake_socket": daemon.socket_path, **more}))


def backend_for(daemon, layout, **config):
    backend = CakeHiCacheStorage(Config(extra(daemon), **config), {})
    pool = HostPool(layout)
    backend.register_mem_pool_host(pool)
    return backend, pool


def tokens_of(pages, seed):
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, 1 << 31, (pages * PAGE,), generator=g)]


@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct", "page_head"])
def test_backup_then_prefetch_is_bit_exact_in_every_layout(daemon, layout):
    backend, pool = backend_for(daemon, layout, model_name=f"model-{layout}")
    try:
        keys = page_keys(tokens_of(6, seed=1))
        assert controller_prefetch(backend, keys, pool)[:2] == (0, 0)  # a cold cache: nothing
        written = pool.alloc(6 * PAGE)
        pool.fill(written, seed=2)
        assert controller_backup(backend, keys, written)
        hit, completed, read = controller_prefetch(backend, keys, pool)
        assert (hit, completed) == (6, 6)
        assert all(torch.equal(a, b) for a, b in zip(pool.pages(read), pool.pages(written)))
        assert backend.get_stats()["pages_stored"] == 6
        # The same pages again are already cached: still a success.
        assert controller_backup(backend, keys, written)
    finally:
        backend.close()


def test_pages_written_in_one_layout_read_back_in_every_other(daemon):
    """The chunk in between is Cake's layout: what one host layout stores, another reads, token for token."""
    writer, source = backend_for(daemon, "page_first", model_name="cross-layout")
    readers = [backend_for(daemon, layout, model_name="cross-layout")
               for layout in ("layer_first", "page_first_direct", "page_head")]
    try:
        keys = page_keys(tokens_of(3, seed=13))
        written = source.alloc(3 * PAGE)
        source.fill(written, seed=14)
        assert controller_backup(writer, keys, written)
        for reader, pool in readers:
            hit, completed, read = controller_prefetch(reader, keys, pool)
            assert (hit, completed) == (3, 3)
            assert torch.equal(pool.tokens(read), source.tokens(written)), pool.layout
    finally:
        writer.close()
        for reader, _ in readers:
            reader.close()


def test_partial_prefix_and_a_page_whose_prefix_is_missing(daemon):
    backend, pool = backend_for(daemon, "page_first", model_name="partial")
    try:
        keys = page_keys(tokens_of(8, seed=3))
        written = pool.alloc(8 * PAGE)
        pool.fill(written, seed=4)
        assert controller_backup(backend, keys[:3], written[:3 * PAGE])
        assert controller_backup(backend, keys[5:6], written[5 * PAGE:6 * PAGE])  # page 5 alone, after a gap
        hit, completed, read = controller_prefetch(backend, keys, pool)
        assert (hit, completed) == (3, 3)  # the leading run only: page 5 is of no use without 3 and 4
        assert all(torch.equal(a, b) for a, b in zip(pool.pages(read), pool.pages(written[:3 * PAGE])))
        # Asked for pages of which only the first is cached, the read says so per page.
        results = backend.batch_get_v1(keys[2:5], pool.alloc(3 * PAGE), None)
        assert results == [True, False, False]
    finally:
        backend.close()


def test_more_pages_than_one_batch(daemon):
    backend, pool = backend_for(daemon, "page_first_direct", model_name="long")
    try:
        pages = SGLANG_BATCH_PAGES + 20
        keys = page_keys(tokens_of(pages, seed=5))
        written = pool.alloc(pages * PAGE)
        pool.fill(written, seed=6)
        assert controller_backup(backend, keys, written)
        hit, completed, read = controller_prefetch(backend, keys, pool)
        assert (hit, completed) == (pages, pages)
        assert all(torch.equal(a, b) for a, b in zip(pool.pages(read), pool.pages(written)))
    finally:
        backend.close()


def test_ranks_and_models_do_not_share_pages(daemon):
    rank0, pool0 = backend_for(daemon, "page_first", model_name="tp", tp_rank=0, tp_size=2)
    rank1, pool1 = backend_for(daemon, "page_first", model_name="tp", tp_rank=1, tp_size=2)
    other, pool2 = backend_for(daemon, "page_first", model_name="another-model")
    try:
        keys = page_keys(tokens_of(2, seed=7))
        written = pool0.alloc(2 * PAGE)
        pool0.fill(written, seed=8)
        assert controller_backup(rank0, keys, written)
        assert rank0.batch_exists(keys) == 2
        assert rank1.batch_exists(keys) == 0  # rank 1 holds other heads: its own pages, under its own namespace
        assert other.batch_exists(keys) == 0
    finally:
        for backend in (rank0, rank1, other):
            backend.close()


def test_the_generic_path_with_flat_pages(daemon):
    backend, pool = backend_for(daemon, "layer_first", model_name="generic")
    try:
        keys = page_keys(tokens_of(3, seed=9))
        written = pool.alloc(3 * PAGE)
        pool.fill(written, seed=10)
        # SGLang's _generic_page_set: flat pages from get_data_page; _generic_page_get: dummy pages filled, then
        # set_from_flat_data_page.
        assert backend.batch_set(keys, [pool.get_data_page(int(written[i * PAGE])) for i in range(3)])
        targets = [pool.get_dummy_flat_data_page() for _ in range(4)]
        got = backend.batch_get(keys + [get_hash_str([1] * PAGE, keys[-1])], targets)
        assert got[3] is None and all(g is not None for g in got[:3])
        read = pool.alloc(3 * PAGE)
        for i in range(3):
            pool.set_from_flat_data_page(int(read[i * PAGE]), got[i])
        assert all(torch.equal(a, b) for a, b in zip(pool.pages(read), pool.pages(written)))
        assert backend.exists(keys[0]) and not backend.exists("f" * 64)
    finally:
        backend.close()


def test_an_unreachable_or_refusing_daemon_is_a_miss_never_an_exception(fresh_daemon):
    daemon = fresh_daemon()
    backend, pool = backend_for(daemon, "page_first", model_name="gone")
    keys = page_keys(tokens_of(2, seed=11))
    written = pool.alloc(2 * PAGE)
    pool.fill(written, seed=12)
    assert controller_backup(backend, keys, written)
    daemon.stop()
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, pool.alloc(2 * PAGE)) == [False, False]
    assert backend.batch_set_v1(keys, written) == [False, False]
    assert backend.batch_get_v1(keys, pool.alloc(PAGE)) == [False, False]  # wrong index count: refused, no raise
    assert backend.get_stats()["errors"] >= 3
    backend.close()


def test_a_silent_daemon_is_a_miss_within_the_timeout_and_holds_up_no_other_call(fresh_daemon):
    """A daemon that stops answering (SIGSTOP: connected, alive, silent): each call is a miss within cake_timeout_s,
    and a second read meanwhile waits for the read region no longer than cake_region_wait_s."""
    timeout_s, region_wait_s = 2.0, 0.1
    daemon = fresh_daemon()
    backend = CakeHiCacheStorage(Config(extra(daemon, cake_timeout_s=timeout_s, cake_region_wait_s=region_wait_s)),
                                 {})
    pool = HostPool("page_first")
    backend.register_mem_pool_host(pool)
    keys = page_keys(tokens_of(2, seed=21))
    written = pool.alloc(2 * PAGE)
    pool.fill(written, seed=22)
    assert controller_backup(backend, keys, written)  # cached: a read would find them
    results = {}

    def read(name):
        started = time.monotonic()
        results[name] = backend.batch_get_v1(keys, pool.alloc(2 * PAGE))
        results[name + " s"] = time.monotonic() - started

    os.kill(daemon.process.pid, signal.SIGSTOP)
    try:
        first = threading.Thread(target=read, args=("first",), daemon=True)
        first.start()
        started = time.monotonic()
        # The first read takes the region before it calls the daemon.
        while time.monotonic() - started < 5 and not backend._claims["get"].busy:
            time.sleep(0.005)
        second = threading.Thread(target=read, args=("second",), daemon=True)
        second.start()
        second.join(timeout_s)
        assert not second.is_alive(), "the second read waited on the region the stuck one holds"
        assert results["second"] == [False, False] and results["second s"] < region_wait_s + 1.0
        first.join(timeout_s + 3)
        assert not first.is_alive(), "the read on a silent daemon never gave up"
        assert results["first"] == [False, False]
        for call, miss in [(lambda: backend.batch_exists(keys), 0),
                           (lambda: backend.batch_set_v1(keys, written), [False, False])]:
            started = time.monotonic()
            assert call() == miss
            assert time.monotonic() - started < timeout_s + 2
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    # Awake again, it serves as before, once it has dropped the loads given up on (their windows of the region).
    deadline = time.monotonic() + 10
    while controller_prefetch(backend, keys, pool)[:2] != (2, 2):
        assert time.monotonic() < deadline, "the daemon never served the pages again"
        time.sleep(0.1)
    backend.close()


def test_keys_and_configuration():
    assert engine_key("ab" * 32) == bytes.fromhex("ab" * 16)
    assert len(engine_key("not-hex")) == 16 and engine_key("not-hex") != engine_key("not-hex2")
    with pytest.raises(ValueError, match="MLA"):
        CakeHiCacheStorage(Config({}, is_mla_model=True), {}, client=object())
