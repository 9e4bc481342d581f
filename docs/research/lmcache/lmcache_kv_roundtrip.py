"""Store a ~2 GiB KV prefix through LMCache's in-process engine (LMCacheEngine) on a CPU-only machine,
then load it back, timing both and checking the bytes round-trip. Run it with the LMCache venv's interpreter
($venv/bin/python, as scripts/lmcache-side-by-side and the README here do): LMCache is installed nowhere else.

The storage path is LMCache's own: ChunkedTokenDatabase (256-token chunks, prefix-hash keys) ->
StorageManager -> LocalDiskBackend ("local_disk") or RemoteBackend (remote_url redis:// or resp://,
remote_serde naive|cachegen). local_cpu=False so nothing is kept in LMCache's CPU tier: the load
really comes from the disk files or the Redis server.

The only piece written here is CPUKVConnector, the stand-in for LMCache's GPU connector (which copies
between vLLM's paged GPU KV cache and LMCache's MemoryObj buffers with CUDA kernels). Ours copies
between one CPU tensor [2, layers, tokens, heads*head_dim] and the MemoryObj (format KV_2LTD).

Run with the venv described in README.md, e.g.
  python lmcache_kv_roundtrip.py --backend disk --dir /tmp/lmc-disk
  python lmcache_kv_roundtrip.py --backend redis --url redis://127.0.0.1:6399
  python lmcache_kv_roundtrip.py --backend resp  --url resp://127.0.0.1:6399
"""
import argparse
import glob
import json
import os
import shutil
import sys
import threading
import time

import torch

from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata


class CPUKVConnector(GPUConnectorInterface):
    """Copies token ranges between a CPU KV tensor [2, L, T, H*D] and LMCache MemoryObjs (KV_2LTD)."""

    def __init__(self, num_layers, hidden):
        self.num_layers = num_layers
        self.hidden = hidden

    def from_gpu(self, memory_obj, start, end, **kwargs):
        memory_obj.tensor.copy_(kwargs["kvcaches"][:, :, start:end, :])

    def to_gpu(self, memory_obj, start, end, **kwargs):
        kwargs["kvcaches"][:, :, start:end, :].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
        for m, s, e in zip(memory_objs, starts, ends):
            self.from_gpu(m, s, e, **kwargs)

    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
        for m, s, e in zip(memory_objs, starts, ends):
            self.to_gpu(m, s, e, **kwargs)

    def get_shape(self, num_tokens):
        return torch.Size([2, self.num_layers, num_tokens, self.hidden])


