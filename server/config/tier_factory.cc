#include "server/config/tier_factory.h"

#include <chrono>
#include <cstdlib>

#include "base/status_macros.h"
#include "spdlog/spdlog.h"
#include "storage/codec_tier.h"
#include "storage/disk/disk_tier.h"
#include "storage/dram_tier.h"
#include "storage/remote_tier.h"
#include "storage/throttled_tier.h"

namespace cake {

absl::Status AddTiersFromConfig(const DaemonConfig& config, bool page_lock_dram, TierManager& tiers,
                                PinnedRange& dram_pinned, uint32_t* remote_masters) {
  if (remote_masters != nullptr) *remote_masters = 0;
  const auto prefault_started = std::chrono::steady_clock::now();
  auto dram_tier = std::make_unique<DramTier>(config.dram_capacity_bytes, config.dram_prefault);
  if (!dram_tier->status().ok()) return dram_tier->status();
  if (config.dram_prefault) {
    spdlog::info(
        "DRAM tier: {} MiB prefaulted in {:.0f} ms", config.dram_capacity_bytes >> 20,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - prefault_started).count());
  }
  if (page_lock_dram) {
    const auto pin_started = std::chrono::steady_clock::now();
    const std::span<std::byte> arena = dram_tier->arena_bytes();
    auto pinned = PinnedRange::Pin(arena.data(), arena.size());
    if (pinned.ok()) {
      dram_pinned = std::move(*pinned);
      spdlog::info("CUDA: DRAM tier ({} MiB) page-locked in {:.0f} ms", arena.size() >> 20,
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pin_started).count());
    } else {
      spdlog::warn("CUDA: could not page-lock the DRAM tier ({}); DRAM hits reach devices through staging",
                   pinned.status().ToString());
    }
  }
  std::unique_ptr<Tier> dram = std::move(dram_tier);
  if (config.dram_read_gbps > 0) {
    dram = std::make_unique<ThrottledTier>(std::move(dram), config.dram_read_gbps, Clock::Real(),
                                           config.dram_read_burst_us * 1e-6);
  }
  tiers.AddTier(TierKind::kDram, std::move(dram));
  if (!config.disk_root.empty()) {
    DiskTier::Options disk;
    disk.root = config.disk_root;
    disk.capacity_bytes = config.disk_capacity_bytes;
    disk.max_chunk_bytes = config.max_chunk_bytes;  // what a header read back from a file may claim
    disk.queue_depth = config.disk_queue_depth;
    disk.io_backend = config.disk_io_backend;
    disk.allow_buffered = config.disk_allow_buffered;
    disk.recovery_threads = config.disk_recovery_threads;
    disk.index_checkpoint_interval = std::chrono::milliseconds(config.disk_index_checkpoint_ms);
    CAKE_ASSIGN_OR_RETURN(std::unique_ptr<Tier> disk_tier, DiskTier::Open(disk));
    if (config.disk_read_gbps > 0) {
      disk_tier = std::make_unique<ThrottledTier>(std::move(disk_tier), config.disk_read_gbps);
    }
    // Outside the throttle: a cap models the medium, which carries the encoded bytes.
    if (config.disk_codec != ChunkCodec::kNone) {
      disk_tier = std::make_unique<CodecTier>(std::move(disk_tier), config.disk_codec);
    }
    tiers.AddTier(TierKind::kDisk, std::move(disk_tier));
  }
  if (!config.remote_endpoints.empty()) {
    RemoteTier::Options remote;
    remote.endpoints = config.remote_endpoints;
    remote.user = config.remote_user;
    remote.password = config.remote_password;  // secrets read while the configuration was built (ReadConfigSecrets)
    remote.key_prefix = config.remote_key_prefix;
    remote.part_bytes = config.remote_part_bytes;
    remote.max_chunk_bytes = config.max_chunk_bytes;  // what a header read back from Redis may claim
    remote.connections = config.remote_connections;
    remote.connect_timeout = std::chrono::milliseconds(config.remote_connect_timeout_ms);
    remote.command_timeout = std::chrono::milliseconds(config.remote_command_timeout_ms);
    remote.ttl = std::chrono::seconds(config.remote_ttl_s);
    remote.scan_time_limit = std::chrono::seconds(config.remote_scan_timeout_s);
    CAKE_ASSIGN_OR_RETURN(std::unique_ptr<RemoteTier> opened, RemoteTier::Open(remote));
    if (remote_masters != nullptr) *remote_masters = opened->masters();
    std::unique_ptr<Tier> remote_tier = std::move(opened);
    if (config.remote_read_gbps > 0) {
      remote_tier = std::make_unique<ThrottledTier>(std::move(remote_tier), config.remote_read_gbps);
    }
    if (config.remote_codec != ChunkCodec::kNone) {
      remote_tier = std::make_unique<CodecTier>(std::move(remote_tier), config.remote_codec);
    }
    tiers.AddTier(TierKind::kRemote, std::move(remote_tier));
  }
  return absl::OkStatus();
}

}  // namespace cake
