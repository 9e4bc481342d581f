// caked's configuration, the values: every setting with its default (one field per key of server/config/
// config_keys.cc's table, which names it in the file and on the command line). Reading, writing and checking
// them is config.h's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/arbiter_policy.h"
#include "storage/chunk_codec.h"
#include "storage/io/io_backend.h"

namespace cake {

// One [[access.principal]] of the config: who a caller is (how the daemon recognises it) and what it may do.
struct PrincipalConfig {
  std::string name;
  std::vector<uint32_t> unix_uids;          // peers on the unix socket with one of these uids (SO_PEERCRED)
  std::vector<std::string> unix_users;      // the same, by user name (resolved at start-up)
  std::vector<std::string> tls_identities;  // TCP: a client certificate whose SAN (DNS or URI) or CN is one of these
  std::string token_file;                   // TCP: a bearer token, read from this file (owner-only permissions)
  std::vector<std::string> tenants;         // tenants its requests may name; "*": any. The first is its default
  std::vector<std::string> roles;           // engine, monitor, admin
};

struct DaemonConfig {
  // [server]
  std::string run_dir;          // holds the socket; default: /run/cake as root, else $XDG_RUNTIME_DIR/cake
  std::string socket;           // default: <run_dir>/caked.sock
  uint32_t socket_mode = 0660;  // engines in the socket's group may connect
  // The largest gRPC message, either way: an inline Store's chunks, an inline load's chunk.
  uint64_t max_message_bytes = uint64_t{256} << 20;
  // What gRPC's transport may hold for all connections together (its resource quota). gRPC reads a message whole
  // before it compares it with max_message_bytes, so this, not that, bounds what oversized messages cost.
  uint64_t transport_memory_bytes = uint64_t{1} << 30;
  double shutdown_grace_s = 5;
  std::string log_level = "info";  // checked by ValidateConfig; spdlog parses it once, at start-up
  // Connections served at once (unix and TCP together) and per peer (a uid on the socket, an address on TCP): one
  // past either is closed at accept, so nobody can use up the daemon's descriptors or crowd out other peers. The
  // total is also held below the descriptor limit caked starts with (see docs/operations.md).
  uint32_t max_connections = 1024;
  uint32_t max_connections_per_peer = 64;
  // A connection with no call running for this long is closed (the client reconnects when it next calls). Long:
  // gRPC's synchronous C++ client notices the close up to 5 s late, and a call in that window fails once.
  uint32_t connection_idle_timeout_ms = 600000;
  // Calls open at once on one connection: twice limits.max_concurrent_loads, so one engine channel can carry every
  // load the daemon runs beside its lookups and stores.
  uint32_t max_streams_per_connection = 512;
  // Health Watch streams (grpc.health.v1.Health/Watch, which anyone who reaches a listener may open) served at once
  // and per peer (as for connections); one past either is refused with RESOURCE_EXHAUSTED. Check has no cap.
  uint32_t max_health_watches = 256;
  uint32_t max_health_watches_per_peer = 8;
  // [tcp] engines on other hosts: TLS, inline bytes only. Empty listen: no TCP listener.
  std::string tcp_listen;          // "host:port"
  std::string tls_cert_file;       // the daemon's certificate chain (PEM)
  std::string tls_key_file;        // its private key (PEM; owner-only permissions)
  std::string tls_client_ca_file;  // set: clients must present a certificate this CA signed (mTLS)
  uint32_t tls_reload_s = 60;      // how often the certificate files are re-read (rotation without restart)
  // A TCP connection on which no call has named a principal by then is closed (a stranger's connections hold room
  // meant for engines; every call on TCP is identified on its headers, so an engine's first call proves it at once).
  uint32_t tcp_identify_timeout_ms = 10000;
  uint32_t handshake_timeout_ms = 5000;  // a connection that has not finished its handshake (TLS, HTTP/2) is closed
  bool tcp_allow_plaintext_loopback = false;  // tests and local tools: plaintext TCP, on a loopback address only
  // [metrics] the Prometheus endpoint. Empty listen: none. It answers anyone who can reach it, so it listens on
  // loopback unless the operator names another address.
  std::string metrics_listen;                  // "host:port", e.g. "127.0.0.1:9464"; port 0: any free port
  uint32_t metrics_max_namespace_series = 64;  // (tenant, model) label pairs; past it, loads count as "other"
  // [access] who may do what. No principals: one trusted user (every peer on the socket may do everything).
  std::vector<PrincipalConfig> principals;
  // Says single-user mode (no principals) is meant: a reload that drops every principal is refused without it.
  bool access_single_user = false;
  // [limits]
  uint64_t max_prompt_tokens = 1u << 20;
  uint64_t max_chunk_bytes = uint64_t{1} << 30;
  uint64_t min_chunk_bytes = 4096;  // a page: what a chunk costs every tier at the least
  uint32_t max_chunk_tokens = 1u << 16;
  uint32_t default_chunk_tokens = 256;
  uint64_t max_region_bytes = uint64_t{64} << 30;
  uint32_t max_regions_per_client = 64;
  uint32_t max_regions = 1024;                            // all clients together
  uint64_t max_total_region_bytes = uint64_t{512} << 30;  // all clients together
  // One principal's regions together; 0: three quarters of max_total_region_bytes (every principal's client ids
  // are its own to pick, so only a per-principal bound keeps one from taking every region byte).
  uint64_t max_region_bytes_per_principal = 0;
  uint32_t max_concurrent_loads = 256;
  // Of those, what one principal (in single-user mode: one local uid) and one client of a principal may run at
  // once, so no caller can hold every slot by keeping its loads alive. Above max_concurrent_loads: no finer cap.
  uint32_t max_concurrent_loads_per_principal = 192;
  uint32_t max_concurrent_loads_per_client = 128;
  // A region lives this long after its owner last named it (RenewRegion, Load, Store); then, once no load uses
  // it, it is released: a client that died or hangs cannot hold its memory forever.
  uint32_t region_lease_ms = 30000;
  // [dram]
  uint64_t dram_capacity_bytes = uint64_t{4} << 30;
  double dram_read_gbps = 0;         // 0: not throttled
  double dram_read_burst_us = 1000;  // what an idle throttled tier lets through at once; 0: one read after another
  bool dram_prefault = false;        // touch the whole tier at start-up, so no copy into it ever faults
  uint64_t dram_promotion_queue_bytes = uint64_t{256} << 20;  // chunks read from disk waiting to be copied in
  // [disk]
  std::string disk_root;  // empty: no disk tier
  uint64_t disk_capacity_bytes = uint64_t{64} << 30;
  uint32_t disk_queue_depth = 32;
  IoBackend disk_io_backend = IoBackend::kAuto;
  bool disk_allow_buffered = false;           // accept a filesystem without O_DIRECT (page cache in the way)
  double disk_read_gbps = 0;                  // 0: not throttled
  uint32_t disk_recovery_threads = 32;        // header reads in flight while the index is rebuilt after a crash
  uint32_t disk_index_checkpoint_ms = 60000;  // the index also written this often while chunks arrive; 0: at stop only
  ChunkCodec disk_codec = ChunkCodec::kNone;  // how chunks are stored: none or planes-zstd (storage/chunk_codec.h)
  // [remote] Redis (standalone or cluster), shared by daemons on many machines
  std::vector<std::string> remote_endpoints;  // "host:port"; empty: no remote tier
  std::string remote_user;                    // ACL user (empty: AUTH with the password alone)
  std::string remote_password;                // also from $CAKE_REMOTE_PASSWORD, which wins
  std::string remote_password_file;           // or from this file (owner-only permissions): not in the config
  std::string remote_key_prefix = "cake:";
  uint64_t remote_part_bytes = uint64_t{4} << 20;
  uint32_t remote_connections = 8;  // idle connections kept per Redis node
  // Threads that read chunks from Redis, one chunk each at a time; 0: chosen at start-up (RemoteReadThreads).
  uint32_t remote_read_threads = 0;
  uint32_t remote_connect_timeout_ms = 500;
  uint32_t remote_command_timeout_ms = 2000;
  uint64_t remote_ttl_s = 0;                    // 0: keys do not expire (Redis's maxmemory policy evicts)
  uint32_t remote_scan_timeout_s = 120;         // one node's scan (Verify, Evict) runs at most this long
  double remote_read_gbps = 0;                  // 0: not throttled
  ChunkCodec remote_codec = ChunkCodec::kNone;  // how chunks are stored: none or planes-zstd (storage/chunk_codec.h)
  bool remote_promote_to_disk = false;          // a remote hit is also copied onto the local disk tier
  // [cuda] device regions through CUDA IPC, where the build has CUDA and a device answers
  bool cuda_enabled = true;
  std::vector<int> cuda_devices;  // ordinals engines may ask for; empty: every visible device
  uint64_t cuda_max_region_bytes = uint64_t{64} << 30;
  // Page-lock the DRAM tier at start-up (it commits the whole tier), so DRAM hits reach device regions in one DMA.
  bool cuda_pin_dram = true;
  // [writeback]
  uint64_t write_back_queue_bytes = uint64_t{1} << 30;
  uint32_t write_back_threads = 4;  // chunks written back at once
  // [loader]
  uint32_t load_window = 4;  // reads in flight per load
  // A load whose client neither sends a message nor reads one for this long is ended (DEADLINE_EXCEEDED), so a
  // silent or vanished engine gives back its slot, window and unread bytes.
  uint32_t load_idle_timeout_ms = 60000;
  // A Load stream that has sent no Start for this long is ended (DEADLINE_EXCEEDED). The Python client opens one
  // stream ahead of its next load and retires it after 20 s unused: keep this above that.
  uint32_t load_start_timeout_ms = 60000;
  // Load streams open without a Start, in all and per principal (each costs gRPC's call state, about 19 KB).
  uint32_t max_unstarted_streams = 1024;
  uint32_t max_unstarted_streams_per_principal = 256;
  // Chunk bytes all inline loads together may hold, read and not yet handed to gRPC; past it, their reads wait.
  uint64_t max_inline_bytes = uint64_t{512} << 20;
  // Of that, what one principal's inline loads may hold, so one caller that reads slowly cannot make every other
  // caller's inline loads wait. Past it, that principal's reads wait (nothing is refused).
  uint64_t max_inline_bytes_per_principal = uint64_t{384} << 20;
  uint32_t max_load_window = 64;
  uint32_t io_threads = 4;
  ArbiterPolicy arbiter = ArbiterPolicy::kShortestRemaining;
  uint32_t arbiter_starvation_ms = 1000;  // srf: a read queued this long goes first
  // [prefetch] chunks copied into DRAM ahead of a load (LookupRequest.prefetch)
  bool prefetch_enabled = true;
  uint64_t prefetch_max_bytes = uint64_t{256} << 20;  // queued, being copied, or copied and not yet loaded
  uint32_t prefetch_reads_in_flight = 1;              // copies at once, on idle I/O threads only
  uint32_t prefetch_ttl_ms = 30000;                   // a prefetched chunk no load used by then counts as wasted
  // [keys]
  std::string key_secret;  // mixed into every key root; daemons that share a store must share it

  std::string socket_path() const;
  // The remote tier's read threads, given the masters its Redis had at start-up (0: it did not answer). Unset:
  // one per master, since a redis-server answers one command at a time and more reads than masters only queue
  // there while they take the daemon's cores (section 30 of docs/benchmarks.md: 3 threads on a 3-master cluster
  // did as well as 4 or better in every invocation); at least two, so a server never waits a round trip between one
  // chunk and the next; at most loader.io_threads. With no answer at start, loader.io_threads.
  uint32_t RemoteReadThreads(uint32_t masters_at_start) const {
    if (remote_read_threads != 0) return remote_read_threads;
    if (masters_at_start == 0) return io_threads;
    return std::min(io_threads, std::max(2u, masters_at_start));
  }
};

}  // namespace cake
