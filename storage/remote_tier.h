// Remote tier: chunks in Redis (one server, or a Redis Cluster), so daemons on many machines share one cache.
// Redis owns the capacity (its maxmemory policy evicts), so this tier never assumes a write stayed: every read
// checks the value's header and checksum, and anything missing, partial or corrupt is a miss.
//
// The value format (a header and parts under one hash tag) is storage/remote_codec.h; talking to Redis (pools,
// back-off, slot map, redirects, AUTH) is storage/redis/redis_cluster_client.h. This adapter puts the two together
// behind the Tier interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "keys/namespace.h"
#include "storage/tier.h"

namespace cake {

class RemoteTier final : public Tier {
 public:
  struct Options {
    // "host:port" of a standalone Redis, or seeds of a Redis Cluster (any reachable node will do: the slot map
    // comes from CLUSTER SLOTS, and MOVED/ASK redirects are followed). Whether it is a cluster is detected.
    std::vector<std::string> endpoints;
    std::string user;  // ACL user; empty: AUTH with the password alone (or no AUTH without one)
    std::string password;
    // Prepended to every key, so one Redis can serve many models and many groups of daemons. No '{' or '}'.
    std::string key_prefix = "cake:";
    uint64_t part_bytes = uint64_t{4} << 20;
    // Idle connections kept per Redis node; each concurrent read or write uses one of its own.
    uint32_t connections = 8;
    std::chrono::milliseconds connect_timeout{500};
    std::chrono::milliseconds command_timeout{2000};
    // 0: keys do not expire (Redis's maxmemory policy, e.g. allkeys-lru, evicts them).
    std::chrono::seconds ttl{0};
    // After a node fails, calls to it fail fast for a while, doubling from 50 ms up to this.
    std::chrono::milliseconds max_backoff{2000};
    // The largest chunk this tier stores (the daemon passes its limits.max_chunk_bytes; the default is that
    // setting's). A header that claims more is a peer's word this daemon never acts on: ForEach does not report
    // it (so no admin job sizes a buffer by it) and Remove deletes no more parts than a chunk of this size can
    // have. A Write of more is refused, so the tier never holds what its own scan would skip.
    uint64_t max_chunk_bytes = NamespaceLimits{}.max_chunk_bytes;
    // How long one node's scan (ForEach: Verify, Evict) may run, whatever the node says of its size: the rounds
    // and names its INFO justifies are the node's word, this clock is the daemon's own.
    std::chrono::milliseconds scan_time_limit{120000};
  };

  struct Counters {
    uint64_t errors = 0;             // a command or connection failed (timeouts included)
    uint64_t connects = 0;           // connections opened
    uint64_t fast_failures = 0;      // calls refused at once because their node was backing off
    uint64_t moved = 0;              // MOVED redirects followed (the slot map was refreshed)
    uint64_t ask = 0;                // ASK redirects followed (a slot being migrated)
    uint64_t redirects_refused = 0;  // redirects to nodes no seed or slot map named, not followed
    uint64_t corrupt_removed = 0;    // values with a bad header, missing part or checksum, deleted
    // Headers a scan (ForEach) did not report: corrupt ones (also deleted and counted above), ones claiming more
    // than max_chunk_bytes, and newer formats' (those two left in place: maybe another daemon's).
    uint64_t headers_skipped = 0;
    // Scans of a node ended before Redis's cursor came back to 0: by Interrupt, or past the rounds or key names
    // a node of its size can need (a cursor that never ends).
    uint64_t scans_cut_short = 0;
  };

  // Checks the options; does not need Redis to be up (a down remote is a miss until it comes back).
  // INVALID_ARGUMENT: no endpoint, a malformed one, a bad prefix, part_bytes or connections of 0, max_chunk_bytes
  // of 0.
  static absl::StatusOr<std::unique_ptr<RemoteTier>> Open(const Options& options);
  ~RemoteTier() override;

  std::string_view name() const override { return "remote"; }
  bool Contains(const ChunkKey& key) const override;
  std::vector<bool> ContainsEach(std::span<const ChunkKey> keys) const override;
  absl::Status Read(const ChunkKey& key, std::span<std::byte> dst) override;
  absl::Status ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) override;
  // RESOURCE_EXHAUSTED also for a value over max_chunk_bytes.
  absl::Status Write(const ChunkKey& key, std::span<const std::byte> src) override;
  // Deletes the header, then the parts it names, at most as many as a chunk of max_chunk_bytes has (none past the
  // first run of them that is already gone): a forged part count costs a few DELs, not millions.
  absl::Status Remove(const ChunkKey& key) override;
  // Redis's own memory figures, summed over the nodes (used_memory, maxmemory: 0 is unlimited), refreshed at
  // most once a second; chunks are not counted (that would take a scan).
  TierUsage Usage() const override;
  // Scans every node for this prefix's headers (SCAN, so Redis keeps serving others meanwhile) and reports each
  // chunk whose header reads as a load would read it, with its length: never more than max_chunk_bytes. A
  // corrupt header is deleted (as a load deletes it); one claiming more than max_chunk_bytes, or of a newer
  // format, is skipped (counters: headers_skipped). A node's scan ends when its cursor comes back to 0, after
  // at most as many rounds and key names as a node of its size (INFO keyspace) can need, capped whatever it says,
  // or at the next round once Interrupt() was called; a round's commands wait at most command_timeout each.
  void ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const override;
  // The daemon is stopping: a scan running now ends at its next round, and any later one at once (a hostile
  // Redis could keep a cursor going for hours). Reads, writes and removes are not affected.
  void Interrupt() override;

  Counters counters() const;
  // The counters, as the daemon's Stats reports them (corrupt removals, the rest by name).
  TierStats Stats() const override;
  TierCapabilities Capabilities() const override { return {.checksummed = true, .waits_on_network = true}; }
  // True once a node answered CLUSTER SLOTS with a slot map.
  bool is_cluster() const;
  // The masters that own slots (1: a standalone server); 0 while Redis has not answered (the seeds failed and no
  // slot map came). The daemon sizes its remote read threads by it at start-up.
  uint32_t masters() const;

  class Impl;

 private:
  explicit RemoteTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cake
