#include "storage/tier_manager.h"

#include <chrono>
#include <new>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"
#include "storage/chunk_codec.h"

namespace cake {

TierManager::TierManager(const Options& options)
    : options_(options),
      write_back_(options.write_back_queue_bytes, options.write_back_threads),
      promotion_(options.promotion_queue_bytes) {}

TierManager::~TierManager() = default;

void TierManager::AddTier(TierKind kind, std::unique_ptr<Tier> tier) {
  auto entry = std::make_unique<Entry>();
  entry->kind = kind;
  entry->tier = std::move(tier);
  tiers_.push_back(std::move(entry));
}

TierManager::Entry* TierManager::Find(TierKind kind) const {
  for (const auto& e : tiers_) {
    if (e->kind == kind) return e.get();
  }
  return nullptr;
}

Tier* TierManager::tier(TierKind kind) const {
  Entry* e = Find(kind);
  return e ? e->tier.get() : nullptr;
}

std::vector<TierKind> TierManager::LookupPrefix(std::span<const ChunkKey> keys) const {
  PrefixLookup lookup = LookupPrefixInMemory(keys);
  FinishLookupOverNetwork(lookup);
  return lookup.Prefix();
}

namespace {

// Asks `tier` about every key still unresolved, all at once (a remote tier answers in one round trip), and
// keeps only those it does not hold.
void AskTier(const Tier& tier, TierKind kind, std::vector<TierKind>& holder, std::vector<ChunkKey>& unresolved,
             std::vector<size_t>& positions) {
  if (unresolved.empty()) return;
  const std::vector<bool> found = tier.ContainsEach(unresolved);
  size_t kept = 0;
  for (size_t j = 0; j < unresolved.size(); ++j) {
    if (found[j]) {
      holder[positions[j]] = kind;
    } else {
      unresolved[kept] = unresolved[j];
      positions[kept] = positions[j];
      ++kept;
    }
  }
  unresolved.resize(kept);
  positions.resize(kept);
}

}  // namespace

TierManager::PrefixLookup TierManager::LookupPrefixInMemory(std::span<const ChunkKey> keys) const {
  // Tier by tier, fastest first, asking each only about the keys no faster tier holds.
  PrefixLookup lookup;
  lookup.holder_.assign(keys.size(), TierKind::kNone);
  lookup.unresolved_.assign(keys.begin(), keys.end());
  lookup.positions_.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) lookup.positions_[i] = i;
  if (const std::vector<bool> arriving = arrivals_.ArrivingLocally(lookup.unresolved_);
      !arriving.empty() && !tiers_.empty()) {
    // A chunk being prefetched is in the fastest tier as far as a load is concerned: its read waits for the copy.
    size_t kept = 0;
    for (size_t j = 0; j < lookup.unresolved_.size(); ++j) {
      if (arriving[j]) {
        lookup.holder_[lookup.positions_[j]] = tiers_.front()->kind;
      } else {
        lookup.unresolved_[kept] = lookup.unresolved_[j];
        lookup.positions_[kept] = lookup.positions_[j];
        ++kept;
      }
    }
    lookup.unresolved_.resize(kept);
    lookup.positions_.resize(kept);
  }
  for (const auto& e : tiers_) {
    if (e->tier->waits_on_network()) {
      lookup.network_tiers_ = true;
      continue;
    }
    AskTier(*e->tier, e->kind, lookup.holder_, lookup.unresolved_, lookup.positions_);
  }
  return lookup;
}

void TierManager::FinishLookupOverNetwork(PrefixLookup& lookup) const {
  if (!lookup.needs_network()) return;
  for (const auto& e : tiers_) {
    if (e->tier->waits_on_network()) AskTier(*e->tier, e->kind, lookup.holder_, lookup.unresolved_, lookup.positions_);
  }
  lookup.network_tiers_ = false;
}

std::vector<TierKind> TierManager::PrefixLookup::Prefix() const {
  std::vector<TierKind> prefix;
  for (TierKind kind : holder_) {
    if (kind == TierKind::kNone) break;
    prefix.push_back(kind);
  }
  return prefix;
}

