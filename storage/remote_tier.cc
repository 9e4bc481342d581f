// RemoteTier: the Tier interface over the remote value format (remote_codec) and a Redis client
// (redis_cluster_client).
#include "storage/remote_tier.h"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "storage/chunk_file.h"
#include "storage/redis/redis_cluster_client.h"
#include "storage/remote_codec.h"

namespace cake {

using SteadyClock = std::chrono::steady_clock;

namespace {

// The payload checksum of a chunk whose parts land in the destination one receive at a time: the bytes are
// hashed as far as they have landed contiguously from the start, so the checksum (about 1 ms for 16 MiB here)
// runs while later bytes are still on the wire rather than after the last. Bytes that did not land through the
// sink (a reply copied in afterwards) are hashed by Finish.
class LandingChecksum {
 public:
  LandingChecksum(std::span<const std::byte> dst, uint64_t part_bytes)
      : dst_(dst), part_bytes_(part_bytes), landed_(RemotePartCount(dst.size(), part_bytes), 0) {}

  void Landed(uint64_t part, size_t bytes) {
    landed_[part] += bytes;
    while (hashed_ < dst_.size()) {
      const uint64_t at = hashed_ / part_bytes_;
      const uint64_t end = at * part_bytes_ + landed_[at];
      if (end <= hashed_) return;
      checksum_.Add(dst_.subspan(hashed_, end - hashed_));
      hashed_ = end;
    }
  }
  // Once every reply is in (and copied where it did not land in place).
  uint64_t Finish() {
    checksum_.Add(dst_.subspan(hashed_));
    hashed_ = dst_.size();
    return checksum_.Digest();
  }

 private:
  const std::span<const std::byte> dst_;
  const uint64_t part_bytes_;
  std::vector<uint64_t> landed_;  // bytes landed per part
  uint64_t hashed_ = 0;
  IncrementalPayloadChecksum checksum_;
};

// SCAN's COUNT: about how many keys Redis looks at per round.
constexpr uint64_t kScanCount = 1000;
// What one node's scan may take, from its key count (INFO keyspace). Redis ends a SCAN round once it has
// collected COUNT keys or walked 10 x COUNT buckets, and its table holds at most a few buckets per key (it
// shrinks below 10% fill, though not while a child process saves), so a whole scan takes about keys / COUNT
// rounds, a few times that when the table is that sparse: 16x, plus a slack for keys written while it runs,
// leaves room to spare. SCAN may return a key twice (while the table rehashes): twice the key count in names.
constexpr uint64_t kScanRoundsPerCount = 16;
constexpr uint64_t kScanRoundsSlack = 1024;
constexpr uint64_t kScanNamesSlack = uint64_t{1} << 20;
// Whatever a node says of its size, or when it does not say: 4 M rounds cover 4 billion keys at COUNT 1000, more
// than one Redis node holds. 4 M header names is more chunks than a node of a few TiB holds even at half a
// megabyte a chunk (256 tokens of a small model), and bounds what a caller collecting them (Verify, Evict) holds
// to about 100 MiB.
constexpr uint64_t kMaxScanRounds = uint64_t{1} << 22;
constexpr uint64_t kMaxScanNames = uint64_t{1} << 22;
// Header GETs per pipeline while scanning: one SCAN reply may carry up to a million names (RespParser's cap).
constexpr size_t kHeadersPerPipeline = 1000;
// Part names per DEL when a chunk is deleted (all in the chunk's slot, so one command each).
constexpr uint64_t kPartsPerDel = 1024;

struct ScanBudget {
  uint64_t rounds = 0;
  uint64_t names = 0;
};

// The keys in db0 from an INFO keyspace reply ("db0:keys=12,expires=0,..."); 0 when it has no db0 line (Redis
// leaves out empty databases).
uint64_t KeysInDb0(absl::string_view info) {
  for (absl::string_view line : absl::StrSplit(info, "\r\n")) {
    constexpr absl::string_view kDb0 = "db0:keys=";
    if (line.rfind(kDb0, 0) != 0) continue;
    line.remove_prefix(kDb0.size());
    uint64_t keys = 0;
    if (absl::SimpleAtoi(line.substr(0, line.find(',')), &keys)) return keys;
  }
  return 0;
}

}  // namespace

class RemoteTier::Impl {
 public:
  Impl(const Options& options, std::unique_ptr<RedisClusterClient> redis)
      : options_(options), redis_(std::move(redis)) {}

