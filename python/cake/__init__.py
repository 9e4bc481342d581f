"""cake: the Python client of caked, the Cake KV-cache loader daemon.

Pure Python over grpcio and protobuf, pip's or Debian's python3-grpcio and python3-protobuf (no compiled extension,
so it never loads a second gRPC next to an engine's own). `pip install ./python` installs it as cake-kvcache with the
cake.v1 wire stubs generated into the package; in a checkout, the CMake build generates them into
build/python/cake/v1, and the path extension below lets that folder provide `cake.v1` (and `cake._version`).

    import cake
    with cake.Client() as client:
        ns = cake.Namespace("my-model", num_layers=32, num_kv_heads=8, head_dim=128, dtype="bf16")
        region = client.register_region(64 << 20)
        with client.load(ns, tokens=prompt, region=region) as load:
            ...

docs/engines.md walks through an engine's integration step by step.
"""
import pkgutil

__path__ = pkgutil.extend_path(__path__, __name__)  # noqa: F821 (a package's __path__)

try:
    from cake._version import __version__  # written by the build: caked's version (the top CMakeLists.txt)
except ImportError:  # a checkout whose build/python is not on the path
    __version__ = "0+unknown"

from cake.errors import CakeError, DeadlineExceeded  # noqa: E402
from cake.namespace import DTYPES, Namespace  # noqa: E402
from cake.layout import ChunkLayout  # noqa: E402
from cake.regions import CudaIpcRegion, HostShmRegion, Region  # noqa: E402
from cake.client import Client, Limits, LookupResult, StoreResult, default_socket_path  # noqa: E402
from cake.load import ChunkLoaded, LoadDone, LoadPlan, LoadSession, Step  # noqa: E402

__all__ = [
    "__version__", "CakeError", "DeadlineExceeded", "Namespace", "DTYPES", "ChunkLayout", "Region",
    "HostShmRegion", "CudaIpcRegion", "Client", "Limits", "LookupResult", "StoreResult", "default_socket_path",
    "LoadSession", "LoadPlan", "ChunkLoaded", "LoadDone", "Step",
]