void TierManager::Interrupt() {
  for (const auto& e : tiers_) e->tier->Interrupt();
}

bool TierManager::has_network_tier() const {
  for (const auto& e : tiers_) {
    if (e->tier->waits_on_network()) return true;
  }
  return false;
}

bool TierManager::InFastestTier(const ChunkKey& key) const {
  return !tiers_.empty() && tiers_.front()->tier->Contains(key);
}

absl::Status TierManager::Prefetch(const ChunkKey& key, TierKind from, uint64_t chunk_bytes,
                                   const LossyFormat& format) {
  if (tiers_.size() < 2 || from == tiers_.front()->kind) return absl::AlreadyExistsError("no slower tier to copy from");
  Entry* source = Find(from);
  if (source == nullptr) return absl::NotFoundError(absl::StrCat("no ", TierKindName(from), " tier is configured"));
  if (tiers_.front()->tier->Contains(key)) return absl::AlreadyExistsError("the chunk is in the fastest tier");
  if (!arrivals_.Begin(key, source->tier->waits_on_network())) {
    return absl::AlreadyExistsError("a prefetch of this chunk runs");
  }
  // Whatever happens, the arrival ends and its waiters wake (they then read what the fastest tier holds).
  absl::Cleanup end_arrival = [&] { arrivals_.End(key); };
  absl::Status status;
  try {
    // 4 KiB-aligned, so a disk tier reads into it with O_DIRECT.
    const size_t size = (chunk_bytes + 4095) & ~size_t{4095};
    std::unique_ptr<std::byte[], void (*)(std::byte*)> buffer(
        static_cast<std::byte*>(::operator new[](size, std::align_val_t{4096})),
        [](std::byte* p) { ::operator delete[](p, std::align_val_t{4096}); });
    const std::span<std::byte> bytes(buffer.get(), chunk_bytes);
    status = Read(from, key, bytes, format);
    if (status.ok()) Promote(key, bytes, from, format);
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory for a prefetch buffer");
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("a prefetch copy failed: ", e.what()));
  } catch (...) {
    status = absl::InternalError("a prefetch copy failed with an unknown exception");
  }
  return status;
}

absl::Status TierManager::Read(TierKind kind, const ChunkKey& key, std::span<std::byte> dst,
                               const LossyFormat& format) {
  Entry* e = Find(kind);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no ", TierKindName(kind), " tier is configured"));
  const bool fastest = e == tiers_.front().get();
  const bool quantized = !fastest && format.lossy();
  if (quantized && format.raw_bytes() != dst.size()) {  // the caller's mistake, not the value's
    return absl::InvalidArgumentError(
        absl::StrCat("a chunk of this namespace is ", format.raw_bytes(), " bytes; the destination has ", dst.size()));
  }
  if (fastest) arrivals_.Await(key);
  const auto started = std::chrono::steady_clock::now();
  absl::Status status = quantized ? ReadQuantized(*e->tier, key, dst, format) : e->tier->Read(key, dst);
  if (absl::IsInvalidArgument(status)) {
    spdlog::warn("{} tier: chunk {} is not a chunk of its namespace's size ({}); removing it",
                 std::string(e->tier->name()), key.Hex(), std::string(status.message()));
    (void)e->tier->Remove(key);
    status = absl::DataLossError(absl::StrCat("chunk ", key.Hex(), ": ", status.message(), "; removed"));
  }
  e->io.read_seconds.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  if (status.ok()) {
    e->io.read_hits.fetch_add(1, std::memory_order_relaxed);
    e->io.read_bytes.fetch_add(dst.size(), std::memory_order_relaxed);
  } else {
    (absl::IsNotFound(status) ? e->io.read_misses : e->io.read_errors).fetch_add(1, std::memory_order_relaxed);
  }
  return status;
}