  static RedisCommand Cmd(std::string verb, std::string key) {
    RedisCommand c;
    c.verb = std::move(verb);
    c.key = std::move(key);
    return c;
  }

  // Deletes a chunk's header, then parts 0 .. parts-1, kPartsPerDel names to a DEL, one DEL after another. A
  // writer numbers its parts from 0 without gaps, so a DEL that finds none of its names is where they end (or
  // where Redis evicted a whole run of them, whose later parts it evicts in turn): a forged part count is never
  // walked past the parts that exist.
  absl::Status DeleteChunk(const RemoteChunkNames& names, uint64_t parts) {
    std::vector<RedisCommand> commands;
    commands.push_back(Cmd("DEL", names.header()));  // first: the chunk is gone for readers before its parts are
    for (uint64_t first = 0;; first += kPartsPerDel) {
      const uint64_t end = std::min(parts, first + kPartsPerDel);
      if (first < end) {
        RedisCommand del = Cmd("DEL", names.part(first));
        for (uint64_t i = first + 1; i < end; ++i) del.tail.push_back(names.part(i));
        commands.push_back(std::move(del));
      }
      CAKE_ASSIGN_OR_RETURN(const std::vector<RedisReply> replies, redis_->Execute(commands));
      const redisReply* deleted = replies.back().get();
      if (end >= parts || deleted->type != REDIS_REPLY_INTEGER || deleted->integer == 0) return absl::OkStatus();
      commands.clear();
    }
  }

  // The most parts a chunk this tier would store can have, cut into parts of part_bytes.
  uint64_t MaxParts(uint64_t part_bytes) const { return RemotePartCount(options_.max_chunk_bytes, part_bytes); }

  ScanBudget BudgetFor(RedisClusterClient::Node& node) {
    uint64_t keys = kMaxScanNames;  // a node that does not say: the ceilings alone
    auto info = redis_->RunOn(node, Cmd("INFO", "keyspace"));
    if (info.ok() && (*info)->type == REDIS_REPLY_STRING) {
      keys = KeysInDb0(absl::string_view((*info)->str, (*info)->len));
    }
    ScanBudget budget;
    budget.rounds = std::min(kMaxScanRounds, kScanRoundsSlack + kScanRoundsPerCount * (keys / kScanCount + 1));
    budget.names = std::min(kMaxScanNames, kScanNamesSlack + 2 * std::min(keys, kMaxScanNames));
    return budget;
  }

  struct ScanTally {
    uint64_t corrupt = 0;    // deleted
    uint64_t oversized = 0;  // claiming more than max_chunk_bytes
    uint64_t newer = 0;      // a format version this daemon does not know
    uint64_t cut_short = 0;  // nodes whose scan did not reach cursor 0
  };

  // Reads the headers named, each through the checks a load applies, and reports the ones that pass. False when
  // Redis failed (the scan of this node ends).
  bool ReportHeaders(const std::vector<std::string>& names, const std::function<void(const ChunkKey&, uint64_t)>& fn,
                     ScanTally& tally) {
    std::vector<RedisCommand> heads;
    std::vector<ChunkKey> chunk_keys;
    for (const std::string& name : names) {
      auto key = ChunkKeyFromRemoteName(options_.key_prefix, name);
      if (!key.ok()) continue;  // not one of ours
      chunk_keys.push_back(*key);
      heads.push_back(Cmd("GET", name));
    }
    if (heads.empty()) return true;
    auto values = redis_->Execute(heads);
    if (!values.ok()) return false;
    for (size_t i = 0; i < heads.size(); ++i) {
      const redisReply* v = (*values)[i].get();
      if (v->type != REDIS_REPLY_STRING) continue;  // removed meanwhile
      auto header = ParseRemoteHeader(std::string_view(v->str, v->len), chunk_keys[i]);
      if (header.status().code() == absl::StatusCode::kFailedPrecondition) {
        ++tally.newer;  // a newer writer's: not corrupt, not ours to delete
      } else if (!header.ok()) {
        // As a load would: the header goes, so the next scan or load does not meet it again.
        (void)DeleteChunk(RemoteChunkNames(options_.key_prefix, chunk_keys[i]), 0);
        corrupt_removed_++;
        ++tally.corrupt;
      } else if (header->payload_length > options_.max_chunk_bytes) {
        // No load of this daemon could ask for it, and no caller may size a buffer by it. Left in place: a daemon
        // allowed larger chunks may share this prefix (Redis's eviction takes it otherwise).
        ++tally.oversized;
      } else {
        fn(chunk_keys[i], header->payload_length);
      }
    }
    return true;
  }

