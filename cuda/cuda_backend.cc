// The CUDA backend, built where the toolkit was found: device regions exported through CUDA IPC, pinned staging,
// copies on dedicated streams with an event per copy. Only the runtime API (linked statically) is used, so the
// binary starts on a machine without a driver and ProbeCuda says why CUDA is off.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace cake {
namespace {

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  if (err == cudaErrorInvalidDevice || err == cudaErrorInvalidValue) return absl::InvalidArgumentError(msg);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return absl::FailedPreconditionError(msg);
  return absl::InternalError(msg);
}

// Sets the current device for the scope and restores the caller's: the daemon's I/O threads and an engine's own
// threads may each have their own current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    status_ = CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice");
    if (status_.ok() && previous_ != device) status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
    restore_ = status_.ok() && previous_ != device;
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = 0;
  bool restore_ = false;
  absl::Status status_;
};

// A stream and an event per thread and device: copies from different I/O threads run concurrently on the copy
// engines, and each copy is waited for on its own event, not on the device. Never destroyed: a thread's stream
// lives as long as the thread, and at process exit the driver reclaims it.
struct CopyStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
};

absl::StatusOr<CopyStream*> StreamFor(int device) {
  thread_local CopyStream streams[64];
  if (device < 0 || device >= 64) return absl::InvalidArgumentError(absl::StrCat("device ", device, " out of range"));
  CopyStream& s = streams[device];
  if (s.stream == nullptr) {
    CAKE_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    CAKE_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate"));
  }
  return &s;
}

// One copy on the calling thread's stream, waited for on its event.
absl::Status Copy(int device, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  DeviceGuard guard(device);
  CAKE_RETURN_IF_ERROR(guard.status());
  CAKE_ASSIGN_OR_RETURN(auto stream, StreamFor(device));
  CAKE_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst, src, bytes, kind, stream->stream), "cudaMemcpyAsync"));
  CAKE_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stream->done, stream->stream), "cudaEventRecord"));
  return CudaStatus(cudaEventSynchronize(stream->done), "cudaEventSynchronize");
}

// One cudaMalloc; freed on its device when the owner goes.
class DeviceAllocation {
 public:
  static absl::StatusOr<DeviceAllocation> Create(uint64_t bytes, int device) {
    DeviceGuard guard(device);
    CAKE_RETURN_IF_ERROR(guard.status());
    void* data = nullptr;
    CAKE_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&data, bytes), absl::StrCat("cudaMalloc of ", bytes, " bytes on device ", device)));
    // Zeroed, as host regions are (a fresh shm object reads as zeros): no earlier user's bytes leak to an engine.
    if (auto s = CudaStatus(cudaMemset(data, 0, bytes), "cudaMemset"); !s.ok()) {
      cudaFree(data);
      return s;
    }
    return DeviceAllocation(data, device);
  }
  DeviceAllocation(DeviceAllocation&& o) noexcept : data_(std::exchange(o.data_, nullptr)), device_(o.device_) {}
  DeviceAllocation& operator=(DeviceAllocation&&) = delete;
  DeviceAllocation(const DeviceAllocation&) = delete;
  ~DeviceAllocation() {
    if (data_ == nullptr) return;
    DeviceGuard guard(device_);
    cudaFree(data_);
  }
  std::byte* data() const { return static_cast<std::byte*>(data_); }
  int device() const { return device_; }

 private:
  DeviceAllocation(void* data, int device) : data_(data), device_(device) {}
  void* data_;
  int device_;
};

class CudaRegion final : public Region {
 public:
  CudaRegion(DeviceAllocation allocation, uint64_t size, std::string handle)
      : allocation_(std::move(allocation)), size_(size), handle_(std::move(handle)) {}

