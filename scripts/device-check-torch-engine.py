#!/usr/bin/env python3
"""A PyTorch engine against caked on a GPU machine, for scripts/device-check.

It registers a CUDA device region, opens the daemon's allocation over CUDA IPC (cudaIpcOpenMemHandle through the
CUDA runtime PyTorch loaded) as a torch tensor, writes a KV pattern into it on the device, stores it through
caked, zeroes the region, loads the prompt back (I/O-only, then Cake with the engine "computing" the front), and
checks on the device that every loaded chunk holds its pattern. Prints one line per step and a JSON summary.
"""
import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import queue
import sys
import time

import grpc
import torch

from cake.v1 import kv_pb2, kv_pb2_grpc

CHUNK_TOKENS = 256
LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B's KV layout, bf16: 128 KiB per token
BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2


def cudart():
    """The CUDA runtime library PyTorch uses (a process has one), for cudaIpcOpenMemHandle."""
    torch.cuda.init()
    candidates = []
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    candidates += glob.glob(os.path.join(torch_lib, "libcudart*.so*"))
    for path in sys.path:
        candidates += glob.glob(os.path.join(path, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
    found = ctypes.util.find_library("cudart")
    if found:
        candidates.append(found)
    for name in candidates + ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("no libcudart found next to torch or on the library path")


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class DeviceRegion:
    """The daemon's device allocation opened in this process, viewed as a uint8 tensor."""

    def __init__(self, lib, handle_bytes, size, device):
        self.lib = lib
        handle = IpcHandle()
        ctypes.memmove(ctypes.byref(handle), handle_bytes, 64)
        pointer = ctypes.c_void_p()
        lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint]
        err = lib.cudaIpcOpenMemHandle(ctypes.byref(pointer), handle, 1)  # cudaIpcMemLazyEnablePeerAccess
        if err != 0:
            raise RuntimeError(f"cudaIpcOpenMemHandle failed with CUDA error {err}")
        self.pointer = pointer.value
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (self.pointer, False),
                                         "version": 2}
        self.tensor = torch.as_tensor(self, device=f"cuda:{device}")

    def close(self):
        del self.tensor
        torch.cuda.synchronize()
        self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(self.pointer))


def pattern(chunk, chunk_bytes, device):
    """Chunk c's bytes: a function of the chunk index and the byte's position, so misplaced chunks fail."""
    position = torch.arange(chunk_bytes, device=device, dtype=torch.int64)
    return ((position * 2654435761 + chunk * 40503) >> 7).remainder(251).to(torch.uint8)


def namespace():
    return kv_pb2.Namespace(model_id="device-check/llama3.1-8b", num_layers=LAYERS, num_kv_heads=KV_HEADS,
                            head_dim=HEAD_DIM, dtype=kv_pb2.DTYPE_BF16, chunk_tokens=CHUNK_TOKENS,
                            tenant="device-check")


def load(stub, client_id, region_id, tokens, io_only, front_chunks=0):
    """One load stream; returns (Done, seconds). The engine holds `front_chunks` (LoadStart.computed_through)."""
    def requests(progress_queue):
        start = kv_pb2.LoadStart(client_id=client_id, namespace=namespace(), prompt=kv_pb2.Prompt(tokens=tokens),
                                 region_id=region_id, computed_through=front_chunks,
                                 mode=kv_pb2.LoadStart.MODE_IO_ONLY if io_only else kv_pb2.LoadStart.MODE_CAKE)
        yield kv_pb2.LoadRequest(start=start)
        for msg in iter(progress_queue.get, None):
            yield msg

    outgoing = queue.Queue()
    began = time.perf_counter()
    responses = stub.Load(requests(outgoing))
    done = None
    for response in responses:
        kind = response.WhichOneof("msg")
        if kind == "done":
            done = response.done
            seconds = time.perf_counter() - began
            outgoing.put(kv_pb2.LoadRequest(release=kv_pb2.LoadRelease()))
            outgoing.put(None)
    return done, seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    device = f"cuda:{args.device}"
    chunk_bytes = CHUNK_TOKENS * BYTES_PER_TOKEN
    size = args.chunks * chunk_bytes
    client_id = f"torch-engine-{os.getpid()}"
    stub = kv_pb2_grpc.KvServiceStub(grpc.insecure_channel(f"unix:{args.socket}"))
    reply = stub.RegisterRegion(kv_pb2.RegisterRegionRequest(client_id=client_id, bytes=size,
                                                             kind=kv_pb2.REGION_CUDA_IPC, device=args.device))
    assert reply.kind == kv_pb2.REGION_CUDA_IPC and len(reply.cuda_ipc_handle) == 64, reply
    print(f"registered a {size >> 20} MiB device region {reply.region_id} on {device}")
    region = DeviceRegion(cudart(), reply.cuda_ipc_handle, size, args.device)
    view = region.tensor.view(args.chunks, chunk_bytes)
    expected = torch.stack([pattern(c, chunk_bytes, device) for c in range(args.chunks)])

    tokens = [(i * 7919 + 11) % 128000 for i in range(args.chunks * CHUNK_TOKENS)]
    view.copy_(expected)
    torch.cuda.synchronize()
    stored = stub.Store(kv_pb2.StoreRequest(client_id=client_id, namespace=namespace(),
                                            prompt=kv_pb2.Prompt(tokens=tokens), first_chunk=0,
                                            chunk_count=args.chunks, region_id=reply.region_id))
    print(f"stored {stored.stored_chunks} chunks from device memory")

    results = {"chunks": args.chunks, "chunk_bytes": chunk_bytes, "device": torch.cuda.get_device_name(args.device)}
    ok = True
    for name, io_only, front in (("io-only", True, 0), ("cake", False, args.chunks // 2)):
        view.zero_()
        torch.cuda.synchronize()
        done, seconds = load(stub, client_id, reply.region_id, tokens, io_only, front)
        loaded = range(done.meeting_chunk, args.chunks)
        matches = all(torch.equal(view[c], expected[c]) for c in loaded)
        # What the engine holds is never written by the daemon.
        untouched = all(int(view[c].count_nonzero()) == 0 for c in range(front))
        gbps = len(loaded) * chunk_bytes * 8 / seconds / 1e9
        print(f"{name}: meeting chunk {done.meeting_chunk}, {done.loaded_chunks} loaded, {done.failed_chunks} failed, "
              f"{seconds:.3f} s ({gbps:.1f} Gbit/s); bytes on the device {'match' if matches else 'DIFFER'}")
        ok &= matches and untouched and done.failed_chunks == 0
        results[name] = {"meeting_chunk": done.meeting_chunk, "loaded_chunks": done.loaded_chunks,
                         "seconds": seconds, "gbit_per_s": gbps, "bytes_match": matches}
    region.close()
    stub.ReleaseRegion(kv_pb2.ReleaseRegionRequest(client_id=client_id, region_id=reply.region_id))
    results["ok"] = ok
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print("torch engine: every loaded chunk verified on the device" if ok else "torch engine: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