  // One node's SCAN, within its budget; ends at the next round once interrupted.
  void ScanNode(RedisClusterClient::Node& node, const std::string& pattern,
                const std::function<void(const ChunkKey&, uint64_t)>& fn, ScanTally& tally) {
    const ScanBudget budget = BudgetFor(node);
    const auto deadline = std::chrono::steady_clock::now() + options_.scan_time_limit;
    std::string cursor = "0";
    uint64_t rounds = 0;
    uint64_t names = 0;
    do {
      const bool out_of_time = std::chrono::steady_clock::now() >= deadline;
      if (interrupted_.load() || rounds >= budget.rounds || names >= budget.names || out_of_time) {
        ++tally.cut_short;
        if (out_of_time && !interrupted_.load()) {
          spdlog::warn(
              "remote tier: a SCAN of Redis ran for remote.scan_timeout_s ({} s) after {} rounds and {} key names "
              "(a node that says it holds more than it does?); this scan stopped there",
              options_.scan_time_limit.count() / 1000, rounds, names);
        } else if (!interrupted_.load()) {
          spdlog::warn(
              "remote tier: a SCAN of Redis went past {} rounds or {} key names, more than a node of its "
              "size needs (its cursor never ends?); this scan stopped there",
              budget.rounds, budget.names);
        }
        return;
      }
      ++rounds;
      RedisCommand scan = Cmd("SCAN", cursor);
      scan.tail = {"MATCH", pattern, "COUNT", std::to_string(kScanCount)};
      auto reply = redis_->RunOn(node, scan);
      if (!reply.ok()) return;
      const redisReply* r = reply->get();
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
          r->element[1]->type != REDIS_REPLY_ARRAY) {
        return;
      }
      cursor = std::string(r->element[0]->str, r->element[0]->len);
      const redisReply* keys = r->element[1];
      std::vector<std::string> batch;
      for (size_t i = 0; i < keys->elements && names < budget.names; ++i) {
        const redisReply* name = keys->element[i];
        if (name->type != REDIS_REPLY_STRING) continue;
        ++names;
        batch.emplace_back(name->str, name->len);
        if (batch.size() == kHeadersPerPipeline) {
          if (interrupted_.load() || !ReportHeaders(batch, fn, tally)) return;
          batch.clear();
        }
      }
      if (!batch.empty() && !ReportHeaders(batch, fn, tally)) return;
    } while (cursor != "0");
  }

  const Options options_;
  const std::unique_ptr<RedisClusterClient> redis_;
  // Replies that say a command failed (the client counts the failures it sees itself).
  std::atomic<uint64_t> reply_errors_{0};
  std::atomic<uint64_t> corrupt_removed_{0};
  std::atomic<uint64_t> headers_skipped_{0};
  std::atomic<uint64_t> scans_cut_short_{0};
  std::atomic<bool> interrupted_{false};

