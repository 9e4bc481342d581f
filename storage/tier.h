// The one narrow interface every storage tier implements (DRAM, disk, remote), plus the base for decorators
// (throttling, fault injection) that wrap any tier. One contract test suite runs against every implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "keys/namespace.h"

namespace cake {

struct TierUsage {
  uint64_t used_bytes = 0;
  uint64_t capacity_bytes = 0;
  uint64_t chunks = 0;
};

// What a tier did since it started, for the daemon's Stats (each counter is reported as tier_<kind>_<name>).
struct TierStats {
  uint64_t evictions = 0;        // chunks dropped to make room for others
  uint64_t corrupt_removed = 0;  // chunks a read found corrupt, deleted so the next load does not meet them again
  // Counters only this tier keeps (a remote tier's connects and redirects), by name; names are string literals.
  std::vector<std::pair<std::string_view, uint64_t>> own;
};

// What a tier can do, for code that treats tiers differently (admin calls, the threads that may ask it) without
// naming them.
struct TierCapabilities {
  bool checksummed = false;  // each stored chunk carries a checksum its reads check (DATA_LOSS when corrupt)
  bool lends = false;        // Lend hands out the stored bytes without a copy
  bool capped = false;       // its reads are capped, and SetReadCapGbps changes the cap
  // Its calls wait on a network the daemon does not control (Redis): such a tier is never asked from a thread
  // that must stay free (gRPC's), and a frozen one delays only the calls that need it. Tiers that answer Contains
  // and Usage from memory (DRAM, disk's index) do not.
  bool waits_on_network = false;
};

// Every method may be called concurrently from any thread.
class Tier {
 public:
  virtual ~Tier() = default;

  virtual std::string_view name() const = 0;
  virtual bool Contains(const ChunkKey& key) const = 0;
  // Contains for many keys at once: a remote tier answers them in one round trip instead of one each.
  virtual std::vector<bool> ContainsEach(std::span<const ChunkKey> keys) const {
    std::vector<bool> found(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) found[i] = Contains(keys[i]);
    return found;
  }
  // Copies the stored value into dst, whose size must equal the value's.
  // NOT_FOUND: absent. INVALID_ARGUMENT: dst has the wrong size. DATA_LOSS: the stored value is corrupt (and
  // has been removed). UNAVAILABLE: the medium failed; the caller treats every error as a miss.
  virtual absl::Status Read(const ChunkKey& key, std::span<std::byte> dst) = 0;
  // Read for a caller that does not know the value's size (a codec reading back what it encoded, Verify reading
  // what a scan listed): `out` is resized to the stored value. INVALID_ARGUMENT, with nothing allocated for it, when
  // the value claims more than max_bytes (its size comes from a file or from Redis: a peer's word). Otherwise as
  // Read. The tiers that store values (DRAM, disk, remote) implement it.
  virtual absl::Status ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) {
    (void)key, (void)max_bytes, (void)out;
    return absl::UnimplementedError("this tier cannot read a value of unknown size");
  }
  // Reads the value as ReadValue would and checks it (its checksum; in a tier with a codec, that it decodes) without
  // keeping it: what Verify runs over every chunk a scan lists. The value's size (raw, for a codec), or ReadValue's
  // errors. Memory: what arrives from the medium, returned before this returns (a codec inflates through a small
  // window, whatever length its header claims). Decorators do not forward it: this default reads through the
  // outermost tier's ReadValue, so a read cap applies; CodecTier, outermost where it is used, overrides it.
  virtual absl::StatusOr<uint64_t> Check(const ChunkKey& key, uint64_t max_bytes) {
    std::vector<std::byte> value;
    if (absl::Status read = ReadValue(key, max_bytes, value); !read.ok()) return read;
    return value.size();
  }
  // Stores a copy of src under key; a key names its content, so writing an existing key keeps one copy.
  // RESOURCE_EXHAUSTED: it does not fit, even after evicting everything evictable.
  virtual absl::Status Write(const ChunkKey& key, std::span<const std::byte> src) = 0;
  // NOT_FOUND: absent.
  virtual absl::Status Remove(const ChunkKey& key) = 0;
  // used_bytes counts what the chunks really cost the tier (whole pages in DRAM, whole files on disk), not their
  // payload: a budget that counted payload could be made to say a fraction of what is held.
  virtual TierUsage Usage() const = 0;
  // What one stored chunk of `chunk_bytes` adds to Usage().used_bytes.
  virtual uint64_t Footprint(uint64_t chunk_bytes) const { return chunk_bytes; }
  // Visits every stored key with its value's size (used to rebuild indexes); fn must not call back into the tier.
  virtual void ForEach(const std::function<void(const ChunkKey&, uint64_t bytes)>& fn) const = 0;
  // The stored bytes themselves, valid and unchanged while the returned pointer is held, even if the chunk is
  // evicted or removed meanwhile: lets the write-back queue hold a chunk without copying it. nullptr when the
  // chunk is absent or the tier cannot lend (the caller copies with Read instead).
  // Lending is a read: a decorator that changes Read changes Lend the same way.
  virtual std::shared_ptr<const std::span<const std::byte>> Lend(const ChunkKey& key) {
    (void)key;
    return nullptr;
  }
  virtual TierStats Stats() const { return {}; }
  virtual TierCapabilities Capabilities() const { return {}; }
  bool waits_on_network() const { return Capabilities().waits_on_network; }
  // Ends every wait inside the tier at once (a throttle's sleeps; later reads pass unpaced): the daemon is stopping
  // and its I/O threads must come back.
  virtual void Interrupt() {}
  // The cap on this tier's reads in Gbit/s, 0 when they are not capped.
  virtual double read_cap_gbps() const { return 0; }
  // Changes the cap; FAILED_PRECONDITION for a tier that was started without one (only a throttle has a cap).
  virtual absl::Status SetReadCapGbps(double gbps) {
    (void)gbps;
    return absl::FailedPreconditionError("this tier's reads are not capped");
  }
};

// Forwards everything to the wrapped tier; decorators override only what they change.
class TierDecorator : public Tier {
 public:
  explicit TierDecorator(std::unique_ptr<Tier> inner) : inner_(std::move(inner)) {}

  std::string_view name() const override { return inner_->name(); }
  bool Contains(const ChunkKey& key) const override { return inner_->Contains(key); }
  std::vector<bool> ContainsEach(std::span<const ChunkKey> keys) const override { return inner_->ContainsEach(keys); }
  absl::Status Read(const ChunkKey& key, std::span<std::byte> dst) override { return inner_->Read(key, dst); }
  absl::Status ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) override {
    return inner_->ReadValue(key, max_bytes, out);
  }
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src) override { return inner_->Write(key, src); }
  absl::Status Remove(const ChunkKey& key) override { return inner_->Remove(key); }
  TierUsage Usage() const override { return inner_->Usage(); }
  uint64_t Footprint(uint64_t chunk_bytes) const override { return inner_->Footprint(chunk_bytes); }
  void ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const override { inner_->ForEach(fn); }
  std::shared_ptr<const std::span<const std::byte>> Lend(const ChunkKey& key) override { return inner_->Lend(key); }
  TierStats Stats() const override { return inner_->Stats(); }
  TierCapabilities Capabilities() const override { return inner_->Capabilities(); }
  void Interrupt() override { inner_->Interrupt(); }
  double read_cap_gbps() const override { return inner_->read_cap_gbps(); }
  absl::Status SetReadCapGbps(double gbps) override { return inner_->SetReadCapGbps(gbps); }

 private:
  std::unique_ptr<Tier> inner_;
};

}  // namespace cake
