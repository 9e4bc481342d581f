"""Prefetch from Python (Client.lookup(prefetch=True)) against a real caked with a disk tier: the prompt's chunks
are copied from disk into DRAM while the engine's request would wait, and the load that follows reads them all
from DRAM, byte for byte what was stored; a prefetch asked for while another load reads from a throttled tier
waits for that load's reads (with copies allowed on any free I/O thread, this test fails)."""
import time

import numpy as np

from cake.testing import SpawnedDaemon
from helpers import pattern, prompt, small_namespace


def wait_for(client, counter, value, bound_s=10):
    deadline = time.monotonic() + bound_s
    while client.stats().get(counter, 0) < value and time.monotonic() < deadline:
        time.sleep(0.02)
    return client.stats().get(counter, 0)


def test_a_prefetched_prompt_loads_from_dram_bit_exact(tmp_path):
    with SpawnedDaemon(["--dram-capacity-mib", "64", "--disk-root", str(tmp_path / "disk"),
                        "--disk-capacity-mib", "64"]) as daemon, daemon.client() as client:
        ns, tokens = small_namespace("prefetch"), prompt(6, seed=41)
        chunks = [pattern(c, ns.chunk_bytes, salt=3).tobytes() for c in range(6)]
        client.store(ns, tokens=tokens, first_chunk=0, chunks=chunks)
        assert wait_for(client, "tier_disk_chunks", 6) == 6
        client.evict("dram")
        looked = client.lookup(ns, tokens=tokens, prefetch=True)
        assert looked.cached_chunks == 6 and looked.tiers == ["disk"] * 6
        assert looked.prefetch_chunks == 6
        assert wait_for(client, "prefetch_chunks_copied", 6) == 6
        assert client.lookup(ns, tokens=tokens).tiers == ["dram"] * 6
        disk_reads = client.stats().get("tier_disk_reads_hit", 0)
        with client.load(ns, tokens=tokens, mode="io_only") as load:
            got = {c.chunk: bytes(c.data) for c in load}
            load.release()
        assert sorted(got) == list(range(6))
        for c in range(6):
            assert np.array_equal(np.frombuffer(got[c], dtype=np.uint8), pattern(c, ns.chunk_bytes, salt=3))
        stats = client.stats()
        assert stats.get("tier_disk_reads_hit", 0) == disk_reads  # nothing read from disk for the load
        assert stats["prefetch_chunks_used"] == 6


def test_a_prefetch_waits_while_a_load_reads_from_a_throttled_tier(tmp_path):
    """Reads first: a prefetch asked for while another prompt's load reads from a throttled disk copies nothing
    until that load's reads are done, and the load gets every chunk."""
    with SpawnedDaemon(["--dram-capacity-mib", "64", "--disk-root", str(tmp_path / "disk"),
                        "--disk-capacity-mib", "64", "--disk-read-gbps", "0.002"]) as daemon, \
            daemon.client() as client:
        ns = small_namespace("prefetch-throttled")
        running, queued = prompt(32, seed=51), prompt(8, seed=52)
        for tokens, salt in ((running, 5), (queued, 6)):
            client.store(ns, tokens=tokens, first_chunk=0,
                         chunks=[pattern(c, ns.chunk_bytes, salt=salt).tobytes() for c in range(len(tokens) // 16)])
        assert wait_for(client, "tier_disk_chunks", 40) == 40
        client.evict("dram")
        landed = 0
        copied_during_load = []
        with client.load(ns, tokens=running, mode="io_only", window=2) as load:
            for event in load:
                landed += 1
                if landed == 8:
                    assert client.lookup(ns, tokens=queued, prefetch=True).prefetch_chunks == 8
                elif landed in (16, 24):
                    copied_during_load.append(client.stats().get("prefetch_chunks_copied", 0))
            load.release()
        assert landed == 32
        assert copied_during_load == [0, 0]  # the running load's reads went first
        assert wait_for(client, "prefetch_chunks_copied", 8) == 8  # then the prefetch ran
        assert client.lookup(ns, tokens=queued).tiers == ["dram"] * 8
