"""What an engine sees after `pip install cake-kvcache` in a fresh venv: run by venv_suite.py's install test with the
venv's own python, from a folder outside the checkout, where only the wheel and what it requires are installed.

`import cake` works without torch; the version is the daemon's; a store then a load through a real caked (the one
this build made, $CAKE_CAKED) gives back every byte."""
import importlib.metadata
import importlib.util
import os
import sys

import numpy as np

import cake
from cake.testing import SpawnedDaemon

CHUNKS = 6


def pattern(chunk, nbytes):
    position = np.arange(nbytes, dtype=np.uint64)
    return ((position * np.uint64(2654435761) + np.uint64(chunk * 40503 + 17)) >> np.uint64(7)).astype(np.uint8)


def main():
    assert importlib.util.find_spec("torch") is None, "torch is importable: this check needs a venv without it"
    installed = os.path.realpath(sys.prefix)
    for module in (cake, cake.v1.kv_pb2):
        assert os.path.realpath(module.__file__).startswith(installed + os.sep), \
            f"{module.__name__} comes from {module.__file__}, not from the venv at {sys.prefix}"
    version = importlib.metadata.version("cake-kvcache")
    assert cake.__version__ == version == os.environ["CAKE_EXPECTED_VERSION"], \
        (cake.__version__, version, os.environ["CAKE_EXPECTED_VERSION"])

    ns = cake.Namespace("install-check", num_layers=2, num_kv_heads=2, head_dim=8, dtype="fp32", chunk_tokens=16)
    tokens = list(range(1000, 1000 + CHUNKS * 16 + 5))
    with SpawnedDaemon(["--dram-capacity-mib", "64"]) as daemon, daemon.client() as client:
        assert client.status()["version"] == cake.__version__, (client.status()["version"], cake.__version__)
        region = client.register_region(CHUNKS * ns.chunk_bytes)
        view = region.numpy()
        for c in range(CHUNKS):
            view[c * ns.chunk_bytes:(c + 1) * ns.chunk_bytes] = pattern(c, ns.chunk_bytes)
        stored = client.store(ns, tokens=tokens, first_chunk=0, chunk_count=CHUNKS, region=region)
        assert stored.stored_chunks == CHUNKS, stored
        view[:] = 0
        with client.load(ns, tokens=tokens, region=region, mode="io_only") as load:
            assert sorted(event.chunk for event in load) == list(range(CHUNKS))
            assert load.done.loaded_chunks == CHUNKS and load.done.failed_chunks == 0
            for c in range(CHUNKS):
                at = load.region_offset(c)
                assert np.array_equal(view[at:at + ns.chunk_bytes], pattern(c, ns.chunk_bytes)), f"chunk {c} differs"
            load.release()
        client.release_region(region)
    print(f"cake-kvcache {version} from {os.path.dirname(cake.__file__)}: import without torch, {CHUNKS} chunks "
          f"stored and loaded bit-exact through caked {version}")


if __name__ == "__main__":
    main()