  RegionBackend backend() const override { return RegionBackend::kCudaIpc; }
  uint64_t size() const override { return size_; }
  std::byte* host_data() override { return nullptr; }  // device memory: bytes go through CopyIn
  absl::Status CopyIn(uint64_t offset, std::span<const std::byte> src) override {
    CAKE_RETURN_IF_ERROR(CheckRange(size_, offset, src.size()));
    return Copy(allocation_.device(), allocation_.data() + offset, src.data(), src.size(), cudaMemcpyHostToDevice);
  }
  absl::Status CopyOut(uint64_t offset, std::span<std::byte> dst) const override {
    CAKE_RETURN_IF_ERROR(CheckRange(size_, offset, dst.size()));
    return Copy(allocation_.device(), dst.data(), allocation_.data() + offset, dst.size(), cudaMemcpyDeviceToHost);
  }
  std::string export_handle() const override { return handle_; }

 private:
  DeviceAllocation allocation_;
  uint64_t size_;
  std::string handle_;
};

}  // namespace

const CudaProbe& ProbeCuda() {
  static const CudaProbe probe = [] {
    CudaProbe p;
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      // No driver (cudaErrorInsufficientDriver) or no device: the host backend serves, and this says why.
      p.reason = absl::StrCat("the CUDA runtime found no usable device: ", cudaGetErrorName(err), " (",
                              cudaGetErrorString(err), ")");
      cudaGetLastError();  // clears the sticky error for later calls
      return p;
    }
    if (count == 0) {
      p.reason = "the CUDA runtime sees no device (CUDA_VISIBLE_DEVICES?)";
      return p;
    }
    p.usable = true;
    p.device_count = count;
    return p;
  }();
  return probe;
}

