// A move-only, 4096-byte-aligned heap buffer: the unit O_DIRECT reads and writes need.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <utility>

namespace cake {

inline constexpr size_t kDirectIoAlignment = 4096;

inline constexpr uint64_t RoundUpToBlock(uint64_t n) {
  return (n + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
}

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Rounds the allocation up to a whole block (aligned_alloc requires it); size() stays as asked.
  // On allocation failure data() is null: callers check ok().
  explicit AlignedBuffer(size_t size)
      : data_(static_cast<std::byte*>(std::aligned_alloc(kDirectIoAlignment, RoundUpToBlock(size == 0 ? 1 : size)))),
        size_(data_ ? size : 0) {}
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  bool ok() const { return data_ != nullptr; }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace cake
