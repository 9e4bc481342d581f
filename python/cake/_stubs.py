"""The generated cake.v1 stubs, imported once with an error that says how to get them."""
try:
    from cake.v1 import admin_pb2, admin_pb2_grpc, kv_pb2, kv_pb2_grpc  # noqa: F401
except ImportError as error:  # pragma: no cover - only without a build
    raise ImportError(
        "the cake.v1 stubs are missing: build them (cmake -S . -B build && ninja -C build cake_python_stubs) and put "
        "build/python on PYTHONPATH beside python/, or install the package with deploy/install.sh") from error