  // Usage() cache.
  mutable std::mutex usage_mu_;
  TierUsage usage_;
  SteadyClock::time_point usage_at_{};
};

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Open(const Options& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("remote tier: no Redis endpoint configured");
  if (options.key_prefix.find_first_of("{}") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote key prefix '", options.key_prefix, "' must not contain '{' or '}' (Redis hash tags)"));
  }
  if (options.part_bytes < kMinRemotePartBytes || options.part_bytes > kMaxRemotePartBytes) {
    return absl::InvalidArgumentError(absl::StrCat("remote part_bytes must be from ", kMinRemotePartBytes,
                                                   " to 512 MiB (Redis's largest value); got ", options.part_bytes));
  }
  if (options.max_chunk_bytes == 0) return absl::InvalidArgumentError("remote max_chunk_bytes must be above 0");
  RedisClusterClient::Options client_options;
  client_options.endpoints = options.endpoints;
  client_options.user = options.user;
  client_options.password = options.password;
  client_options.connections = options.connections;
  client_options.connect_timeout = options.connect_timeout;
  client_options.command_timeout = options.command_timeout;
  client_options.max_backoff = options.max_backoff;
  client_options.log_name = "remote tier";
  auto redis = RedisClusterClient::Open(client_options);
  if (!redis.ok()) {
    if (redis.status().code() != absl::StatusCode::kInvalidArgument) return redis.status();
    return absl::InvalidArgumentError(absl::StrCat("remote ", redis.status().message()));
  }
  auto tier = std::unique_ptr<RemoteTier>(new RemoteTier(std::make_unique<Impl>(options, std::move(*redis))));
  const RedisClusterClient& client = *tier->impl_->redis_;
  if (client.counters().errors > 0) {
    spdlog::warn("remote tier: Redis at {} does not answer yet; lookups there are misses until it does",
                 options.endpoints.front());
  } else if (client.is_cluster()) {
    spdlog::info("remote tier: Redis Cluster with {} masters (seed {}), key prefix '{}', parts of {} bytes",
                 client.Masters().size(), options.endpoints.front(), options.key_prefix, options.part_bytes);
  } else {
    spdlog::info("remote tier: Redis at {}, key prefix '{}', parts of {} bytes", options.endpoints.front(),
                 options.key_prefix, options.part_bytes);
  }
  return tier;
}

RemoteTier::RemoteTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteTier::~RemoteTier() = default;

bool RemoteTier::Contains(const ChunkKey& key) const { return ContainsEach(std::span(&key, 1))[0]; }

std::vector<bool> RemoteTier::ContainsEach(std::span<const ChunkKey> keys) const {
  std::vector<bool> found(keys.size(), false);
  if (keys.empty()) return found;
  std::vector<RedisCommand> commands;
  commands.reserve(keys.size());
  for (const ChunkKey& key : keys) {
    commands.push_back(Impl::Cmd("EXISTS", RemoteChunkNames(impl_->options_.key_prefix, key).header()));
  }
  // An unreachable node holds nothing, as far as a lookup can tell.
  auto replies = impl_->redis_->Execute(commands, /*allow_partial=*/true);
  if (!replies.ok()) return found;
  for (size_t i = 0; i < keys.size(); ++i) {
    const redisReply* r = (*replies)[i].get();
    found[i] = r != nullptr && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
  }
  return found;
}

