// The CUDA backend where the build found no CUDA toolkit: CUDA is never usable, staging is plain memory, and
// every CUDA call says why.
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"

namespace cake {
namespace {
constexpr char kNotBuilt[] = "caked was built without the CUDA toolkit (CAKE_CUDA=OFF or no toolkit found)";
}  // namespace

const CudaProbe& ProbeCuda() {
  static const CudaProbe probe{false, 0, kNotBuilt};
  return probe;
}

absl::StatusOr<std::unique_ptr<Region>> CreateCudaRegion(uint64_t, int) {
  return absl::FailedPreconditionError(kNotBuilt);
}

absl::StatusOr<StagingBuffer> StagingBuffer::Allocate(uint64_t bytes) {
  void* data = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (data == nullptr) return absl::ResourceExhaustedError(absl::StrCat("no memory for ", bytes, " staging bytes"));
  return StagingBuffer(static_cast<std::byte*>(data), bytes, false);
}

void StagingBuffer::Reset() {
  std::free(data_);
  data_ = nullptr;
}

absl::StatusOr<PinnedRange> PinnedRange::Pin(void*, uint64_t) { return PinnedRange(); }
void PinnedRange::Reset() { data_ = nullptr; }
absl::StatusOr<double> TimePinnedCopy(uint64_t, int) { return absl::FailedPreconditionError(kNotBuilt); }

absl::StatusOr<CudaIpcMapping> CudaIpcMapping::Open(std::string_view, uint64_t, int) {
  return absl::FailedPreconditionError(kNotBuilt);
}
void CudaIpcMapping::Reset() { data_ = nullptr; }
absl::Status CudaIpcMapping::CopyToHost(uint64_t, std::span<std::byte>) const {
  return absl::FailedPreconditionError(kNotBuilt);
}
absl::Status CudaIpcMapping::CopyFromHost(uint64_t, std::span<const std::byte>) const {
  return absl::FailedPreconditionError(kNotBuilt);
}

}  // namespace cake