void TierManager::IoMeter::CountWrite(const absl::Status& status, uint64_t bytes) {
  if (status.ok()) {
    writes_ok.fetch_add(1, std::memory_order_relaxed);
    written_bytes.fetch_add(bytes, std::memory_order_relaxed);
  } else {
    writes_failed.fetch_add(1, std::memory_order_relaxed);
  }
}

std::shared_ptr<const std::span<const std::byte>> TierManager::Lend(TierKind kind, const ChunkKey& key) {
  Entry* e = Find(kind);
  if (e != nullptr && e == tiers_.front().get()) arrivals_.Await(key);
  return e == nullptr ? nullptr : e->tier->Lend(key);
}

absl::Status TierManager::ReadQuantized(Tier& tier, const ChunkKey& key, std::span<std::byte> dst,
                                        const LossyFormat& format) {
  if (format.raw_bytes() != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a chunk of this namespace is ", format.raw_bytes(), " bytes; the destination has ", dst.size()));
  }
  // Reused: chunks are megabytes; past kThreadBufferCeiling given back when the read ends.
  thread_local std::vector<std::byte> encoded;
  struct ReleaseIfLarge {
    ~ReleaseIfLarge() {
      if (encoded.capacity() > kThreadBufferCeiling) std::vector<std::byte>().swap(encoded);
    }
  } release;
  CAKE_RETURN_IF_ERROR(tier.ReadValue(key, format.encoded_bytes(), encoded));
  absl::Status decoded = DecodeLossy(encoded, dst, format);
  if (absl::IsDataLoss(decoded) || absl::IsInvalidArgument(decoded)) {
    // It passed the tier's checksum and still is not this namespace's encoding: whoever stored it, no read will
    // decode it.
    spdlog::warn("{} tier: quantized chunk {} does not decode ({}); removing it", std::string(tier.name()), key.Hex(),
                 std::string(decoded.message()));
    (void)tier.Remove(key);
    return absl::DataLossError(absl::StrCat("quantized chunk ", key.Hex(), ": ", decoded.message(), "; removed"));
  }
  return decoded;
}

absl::Status TierManager::Write(const ChunkKey& key, std::span<const std::byte> src, const LossyFormat& format) {
  if (tiers_.empty()) return absl::FailedPreconditionError("no tier is configured");
  Tier& fastest = *tiers_.front()->tier;
  absl::Status status = fastest.Write(key, src);
  tiers_.front()->io.CountWrite(status, src.size());
  if (!status.ok() || tiers_.size() == 1) return status;

  // The job holds the fastest tier's own bytes when it lends them (no copy; an eviction meanwhile keeps them
  // alive), or else a copy of its own.
  SharedBytes bytes = fastest.Lend(key);
  const bool lent = bytes != nullptr;
  if (lent && write_back_.queued_bytes() + src.size() > fastest.Usage().capacity_bytes / 2) {
    bytes = nullptr;  // lent chunks would crowd the fastest tier: write this one inline
  } else if (!lent) {
    auto copy = std::make_shared<std::pair<std::vector<std::byte>, std::span<const std::byte>>>();
    copy->first.assign(src.begin(), src.end());
    copy->second = copy->first;
    bytes = SharedBytes(copy, &copy->second);
  }
  if (bytes != nullptr && write_back_.TryPush(src.size(), [this, key, bytes, format](bool run) mutable {
        if (run) WriteToSlowerTiers(key, *bytes, format);
        bytes = nullptr;
      })) {
    return absl::OkStatus();
  }
  Count(&WriteBackStats::inline_writes);
  WriteToSlowerTiers(key, src, format);
  return absl::OkStatus();
}

void TierManager::Count(uint64_t WriteBackStats::*counter) {
  MutexLock lock(&mu_);
  ++(stats_.*counter);
}

