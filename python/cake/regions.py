"""Regions: memory the daemon created for this client and this process has mapped. Loads write chunks into
them; stores read chunks from them. Two kinds, one interface: host shared memory (viewed as a numpy array or a
CPU torch tensor, without a copy) and CUDA device memory opened over IPC (viewed as a torch CUDA tensor)."""
import contextlib
import ctypes
import ctypes.util
import glob
import mmap
import os
import re
import sys
import threading

# The daemon names host regions "/cake-<its pid>-<32 hex digits>"; a name not of the form /name is refused before it
# reaches the file system.
_SHM_NAME = re.compile(r"^/[A-Za-z0-9._-]{1,200}$")
_IPC_HANDLE_BYTES = 64


class Region:
    """A registered, mapped region. `id` names it to the daemon; `size` is its bytes; `kind` is "host" or "cuda"."""

    kind = ""

    def __init__(self, region_id, size):
        self.id = region_id
        self.size = size
        self.closed = False

    def torch(self):
        """The whole region as a flat torch.uint8 tensor sharing its memory."""
        raise NotImplementedError

    def close(self):
        """Unmaps the region in this process. The client's release_region calls it before telling the daemon."""
        raise NotImplementedError

    def _check_open(self):
        if self.closed:
            raise ValueError(f"region {self.id} is closed")


class RegionClaim:
    """Which call uses a region now: one load or store at a time, as the bytes in it belong to one of them. Not a
    lock held across the daemon's calls: a caller that finds the region in use waits at most `wait_s` and then does
    without it (an engine adapter computes instead), so a call stuck on a silent daemon (itself bounded by the
    client's deadlines) never stalls the others for longer than that."""

    def __init__(self):
        self._cv = threading.Condition()
        self._busy = False

    @contextlib.contextmanager
    def claimed(self, wait_s):
        """`with claim.claimed(wait_s) as ok:` ok is False when the region stayed in use for wait_s seconds."""
        with self._cv:
            ok = self._cv.wait_for(lambda: not self._busy, wait_s)
            if ok:
                self._busy = True
        try:
            yield ok
        finally:
            if ok:
                with self._cv:
                    self._busy = False
                    self._cv.notify()

    @property
    def busy(self):
        with self._cv:
            return self._busy


class HostShmRegion(Region):
    """The daemon's POSIX shared memory, opened by name (shm_open's name is /dev/shm/<name> on Linux)."""

    kind = "host"

    def __init__(self, region_id, size, shm_name):
        super().__init__(region_id, size)
        if not _SHM_NAME.match(shm_name or ""):
            raise ValueError(f"the daemon sent shared-memory name {shm_name!r}, not of the form /name")
        self.shm_name = shm_name
        fd = os.open("/dev/shm" + shm_name, os.O_RDWR | os.O_CLOEXEC)
        try:
            actual = os.fstat(fd).st_size
            if actual < size:
                raise ValueError(f"shared memory {shm_name} holds {actual} bytes, fewer than the {size} registered")
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._numpy = None
        self._torch = None

    def numpy(self):
        """The whole region as a flat numpy.uint8 array sharing its memory."""
        self._check_open()
        if self._numpy is None:
            import numpy
            self._numpy = numpy.frombuffer(self._map, dtype=numpy.uint8)
        return self._numpy

    def torch(self):
        self._check_open()
        if self._torch is None:
            import torch
            import warnings
            with warnings.catch_warnings():  # the mapping is writable; torch warns for every buffer
                warnings.simplefilter("ignore")
                self._torch = torch.frombuffer(self._map, dtype=torch.uint8)
        return self._torch

    def memoryview(self):
        self._check_open()
        return memoryview(self._map)

    def close(self):
        if self.closed:
            return
        self.closed = True
        self._numpy = None
        self._torch = None
        try:
            self._map.close()
        except BufferError:
            # A caller still holds a view: the mapping stays valid (the daemon's unlink does not revoke it) and
            # is unmapped when the last view goes.
            pass


def _load_cudart():
    """The CUDA runtime the process already uses (PyTorch's, where torch is loaded), for the IPC calls."""
    candidates = []
    try:
        import torch
        torch.cuda.init()
        candidates += glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libcudart*.so*"))
    except Exception:  # no torch, or torch without CUDA: the system's runtime may still do
        pass
    for path in sys.path:
        candidates += glob.glob(os.path.join(path, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
    found = ctypes.util.find_library("cudart")
    if found:
        candidates.append(found)
    candidates += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcHandle, ctypes.c_uint]
        lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return lib
    raise OSError("no CUDA runtime (libcudart) found next to torch or on the library path")


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _IPC_HANDLE_BYTES)]


class CudaIpcRegion(Region):
    """The daemon's device allocation opened in this process with cudaIpcOpenMemHandle on `device`.
    `torch()` is a torch.uint8 CUDA tensor over it (through __cuda_array_interface__, no copy). close() waits for
    the device and closes the handle; the client's release_region does that before the daemon frees the memory."""

    kind = "cuda"

    def __init__(self, region_id, size, handle, device):
        super().__init__(region_id, size)
        if len(handle) != _IPC_HANDLE_BYTES:
            raise ValueError(f"the daemon sent a {len(handle)}-byte CUDA IPC handle; it is {_IPC_HANDLE_BYTES} bytes")
        self.device = device
        self._lib = _load_cudart()
        raw = _IpcHandle()
        ctypes.memmove(ctypes.byref(raw), handle, _IPC_HANDLE_BYTES)
        previous = ctypes.c_int(0)
        self._lib.cudaGetDevice(ctypes.byref(previous))
        self._check(self._lib.cudaSetDevice(device), "cudaSetDevice")
        pointer = ctypes.c_void_p()
        try:
            self._check(self._lib.cudaIpcOpenMemHandle(ctypes.byref(pointer), raw, 1),  # lazy peer access
                        "cudaIpcOpenMemHandle")
        finally:
            self._lib.cudaSetDevice(previous.value)
        self.pointer = pointer.value
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (self.pointer, False),
                                         "version": 2}
        self._torch = None

    def _check(self, err, what):
        if err != 0:
            text = self._lib.cudaGetErrorString(err)
            raise OSError(f"{what} failed: CUDA error {err} ({text.decode() if text else 'unknown'})")

    def torch(self):
        self._check_open()
        if self._torch is None:
            import torch
            self._torch = torch.as_tensor(self, device=f"cuda:{self.device}")
        return self._torch

    def close(self):
        if self.closed:
            return
        self.closed = True
        self._torch = None
        try:
            import torch
            torch.cuda.synchronize(self.device)  # no copy may still target the memory once it is closed
        except Exception:
            pass
        self._lib.cudaIpcCloseMemHandle(ctypes.c_void_p(self.pointer))