absl::StatusOr<std::unique_ptr<Region>> CreateCudaRegion(uint64_t bytes, int device) {
  const CudaProbe& probe = ProbeCuda();
  if (!probe.usable) return absl::FailedPreconditionError(probe.reason);
  if (device < 0 || device >= probe.device_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist; this machine has ", probe.device_count));
  }
  if (bytes == 0) return absl::InvalidArgumentError("a region of 0 bytes");
  CAKE_ASSIGN_OR_RETURN(auto allocation, DeviceAllocation::Create(bytes, device));
  cudaIpcMemHandle_t handle;
  {
    DeviceGuard guard(device);
    CAKE_RETURN_IF_ERROR(guard.status());
    CAKE_RETURN_IF_ERROR(CudaStatus(cudaIpcGetMemHandle(&handle, allocation.data()), "cudaIpcGetMemHandle"));
  }
  static_assert(sizeof(handle) == kCudaIpcHandleBytes);
  return std::make_unique<CudaRegion>(std::move(allocation), bytes,
                                      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
}

namespace {

// Pinned buffers are dear to make (cudaHostAlloc pins page by page, milliseconds per MiB): freed ones wait here
// for the next read of the same size, up to a bound.
class PinnedPool {
 public:
  static PinnedPool& Get() {
    static PinnedPool* pool = new PinnedPool();  // never destroyed: buffers may be returned during exit
    return *pool;
  }
  void* Take(uint64_t bytes) {
    std::lock_guard lock(mu_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* data = it->second.back();
    it->second.pop_back();
    pooled_bytes_ -= bytes;
    return data;
  }
  void Give(void* data, uint64_t bytes) {
    {
      std::lock_guard lock(mu_);
      if (pooled_bytes_ + bytes <= kMaxPooledBytes) {
        free_[bytes].push_back(data);
        pooled_bytes_ += bytes;
        return;
      }
    }
    cudaFreeHost(data);
  }

 private:
  static constexpr uint64_t kMaxPooledBytes = uint64_t{512} << 20;
  std::mutex mu_;
  std::map<uint64_t, std::vector<void*>> free_;
  uint64_t pooled_bytes_ = 0;
};

}  // namespace

absl::StatusOr<StagingBuffer> StagingBuffer::Allocate(uint64_t bytes) {
  if (ProbeCuda().usable) {
    if (void* pooled = PinnedPool::Get().Take(bytes); pooled != nullptr) {
      return StagingBuffer(static_cast<std::byte*>(pooled), bytes, true);
    }
    void* data = nullptr;
    if (cudaHostAlloc(&data, bytes, cudaHostAllocPortable) == cudaSuccess) {
      return StagingBuffer(static_cast<std::byte*>(data), bytes, true);
    }
    cudaGetLastError();  // pinned memory ran out: fall back to pageable memory, slower but correct
  }
  void* data = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (data == nullptr) return absl::ResourceExhaustedError(absl::StrCat("no memory for ", bytes, " staging bytes"));
  return StagingBuffer(static_cast<std::byte*>(data), bytes, false);
}

void StagingBuffer::Reset() {
  if (data_ == nullptr) return;
  if (pinned_) {
    PinnedPool::Get().Give(data_, size_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
}

absl::StatusOr<PinnedRange> PinnedRange::Pin(void* data, uint64_t bytes) {
  if (!ProbeCuda().usable || data == nullptr || bytes == 0) return PinnedRange();
  if (auto s = CudaStatus(cudaHostRegister(data, bytes, cudaHostRegisterPortable), "cudaHostRegister"); !s.ok()) {
    cudaGetLastError();
    return s;
  }
  return PinnedRange(data);
}

void PinnedRange::Reset() {
  if (data_ != nullptr) cudaHostUnregister(data_);
  data_ = nullptr;
}

absl::StatusOr<double> TimePinnedCopy(uint64_t bytes, int device) {
  const CudaProbe& probe = ProbeCuda();
  if (!probe.usable) return absl::FailedPreconditionError(probe.reason);
  if (device < 0 || device >= probe.device_count) return absl::InvalidArgumentError("no such CUDA device");
  CAKE_ASSIGN_OR_RETURN(auto staging, StagingBuffer::Allocate(bytes));
  if (!staging.pinned()) return absl::ResourceExhaustedError("no pinned memory for the reference copy");
  std::memset(staging.bytes().data(), 1, bytes);
  CAKE_ASSIGN_OR_RETURN(auto device_memory, DeviceAllocation::Create(bytes, device));
  DeviceGuard guard(device);
  CAKE_RETURN_IF_ERROR(guard.status());
  auto copy = [&] {
    return CudaStatus(cudaMemcpy(device_memory.data(), staging.bytes().data(), bytes, cudaMemcpyHostToDevice),
                      "cudaMemcpy");
  };
  CAKE_RETURN_IF_ERROR(copy());  // warm-up: the first copy pays for mappings
  const auto start = std::chrono::steady_clock::now();
  CAKE_RETURN_IF_ERROR(copy());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::StatusOr<CudaIpcMapping> CudaIpcMapping::Open(std::string_view handle, uint64_t bytes, int device) {
  const CudaProbe& probe = ProbeCuda();
  if (!probe.usable) return absl::FailedPreconditionError(probe.reason);
  if (handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA IPC handle has ", kCudaIpcHandleBytes, " bytes, not ", handle.size()));
  }
  DeviceGuard guard(device);
  CAKE_RETURN_IF_ERROR(guard.status());
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* data = nullptr;
  CAKE_RETURN_IF_ERROR(
      CudaStatus(cudaIpcOpenMemHandle(&data, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle"));
  return CudaIpcMapping(data, bytes, device);
}

void CudaIpcMapping::Reset() {
  if (data_ == nullptr) return;
  DeviceGuard guard(device_);
  cudaIpcCloseMemHandle(data_);
  data_ = nullptr;
}

absl::Status CudaIpcMapping::CopyToHost(uint64_t offset, std::span<std::byte> dst) const {
  CAKE_RETURN_IF_ERROR(CheckRange(size_, offset, dst.size()));
  return Copy(device_, dst.data(), static_cast<const std::byte*>(data_) + offset, dst.size(), cudaMemcpyDeviceToHost);
}

absl::Status CudaIpcMapping::CopyFromHost(uint64_t offset, std::span<const std::byte> src) const {
  CAKE_RETURN_IF_ERROR(CheckRange(size_, offset, src.size()));
  return Copy(device_, static_cast<std::byte*>(data_) + offset, src.data(), src.size(), cudaMemcpyHostToDevice);
}

}  // namespace cake
