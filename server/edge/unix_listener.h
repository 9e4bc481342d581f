// The daemon's unix socket, accepted by the daemon itself rather than by gRPC: gRPC does not tell a handler who
// is on the other end of a unix connection, so each accepted connection's peer credentials (SO_PEERCRED: the
// kernel's word, not the client's) are recorded before the connection is handed to gRPC. A handler finds them
// by the connection's descriptor, which gRPC names in the call's peer ("fd:N").
#pragma once

#include <sys/types.h>
#include <sys/un.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "base/unique_fd.h"
#include "server/edge/connection_gate.h"

namespace grpc {
class Server;
}

namespace cake {

// The address of a unix socket at `path`: INVALID_ARGUMENT when the path does not fit sun_path (107 bytes).
absl::StatusOr<sockaddr_un> UnixSocketAddress(const std::string& path);

struct UnixPeer {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};

class UnixListener {
 public:
  // Binds and listens on `path` (which must not exist) with `mode`. Accepting starts with Serve.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(const std::string& path, uint32_t mode);
  ~UnixListener();

  // Whether a peer of this uid may connect at all (the access policy names it), asked afresh for every connection.
  using UidAdmission = std::function<bool(uid_t)>;
  // Accepts on a thread of its own, handing every connection `gate` admits (all, when null) to `server` (built with
  // no listening port). Peers are counted per uid. A connection from a uid `may_connect` refuses is closed at
  // accept, before gRPC reads anything from it: a caller no principal names cannot make the daemon buffer a single
  // message.
  void Serve(grpc::Server* server, ConnectionGate* gate = nullptr, UidAdmission may_connect = nullptr);
  // Stops accepting and joins the thread; connections already handed over stay gRPC's. Idempotent.
  void Stop();

  // The peer of the connection a call arrived on, from the call's gRPC peer string ("fd:N"); nullopt when it
  // names no connection this listener accepted (or the descriptor now is some other file).
  std::optional<UnixPeer> PeerOf(std::string_view grpc_peer) const;

  uint64_t accepted() const;
  // Connections closed at accept because `may_connect` refused their uid.
  uint64_t refused_unnamed() const { return refused_unnamed_.load(std::memory_order_relaxed); }

 private:
  UnixListener() = default;
  void AcceptLoop(grpc::Server* server, ConnectionGate* gate, const UidAdmission& may_connect);
  // Closes `fd`, counts it, and warns at most every 10 s naming the uid and what the operator can do.
  void RefuseUnnamed(int fd, uid_t uid);

  struct Connection {
    UnixPeer peer;
    dev_t device;
    ino_t inode;  // what the descriptor was at accept: a reused number names another file
  };
  UniqueFd listen_fd_;
  UniqueFd stop_fd_;  // an eventfd: written to wake the accept loop
  std::thread thread_;
  mutable Mutex mu_;
  // By descriptor. gRPC closes a connection's descriptor only after its last call is gone, so while a call runs
  // its entry is its own; a later connection on the same number replaces the entry.
  absl::flat_hash_map<int, Connection> connections_ ABSL_GUARDED_BY(mu_);
  uint64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> refused_unnamed_{0};
  std::chrono::steady_clock::time_point last_refusal_warning_;  // accept thread only
};

}  // namespace cake