absl::Status RemoteTier::Read(const ChunkKey& key, std::span<std::byte> dst) {
  Impl& impl = *impl_;
  RedisClusterClient& redis = *impl.redis_;
  const RemoteChunkNames names(impl.options_.key_prefix, key);
  // The header and every part in one pipeline, assuming this daemon's part size; a value written with another
  // part size takes a second round.
  auto part_commands = [&](uint64_t part_bytes, LandingChecksum& checksum, std::vector<RedisCommand>& commands) {
    const uint64_t parts = RemotePartCount(dst.size(), part_bytes);
    for (uint64_t i = 0; i < parts; ++i) {
      RedisCommand get = Impl::Cmd("GET", names.part(i));
      const uint64_t offset = i * part_bytes;
      get.sink = dst.subspan(offset, std::min<uint64_t>(part_bytes, dst.size() - offset));
      get.on_landed = [&checksum, i](std::span<const std::byte> landed) { checksum.Landed(i, landed.size()); };
      commands.push_back(std::move(get));
    }
  };
  auto checksum = std::make_unique<LandingChecksum>(dst, impl.options_.part_bytes);
  std::vector<RedisCommand> commands;
  commands.push_back(Impl::Cmd("GET", names.header()));
  part_commands(impl.options_.part_bytes, *checksum, commands);
  auto replies = redis.Execute(commands);
  if (!replies.ok()) return replies.status();

  const redisReply* head = (*replies)[0].get();
  if (head->type == REDIS_REPLY_NIL) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in Redis"));
  if (head->type != REDIS_REPLY_STRING) {
    impl.reply_errors_++;
    return absl::UnavailableError(absl::StrCat("Redis answered GET with ", head->type == REDIS_REPLY_ERROR
                                                                               ? std::string(head->str, head->len)
                                                                               : "a reply that is not a value"));
  }
  auto corrupt = [&](const std::string& why, uint64_t parts) {
    (void)impl.DeleteChunk(names, parts);
    impl.corrupt_removed_++;
    return absl::DataLossError(absl::StrCat("remote chunk ", key.Hex(), ": ", why, "; removed"));
  };
  auto header = ParseRemoteHeader(std::string_view(head->str, head->len), key);
  if (header.status().code() == absl::StatusCode::kFailedPrecondition) return header.status();  // a newer writer's
  if (!header.ok()) return corrupt(std::string(header.status().message()), 0);
  if (header->payload_length != dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", key.Hex(), " holds ", header->payload_length,
                                                   " bytes; the destination has ", dst.size()));
  }
  if (header->part_bytes != impl.options_.part_bytes) {
    checksum = std::make_unique<LandingChecksum>(dst, header->part_bytes);
    std::vector<RedisCommand> again;
    again.push_back(Impl::Cmd("GET", names.header()));
    part_commands(header->part_bytes, *checksum, again);
    replies = redis.Execute(again);
    if (!replies.ok()) return replies.status();
  }
  for (uint32_t i = 0; i < header->parts; ++i) {
    const redisReply* part = (*replies)[i + 1].get();
    const uint64_t offset = uint64_t{i} * header->part_bytes;
    const uint64_t expected = std::min<uint64_t>(header->part_bytes, dst.size() - offset);
    if (part->type != REDIS_REPLY_STRING || static_cast<uint64_t>(part->len) != expected) {
      return corrupt(absl::StrCat("part ", i, " is missing or the wrong size (evicted by Redis?)"), header->parts);
    }
    if (part->str != nullptr) std::memcpy(dst.data() + offset, part->str, expected);  // else it landed in place
  }
  if (checksum->Finish() != header->payload_checksum) return corrupt("payload checksum mismatch", header->parts);
  return absl::OkStatus();
}

absl::Status RemoteTier::ReadValue(const ChunkKey& key, uint64_t max_bytes, std::vector<std::byte>& out) {
  // The header alone first, for the size; then Read's pipeline, which fetches it again with the parts and checks
  // it against this size (a chunk rewritten meanwhile with another size is a miss, never bytes). One round trip
  // more than Read: a caller that knows the size (a load) calls Read.
  Impl& impl = *impl_;
  const RemoteChunkNames names(impl.options_.key_prefix, key);
  std::vector<RedisCommand> get_header;
  get_header.push_back(Impl::Cmd("GET", names.header()));
  auto replies = impl.redis_->Execute(get_header);
  if (!replies.ok()) return replies.status();
  const redisReply* head = (*replies)[0].get();
  if (head->type == REDIS_REPLY_NIL) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in Redis"));
  if (head->type != REDIS_REPLY_STRING) return Read(key, {});  // Read says what Redis answered
  auto header = ParseRemoteHeader(std::string_view(head->str, head->len), key);
  if (!header.ok()) return Read(key, {});  // Read removes a corrupt header and says why
  if (header->payload_length > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", key.Hex(), " holds ", header->payload_length,
                                                   " bytes; at most ", max_bytes, " were expected"));
  }
  // The parts must be there before anything is allocated for them: a header that claims a large payload with no
  // parts behind it (a forger's, or one whose parts Redis evicted) costs a pipeline of STRLEN (at most
  // max_bytes / kMinRemotePartBytes commands), not a zero-filled buffer of the size it claims.
  std::vector<RedisCommand> lengths;
  lengths.reserve(header->parts);
  for (uint32_t i = 0; i < header->parts; ++i) lengths.push_back(Impl::Cmd("STRLEN", names.part(i)));
  auto sizes = impl.redis_->Execute(lengths);
  if (!sizes.ok()) return sizes.status();
  uint64_t present = 0;
  for (const auto& size : *sizes) {
    if (size != nullptr && size->type == REDIS_REPLY_INTEGER && size->integer > 0) {
      present += static_cast<uint64_t>(size->integer);
    }
  }
  if (present != header->payload_length) {
    (void)impl.DeleteChunk(names, header->parts);
    impl.corrupt_removed_++;
    return absl::DataLossError(absl::StrCat("remote chunk ", key.Hex(), ": its header claims ", header->payload_length,
                                            " bytes; its parts hold ", present, "; removed"));
  }
  out.resize(header->payload_length);
  return Read(key, out);
}

