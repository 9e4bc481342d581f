// CUDA behind an interface: nothing here includes CUDA's headers, so every other module builds without them, and
// the same binary starts on a machine without a driver (the build links cudart statically: CMakeLists.txt's CAKE_CUDA).
// Built from cuda_backend.cc where the toolkit was found, from cuda_unavailable.cc otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/region.h"

namespace cake {

// Whether this process can use CUDA: built with the toolkit, a driver present, at least one device visible.
struct CudaProbe {
  bool usable = false;
  int device_count = 0;
  std::string reason;  // why not, when not usable: a line for the log and for error messages
};
// Asks the runtime once (the answer is cached for the process).
const CudaProbe& ProbeCuda();

// Bytes in a cudaIpcMemHandle_t.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// Device memory on `device` for the daemon to load into, exported with cudaIpcGetMemHandle (export_handle() is
// the handle's 64 bytes). Copies go through a per-thread stream and an event per copy: CopyIn returns once the
// bytes are on the device, so a chunk is reported loaded only after its copy completed. FAILED_PRECONDITION
// where CUDA is unusable, INVALID_ARGUMENT for a device that does not exist, RESOURCE_EXHAUSTED when the
// device is out of memory.
absl::StatusOr<std::unique_ptr<Region>> CreateCudaRegion(uint64_t bytes, int device);

// Host memory the daemon reads chunks into before copying them to a device region: page-locked where CUDA is
// usable (cudaHostAlloc), so the copy is one DMA with no bounce through the driver's own staging; plain aligned
// memory otherwise. Move-only.
class StagingBuffer {
 public:
  static absl::StatusOr<StagingBuffer> Allocate(uint64_t bytes);
  StagingBuffer(StagingBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(other.size_), pinned_(other.pinned_) {}
  StagingBuffer& operator=(StagingBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = other.size_;
      pinned_ = other.pinned_;
    }
    return *this;
  }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() { Reset(); }

  std::span<std::byte> bytes() const { return {data_, size_}; }
  bool pinned() const { return pinned_; }

 private:
  StagingBuffer(std::byte* data, uint64_t size, bool pinned) : data_(data), size_(size), pinned_(pinned) {}
  void Reset();

  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  bool pinned_ = false;
};

// Page-locks existing host memory (cudaHostRegister) until the object goes: the DRAM tier's arena, so a chunk
// lent from it goes to a device region in one DMA. Move-only; empty where CUDA is unusable.
class PinnedRange {
 public:
  static absl::StatusOr<PinnedRange> Pin(void* data, uint64_t bytes);
  PinnedRange() = default;
  PinnedRange(PinnedRange&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}
  PinnedRange& operator=(PinnedRange&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
    }
    return *this;
  }
  PinnedRange(const PinnedRange&) = delete;
  PinnedRange& operator=(const PinnedRange&) = delete;
  ~PinnedRange() { Reset(); }
  bool pinned() const { return data_ != nullptr; }

 private:
  explicit PinnedRange(void* data) : data_(data) {}
  void Reset();
  void* data_ = nullptr;
};

// One plain cudaMemcpy of `bytes` from pinned host memory to `device`, timed after a warm-up: the limit a load
// into a device region is measured against. Seconds.
absl::StatusOr<double> TimePinnedCopy(uint64_t bytes, int device);

// The engine's side of a CUDA region: the daemon's allocation opened in this process (cudaIpcOpenMemHandle).
// Move-only; closes the mapping when it goes. The current device is saved and restored around every call.
class CudaIpcMapping {
 public:
  static absl::StatusOr<CudaIpcMapping> Open(std::string_view handle, uint64_t bytes, int device);
  CudaIpcMapping(CudaIpcMapping&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(other.size_), device_(other.device_) {}
  CudaIpcMapping& operator=(CudaIpcMapping&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = other.size_;
      device_ = other.device_;
    }
    return *this;
  }
  CudaIpcMapping(const CudaIpcMapping&) = delete;
  CudaIpcMapping& operator=(const CudaIpcMapping&) = delete;
  ~CudaIpcMapping() { Reset(); }

  // A device pointer, valid on device().
  void* device_data() const { return data_; }
  uint64_t size() const { return size_; }
  int device() const { return device_; }
  // Synchronous copies, for engines and checks without kernels of their own. OUT_OF_RANGE outside the mapping.
  absl::Status CopyToHost(uint64_t offset, std::span<std::byte> dst) const;
  absl::Status CopyFromHost(uint64_t offset, std::span<const std::byte> src) const;

 private:
  CudaIpcMapping(void* data, uint64_t size, int device) : data_(data), size_(size), device_(device) {}
  void Reset();
  void* data_ = nullptr;
  uint64_t size_ = 0;
  int device_ = 0;
};

}  // namespace cake
