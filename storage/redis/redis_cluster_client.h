// RedisClusterClient: single-key commands to one standalone Redis or a Redis Cluster. hiredis connects; the
// commands are written and the replies read by RunExchanges (socket_engine.h), every node of a call at once from
// the calling thread's io_uring, values sent from and received into the caller's buffers. Whether it
// is a cluster is detected (CLUSTER SLOTS); the slot map comes from any seed that answers and is kept current by
// following MOVED (the map refreshed) and ASK (that one command re-sent to the target after ASKING), and by asking
// the nodes that are up for it again whenever a node fails a call (a dead master sends no MOVED; once its replica is
// promoted, the others' maps name it). Each node
// has a pool of idle connections, and a node that fails backs off: calls to it fail at once for a while, so a
// dead server costs a caller nothing but a status. It knows nothing of what the values mean.
//
// Also RedisKeySlot, the one implementation of Redis Cluster's key-to-slot hash in the project.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/redis/resp_reader.h"

namespace cake {

inline constexpr int kRedisClusterSlots = 16384;

// The Redis Cluster slot of a key: CRC16-XMODEM of the key (or of its first non-empty {hash tag}) modulo 16384.
int RedisKeySlot(std::string_view key);

// One single-key command. Arguments are built when it is sent, so a value is never copied before hiredis formats
// it: verb, key, value (when has_value), then tail.
struct RedisCommand {
  std::string verb;
  std::string key;  // the first argument; Execute sends the command to the node that owns this key's slot
  std::span<const std::byte> value;
  bool has_value = false;
  std::vector<std::string> tail;
  // For a GET whose value should land straight in the caller's buffer: a bulk reply of exactly this size is
  // received into it (the reply: a string with len set and str null); any other reply is returned as usual.
  std::span<std::byte> sink;
  // When set, told of the value's bytes as they land in sink (in order), while later bytes are still arriving.
  SinkProgress on_landed;
};

class RedisClusterClient {
 public:
  struct Options {
    // "host:port" of a standalone Redis, or seeds of a Redis Cluster (any reachable node will do).
    std::vector<std::string> endpoints;
    std::string user;  // ACL user; empty: AUTH with the password alone (or no AUTH without one)
    std::string password;
    // Idle connections kept per node; each concurrent call uses one of its own.
    uint32_t connections = 8;
    std::chrono::milliseconds connect_timeout{500};
    // A call fails on a node that moves no byte, either way, for this long.
    std::chrono::milliseconds command_timeout{2000};
    // After a node fails, calls to it fail fast for a while, doubling from 50 ms up to this.
    std::chrono::milliseconds max_backoff{2000};
    // Sends and receives through the calling thread's io_uring (poll(2) when false, or when the kernel refuses
    // a ring): every node a call touches is in flight at once either way.
    bool use_io_uring = true;
    // Names the user of this client in its log lines ("remote tier: Redis at ... failed").
    std::string log_name = "redis client";
  };

  struct Counters {
    uint64_t errors = 0;         // a connection or command failed (timeouts included), or redirects looped
    uint64_t connects = 0;       // connections opened
    uint64_t fast_failures = 0;  // calls refused at once because their node was backing off
    uint64_t moved = 0;          // MOVED redirects followed (the slot map was refreshed)
    uint64_t ask = 0;            // ASK redirects followed (a slot being migrated)
    // Redirects to a node neither the seeds nor the cluster's own slot map named: not followed (no connection,
    // no AUTH); the slot map is asked again instead.
    uint64_t redirects_refused = 0;
  };
  // The most nodes a client keeps (seeds and the slot map's masters): Redis Cluster's own recommended ceiling.
  static constexpr size_t kMaxNodes = 1000;

  // One Redis server: its connection pool and back-off. Owned by the client, alive as long as it is.
  struct Node;

  // Checks the options and asks the seeds for a slot map; does not need Redis to be up (calls fail until it is).
  // INVALID_ARGUMENT: no endpoint, one that is not host:port, no connections, a timeout of 0.
  static absl::StatusOr<std::unique_ptr<RedisClusterClient>> Open(const Options& options);
  ~RedisClusterClient();
  RedisClusterClient(const RedisClusterClient&) = delete;
  RedisClusterClient& operator=(const RedisClusterClient&) = delete;

  // Runs the commands, each on the node owning its key's slot, pipelined per node, following MOVED and ASK
  // redirects to nodes the seeds or the slot map named (a redirect elsewhere is refused and the map refreshed). One
  // reply per command, in order; error replies other than redirects are replies. UNAVAILABLE when a node cannot be
  // reached or redirects loop; with allow_partial, the commands of a node that cannot be reached get a null reply
  // instead and the others still run.
  absl::StatusOr<std::vector<RedisReply>> Execute(const std::vector<RedisCommand>& commands,
                                                  bool allow_partial = false);

  // The nodes that own slots (the seed, when not a cluster): for commands that go to every node, like SCAN.
  std::vector<Node*> Masters() const;
  // Runs one command on that node, wherever its key's slot is (no redirects followed).
  absl::StatusOr<RedisReply> RunOn(Node& node, const RedisCommand& command);

  Counters counters() const;
  // True once a node answered CLUSTER SLOTS with a slot map.
  bool is_cluster() const;

  class Impl;

 private:
  explicit RedisClusterClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cake