absl::Status RemoteTier::Write(const ChunkKey& key, std::span<const std::byte> src) {
  Impl& impl = *impl_;
  const RemoteChunkNames names(impl.options_.key_prefix, key);
  const uint64_t part_bytes = impl.options_.part_bytes;
  if (src.size() > impl.options_.max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a chunk of ", src.size(), " bytes exceeds the remote tier's ",
                                                     impl.options_.max_chunk_bytes, "-byte max_chunk_bytes"));
  }
  std::vector<std::string> expiry;
  if (impl.options_.ttl.count() > 0) expiry = {"EX", std::to_string(impl.options_.ttl.count())};

  const RemoteHeader header = MakeRemoteHeader(key, src, part_bytes);
  const std::string encoded = EncodeRemoteHeader(header);

  std::vector<RedisCommand> commands;
  for (uint32_t i = 0; i < header.parts; ++i) {
    RedisCommand c = Impl::Cmd("SET", names.part(i));
    const uint64_t offset = uint64_t{i} * part_bytes;
    c.value = src.subspan(offset, std::min<uint64_t>(part_bytes, src.size() - offset));
    c.has_value = true;
    c.tail = expiry;
    commands.push_back(std::move(c));
  }
  // The header last: a reader that sees it sees every part written before it.
  RedisCommand head = Impl::Cmd("SET", names.header());
  head.value = std::as_bytes(std::span(encoded));
  head.has_value = true;
  head.tail = expiry;
  commands.push_back(std::move(head));

  CAKE_ASSIGN_OR_RETURN(const std::vector<RedisReply> replies, impl.redis_->Execute(commands));
  for (const RedisReply& r : replies) {
    if (r->type == REDIS_REPLY_STATUS) continue;
    const std::string why = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "an unexpected reply";
    impl.reply_errors_++;
    if (why.rfind("OOM", 0) == 0) {
      return absl::ResourceExhaustedError(absl::StrCat("Redis is full (maxmemory reached, noeviction?): ", why));
    }
    return absl::UnavailableError(absl::StrCat("Redis refused a write: ", why));
  }
  return absl::OkStatus();
}

absl::Status RemoteTier::Remove(const ChunkKey& key) {
  Impl& impl = *impl_;
  const RemoteChunkNames names(impl.options_.key_prefix, key);
  CAKE_ASSIGN_OR_RETURN(const std::vector<RedisReply> replies,
                        impl.redis_->Execute({Impl::Cmd("GET", names.header())}));
  const redisReply* head = replies[0].get();
  if (head->type == REDIS_REPLY_NIL) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in Redis"));
  // A header that does not parse names no parts worth believing (a load deletes it alone too); one that claims
  // more than a chunk of max_chunk_bytes has is believed only that far.
  uint64_t parts = 0;
  if (head->type == REDIS_REPLY_STRING) {
    auto header = ParseRemoteHeader(std::string_view(head->str, head->len), key);
    if (header.ok()) parts = std::min<uint64_t>(header->parts, impl.MaxParts(header->part_bytes));
  }
  return impl.DeleteChunk(names, parts);
}