def drop_file_cache(root):
    """fsync then POSIX_FADV_DONTNEED on our own files only, so a disk load reads the device."""
    n = 0
    for path in glob.glob(os.path.join(root, "**", "*"), recursive=True):
        if os.path.isfile(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["disk", "redis", "resp"], required=True)
    ap.add_argument("--dir", default="/tmp/lmc-disk", help="local_disk directory (emptied first)")
    ap.add_argument("--url", default="redis://127.0.0.1:6399")
    ap.add_argument("--serde", default="naive", help="remote_serde: naive or cachegen (remote backends)")
    ap.add_argument("--model-name", default="cake-side-by-side",
                    help="part of every key; cachegen needs one it knows (test_model = 32 layers)")
    ap.add_argument("--tokens", type=int, default=16384)  # 16384 x 128 KiB = 2 GiB
    ap.add_argument("--layers", type=int, default=32)  # Llama-3-8B-like: 32 layers, 8 KV heads, 128 dims
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--cold", action="store_true", help="disk: drop our files from the page cache before loading")
    ap.add_argument("--odirect", action="store_true", help="disk: extra_config use_odirect (O_DIRECT reads/writes)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--stall", type=float, default=30.0, help="give up on the store after this long without progress")
    args = ap.parse_args()

    L, H, D, T, C = args.layers, args.kv_heads, args.head_dim, args.tokens, args.chunk
    assert T % C == 0
    nbytes = 2 * L * T * H * D * 2  # K and V, bf16
    cfg = dict(
        chunk_size=C,
        local_cpu=False,  # no CPU tier: loads come from the backend under test
        max_local_cpu_size=nbytes / 1024**3 + 0.5,  # LMCache's staging pool (GB) for puts and gets
        save_unfull_chunk=False,
        remote_serde=args.serde,
    )
    if args.backend == "disk":
        shutil.rmtree(args.dir, ignore_errors=True)
        os.makedirs(args.dir)
        cfg.update(local_disk="file://" + args.dir + "/", max_local_disk_size=nbytes / 1024**3 + 1,
                   extra_config={"use_odirect": args.odirect})
    else:
        cfg.update(remote_url=args.url)
    config = LMCacheEngineConfig.from_defaults(**cfg)
    metadata = LMCacheMetadata(
        model_name=args.model_name, world_size=1, local_world_size=1, worker_id=0,
        local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(L, 2, C, H, D), chunk_size=C,
    )
    engine = LMCacheEngineBuilder.get_or_create(
        "bench", config, metadata, CPUKVConnector(L, H * D), None, None)
    engine.post_init()
    backends = engine.storage_manager.storage_backends
    print("backends:", list(backends), file=sys.stderr)

    torch.manual_seed(0)
    tokens = torch.randint(0, 32000, (T,), dtype=torch.long)
    src = torch.randn(2, L, T, H * D, dtype=torch.bfloat16)
    dst = torch.zeros_like(src)
    keys = [k for _, _, k in engine.token_database.process_tokens(tokens)]

    store_backend = next(b for name, b in backends.items() if not name.startswith("LocalCPUBackend"))

    def chunks_stored():
        # a chunk counts once the backend has it and (disk) its write task is gone
        return sum(bool(store_backend.contains(k)) and not (
            hasattr(store_backend, "exists_in_put_tasks") and store_backend.exists_in_put_tasks(k)) for k in keys)

    # store: LMCache's store() returns once the puts are submitted; the writes finish in its own
    # threads/event loop, so the clock stops when every chunk is visible in the backend.
    t0 = time.perf_counter()
    engine.store(tokens, kvcaches=src)
    t_submit = time.perf_counter() - t0
    # a failed put (e.g. redis-py's 5 s socket timeout) is only logged by LMCache: stop waiting once
    # nothing has landed for --stall seconds, and report how many chunks were stored
    done, last_change, last_done = 0, time.perf_counter(), -1
    while True:
        done = chunks_stored()
        now = time.perf_counter()
        if done == len(keys):
            break
        if done != last_done:
            last_done, last_change = done, now
        if now - last_change > args.stall or now - t0 > args.timeout:
            print(f"store incomplete: {done}/{len(keys)} chunks stored", file=sys.stderr)
            break
        time.sleep(0.002)
    t_store = time.perf_counter() - t0

    holding = {name: sum(bool(b.contains(k)) for k in keys) for name, b in backends.items()}
    stored_bytes = None
    if args.backend == "disk":
        stored_bytes = sum(os.path.getsize(p) for p in glob.glob(os.path.join(args.dir, "**", "*"), recursive=True)
                           if os.path.isfile(p))
        if args.cold:
            drop_file_cache(args.dir)

    t0 = time.perf_counter()
    ret_mask = engine.retrieve(tokens, kvcaches=dst)
    t_load = time.perf_counter() - t0

    hit = int(ret_mask.sum())
    same = torch.equal(src.view(torch.int16), dst.view(torch.int16))
    result = dict(
        backend=args.backend, url=None if args.backend == "disk" else args.url, serde=args.serde,
        tokens=T, chunk=C, chunks=len(keys), layers=L, kv_heads=H, head_dim=D, dtype="bfloat16",
        kv_bytes=nbytes, stored_bytes_on_disk=stored_bytes, cold=args.cold, odirect=args.odirect,
        chunks_stored=done, store_submit_s=round(t_submit, 4), store_s=round(t_store, 4),
        store_GBps=round(nbytes / t_store / 1e9, 3), load_s=round(t_load, 4),
        load_GBps=round(nbytes / t_load / 1e9, 3), tokens_hit=hit, bytes_equal=same,
        chunks_held_before_load=holding,
    )
    if not same and hit == T:  # lossy codec (cachegen): how far off
        diff = (dst.float() - src.float())
        result.update(max_abs_err=round(diff.abs().max().item(), 4),
                      rel_l2_err=round((diff.norm() / src.float().norm()).item(), 5))
    print(json.dumps(result), flush=True)
    # LMCache 0.5.6's RESP (resp://) backend never returns from close(); give the teardown 10 s and leave.
    closer = threading.Thread(target=LMCacheEngineBuilder.destroy, args=("bench",), daemon=True)
    closer.start()
    closer.join(10)
    if closer.is_alive():
        print("warning: LMCacheEngineBuilder.destroy() still running after 10 s; exiting anyway", file=sys.stderr)
    return 0 if same and hit == T and done == len(keys) else 1


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # LMCache leaves non-daemon threads behind
