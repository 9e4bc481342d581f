"""An engine against the daemon the packaged unit runs (tests/package/installed_root_test.sh, inside the booted root):
under its own user in the group cake it maps a host region (shared memory the daemon made, opened through its ACL
entry), stores six chunks from it, drops the DRAM tier, loads them back from the disk tier bit-exact, and reads
the metrics endpoint. Usage: /usr/bin/python3 engine_round_trip.py SOCKET METRICS_URL"""
import sys
import time
import urllib.request

import numpy as np

import cake

socket_path, metrics_url = sys.argv[1], sys.argv[2]
ns = cake.Namespace("installed-root", num_layers=2, num_kv_heads=2, head_dim=8, dtype="fp32", chunk_tokens=16)
tokens = [int(t) for t in np.random.default_rng(7).integers(0, 1 << 31, size=6 * 16 + 3)]


def pattern(chunk):
    position = np.arange(ns.chunk_bytes, dtype=np.uint64)
    return ((position * np.uint64(2654435761) + np.uint64(chunk * 40503)) >> np.uint64(7)).astype(np.uint8)


client = cake.Client(socket_path, client_id="installed-root-engine")
client.ping()
region = client.register_region(6 * ns.chunk_bytes)
view = region.numpy()
for c in range(6):
    view[c * ns.chunk_bytes:(c + 1) * ns.chunk_bytes] = pattern(c)
assert client.store(ns, tokens=tokens, first_chunk=0, chunk_count=6, region=region).stored_chunks == 6

# Write-back to the disk tier runs in the background: wait until the disk holds all six, then empty DRAM.
deadline = time.monotonic() + 30
while not any(t["tier"] == "disk" and int(t.get("chunks", 0)) >= 6 for t in client.status()["tiers"]):
    assert time.monotonic() < deadline, f"the disk tier never got the chunks: {client.status()['tiers']}"
    time.sleep(0.1)
client.evict("dram")
assert client.lookup(ns, tokens=tokens).tiers == ["disk"] * 6

view[:] = 0
with client.load(ns, tokens=tokens, region=region, mode="io_only") as load:
    for _ in load:
        pass
    done = load.done
    assert (done.loaded_chunks, done.failed_chunks) == (6, 0), done
    for c in range(6):
        at = load.region_offset(c)
        assert np.array_equal(view[at:at + ns.chunk_bytes], pattern(c)), f"chunk {c} differs"
    load.release()
client.release_region(region)
print("6 chunks stored from a shared-memory region, loaded back from the disk tier bit-exact")

metrics = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
assert "# TYPE " in metrics, metrics[:500]
print(f"metrics: {len(metrics.splitlines())} lines from {metrics_url}")
client.close()