TierUsage RemoteTier::Usage() const {
  Impl& impl = *impl_;
  std::lock_guard lock(impl.usage_mu_);
  const auto now = SteadyClock::now();
  if (impl.usage_at_ != SteadyClock::time_point{} && now - impl.usage_at_ < std::chrono::seconds(1)) {
    return impl.usage_;
  }
  TierUsage usage;
  for (RedisClusterClient::Node* node : impl.redis_->Masters()) {
    auto reply = impl.redis_->RunOn(*node, Impl::Cmd("INFO", "memory"));
    if (!reply.ok() || (*reply)->type != REDIS_REPLY_STRING) continue;
    for (absl::string_view line : absl::StrSplit(absl::string_view((*reply)->str, (*reply)->len), "\r\n")) {
      uint64_t value = 0;
      if (line.rfind("used_memory:", 0) == 0 && absl::SimpleAtoi(line.substr(12), &value)) usage.used_bytes += value;
      if (line.rfind("maxmemory:", 0) == 0 && absl::SimpleAtoi(line.substr(10), &value)) usage.capacity_bytes += value;
    }
  }
  impl.usage_ = usage;
  impl.usage_at_ = now;
  return usage;
}

void RemoteTier::ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const {
  Impl& impl = *impl_;
  const std::string pattern = RemoteHeaderPattern(impl.options_.key_prefix);
  Impl::ScanTally tally;
  for (RedisClusterClient::Node* node : impl.redis_->Masters()) {
    if (impl.interrupted_.load()) {
      ++tally.cut_short;
      break;
    }
    impl.ScanNode(*node, pattern, fn, tally);
  }
  const uint64_t skipped = tally.corrupt + tally.oversized + tally.newer;
  impl.headers_skipped_ += skipped;
  impl.scans_cut_short_ += tally.cut_short;
  if (skipped > 0) {
    spdlog::warn(
        "remote tier: a scan skipped {} chunk headers: {} corrupt (removed), {} claiming more than "
        "max_chunk_bytes ({}), {} of a newer format (both left in place)",
        skipped, tally.corrupt, tally.oversized, impl.options_.max_chunk_bytes, tally.newer);
  }
  if (impl.interrupted_.load() && tally.cut_short > 0) spdlog::info("remote tier: a scan ended early: stopping");
}

void RemoteTier::Interrupt() { impl_->interrupted_ = true; }

RemoteTier::Counters RemoteTier::counters() const {
  const RedisClusterClient::Counters redis = impl_->redis_->counters();
  Counters s;
  s.errors = redis.errors + impl_->reply_errors_.load();
  s.connects = redis.connects;
  s.fast_failures = redis.fast_failures;
  s.moved = redis.moved;
  s.ask = redis.ask;
  s.redirects_refused = redis.redirects_refused;
  s.corrupt_removed = impl_->corrupt_removed_.load();
  s.headers_skipped = impl_->headers_skipped_.load();
  s.scans_cut_short = impl_->scans_cut_short_.load();
  return s;
}

TierStats RemoteTier::Stats() const {
  const Counters c = counters();
  TierStats stats;
  stats.corrupt_removed = c.corrupt_removed;
  stats.own = {{"errors", c.errors},
               {"connects", c.connects},
               {"fast_failures", c.fast_failures},
               {"moved", c.moved},
               {"ask", c.ask},
               {"redirects_refused", c.redirects_refused},
               {"headers_skipped", c.headers_skipped},
               {"scans_cut_short", c.scans_cut_short}};
  return stats;
}

bool RemoteTier::is_cluster() const { return impl_->redis_->is_cluster(); }

uint32_t RemoteTier::masters() const {
  const RedisClusterClient& client = *impl_->redis_;
  if (client.is_cluster()) return static_cast<uint32_t>(client.Masters().size());
  return client.counters().errors > 0 ? 0 : 1;
}

}  // namespace cake