void TierManager::WriteToSlowerTiers(const ChunkKey& key, std::span<const std::byte> raw, const LossyFormat& format) {
  std::vector<std::byte> quantized;  // made once, for the first slower tier that needs it
  std::span<const std::byte> bytes = raw;
  for (size_t i = 1; i < tiers_.size(); ++i) {
    Tier& tier = *tiers_[i]->tier;
    if (tier.Contains(key)) continue;
    if (format.lossy() && quantized.empty()) {
      quantized = EncodeLossy(format, raw);
      bytes = quantized;
      // Empty only for a chunk of another size than the namespace's, which Store refuses: never store nothing.
      if (quantized.empty()) {
        Count(&WriteBackStats::failed);
        return;
      }
    }
    const absl::Status written = tier.Write(key, bytes);
    tiers_[i]->io.CountWrite(written, bytes.size());
    Count(written.ok() ? &WriteBackStats::written : &WriteBackStats::failed);
    if (!written.ok()) {
      // A cache may drop a copy, but not in silence; at the 1st, 2nd, 4th, 8th... failure, so a tier that is
      // down for long does not flood the log.
      const uint64_t failures = write_back_failures_.fetch_add(1, std::memory_order_relaxed) + 1;
      if ((failures & (failures - 1)) == 0) {
        spdlog::warn(
            "write-back of a chunk to the {} tier failed ({}); {} write-backs have failed so far: those "
            "chunks stay in the faster tiers only",
            std::string(tier.name()), written.ToString(), failures);
      }
    }
  }
}

size_t TierManager::FlushWriteBack(Duration bound) { return write_back_.WaitIdle(bound); }

TierManager::PromotionFit TierManager::FitForPromotion(std::span<const TierKind> chunk_tiers, uint32_t from,
                                                       uint64_t chunk_bytes) const {
  const Tier* dram = tier(TierKind::kDram);
  if (dram == nullptr) return PromotionFit::kNothingToPromote;
  uint64_t slower_bytes = 0;
  for (size_t c = from; c < chunk_tiers.size(); ++c) {
    if (chunk_tiers[c] != TierKind::kDram) slower_bytes += chunk_bytes;
  }
  if (slower_bytes == 0) return PromotionFit::kNothingToPromote;
  return slower_bytes <= dram->Usage().capacity_bytes / 2 ? PromotionFit::kFits : PromotionFit::kTooLarge;
}

void TierManager::Promote(const ChunkKey& key, std::span<const std::byte> bytes, TierKind from,
                          const LossyFormat& format) {
  if (tiers_.size() < 2) return;
  Entry& fastest = *tiers_.front();
  if (!fastest.tier->Contains(key)) {
    const absl::Status written = fastest.tier->Write(key, bytes);
    fastest.io.CountWrite(written, bytes.size());
    if (written.ok()) Count(&WriteBackStats::promotions);
  }
  if (from == TierKind::kRemote && options_.promote_remote_to_disk && !format.lossy()) {
    Entry* disk = Find(TierKind::kDisk);
    if (disk != nullptr && !disk->tier->Contains(key)) {
      const absl::Status written = disk->tier->Write(key, bytes);
      disk->io.CountWrite(written, bytes.size());
      if (written.ok()) Count(&WriteBackStats::promotions_to_disk);
    }
  }
}

bool TierManager::PromoteLater(const ChunkKey& key, std::span<const std::byte> bytes, std::function<void()> done,
                               TierKind from, const LossyFormat& format) {
  const bool to_disk = from == TierKind::kRemote && options_.promote_remote_to_disk && !format.lossy() &&
                       tier(TierKind::kDisk) != nullptr;
  if (tiers_.size() < 2 || (tiers_.front()->tier->Contains(key) && !to_disk)) return false;
  const bool queued =
      promotion_.TryPush(bytes.size(), [this, key, bytes, from, format, done = std::move(done)](bool run) {
        if (run) Promote(key, bytes, from, format);
        done();
      });
  if (!queued) Count(&WriteBackStats::promotions_dropped);
  return queued;
}

TierManager::WriteBackStats TierManager::write_back_stats() const {
  WriteBackStats stats;
  {
    MutexLock lock(&mu_);
    stats = stats_;
  }
  stats.queued_bytes = write_back_.queued_bytes();
  return stats;
}

}  // namespace cake
