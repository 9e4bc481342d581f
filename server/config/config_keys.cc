#include "server/config/config_keys.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "server/config/daemon_config.h"

namespace cake {
namespace {

// The field `member` of a DaemonConfig, as a ConfigField.
#define CAKE_FIELD(member)         \
  +[](DaemonConfig & c) -> auto& { \
    return c.member;               \
  }

constexpr double kU32 = UINT32_MAX;
constexpr double Pow2(int bits) { return static_cast<double>(uint64_t{1} << bits); }

// clang-format off
const ConfigKey kKeys[] = {
    {"server", "run_dir", CAKE_FIELD(run_dir), 0, 0, "--run-dir", "folder of the socket (default /run/cake as root, else $XDG_RUNTIME_DIR/cake)"},
    {"server", "socket", CAKE_FIELD(socket), 0, 0, "--socket", "unix socket path (default <run_dir>/caked.sock)"},
    {"server", "socket_mode", CAKE_FIELD(socket_mode), 0, 0777, "", "the socket's mode: engines in its group may connect"},
    {"server", "max_message_bytes", CAKE_FIELD(max_message_bytes), Pow2(20), INT32_MAX, "", "largest gRPC message (an inline load's chunk; an inline Store's batch)"},
    {"server", "transport_memory_bytes", CAKE_FIELD(transport_memory_bytes), Pow2(21), Pow2(40), "", "what gRPC may buffer for all connections (its resource quota); at least twice max_message_bytes"},
    {"server", "shutdown_grace_s", CAKE_FIELD(shutdown_grace_s), 0, 3600, "", "on SIGTERM: how long running calls may take to finish"},
    {"server", "log_level", CAKE_FIELD(log_level), 0, 0, "--log-level", "trace, debug, info, warn, error, critical, off"},
    {"server", "max_connections", CAKE_FIELD(max_connections), 1, Pow2(20), "", "connections served at once, unix and TCP together; more are closed at accept"},
    {"server", "max_connections_per_peer", CAKE_FIELD(max_connections_per_peer), 1, Pow2(20), "", "connections per uid on the socket, per address on TCP"},
    {"server", "connection_idle_timeout_ms", CAKE_FIELD(connection_idle_timeout_ms), 100, 86400000, "", "a connection with no call running this long is closed"},
    {"server", "max_streams_per_connection", CAKE_FIELD(max_streams_per_connection), 1, Pow2(16), "", "calls open at once on one connection"},
    {"server", "max_health_watches", CAKE_FIELD(max_health_watches), 1, Pow2(20), "", "health Watch streams open at once"},
    {"server", "max_health_watches_per_peer", CAKE_FIELD(max_health_watches_per_peer), 1, Pow2(20), "", "health Watch streams per uid on the socket, per address on TCP"},
    {"tcp", "listen", CAKE_FIELD(tcp_listen), 0, 0, "", "host:port of the TCP listener for engines on other hosts; unset: none"},
    {"tcp", "tls_cert_file", CAKE_FIELD(tls_cert_file), 0, 0, "", "the daemon's certificate chain (PEM)"},
    {"tcp", "tls_key_file", CAKE_FIELD(tls_key_file), 0, 0, "", "its private key (PEM; owner-only)"},
    {"tcp", "tls_client_ca_file", CAKE_FIELD(tls_client_ca_file), 0, 0, "", "set: clients present a certificate this CA signed (mTLS)"},
    {"tcp", "tls_reload_s", CAKE_FIELD(tls_reload_s), 1, 86400, "", "how often the certificate files are re-read"},
    {"tcp", "handshake_timeout_ms", CAKE_FIELD(handshake_timeout_ms), 100, 600000, "", "a connection that has not finished its TLS and HTTP/2 handshake by then is closed"},
    {"tcp", "identify_timeout_ms", CAKE_FIELD(tcp_identify_timeout_ms), 100, 600000, "", "a TCP connection on which no call has named a principal by then is closed"},
    {"tcp", "allow_plaintext_loopback", CAKE_FIELD(tcp_allow_plaintext_loopback), 0, 0, "", "plaintext TCP, on a loopback address only (tests, sidecars)"},
    {"metrics", "listen", CAKE_FIELD(metrics_listen), 0, 0, "--metrics-listen", "serve Prometheus metrics on host:port, e.g. 127.0.0.1:9464; unset: none"},
    {"metrics", "max_namespace_series", CAKE_FIELD(metrics_max_namespace_series), 1, 100000, "", "(tenant, model) label pairs with series of their own; the rest count as \"other\""},
    {"access", "single_user", CAKE_FIELD(access_single_user), 0, 0, "", "says that no principals (everyone on the socket may do everything) is meant"},
    {"limits", "max_prompt_tokens", CAKE_FIELD(max_prompt_tokens), 1, Pow2(32), "", "longer prompts are refused"},
    {"limits", "max_chunk_bytes", CAKE_FIELD(max_chunk_bytes), 1, Pow2(40), "", "namespaces whose chunks would be larger are refused"},
    {"limits", "min_chunk_bytes", CAKE_FIELD(min_chunk_bytes), 1, Pow2(30), "", "... or smaller (a chunk costs every tier a page at the least)"},
    {"limits", "max_chunk_tokens", CAKE_FIELD(max_chunk_tokens), 1, kU32, "", "the most tokens a namespace's chunk may hold"},
    {"limits", "default_chunk_tokens", CAKE_FIELD(default_chunk_tokens), 1, kU32, "", "for namespaces that leave chunk_tokens at 0"},
    {"limits", "max_region_bytes", CAKE_FIELD(max_region_bytes), 1, Pow2(50), "", "the largest region"},
    {"limits", "max_regions_per_client", CAKE_FIELD(max_regions_per_client), 1, kU32, "", "regions one client id may hold"},
    {"limits", "max_regions", CAKE_FIELD(max_regions), 1, kU32, "", "regions, all clients together"},
    {"limits", "max_total_region_bytes", CAKE_FIELD(max_total_region_bytes), 1, Pow2(56), "", "region bytes, all clients together"},
    {"limits", "max_region_bytes_per_principal", CAKE_FIELD(max_region_bytes_per_principal), 0, Pow2(56), "", "of those, one principal's; 0: three quarters of them"},
    {"limits", "max_concurrent_loads", CAKE_FIELD(max_concurrent_loads), 1, Pow2(20), "", "loads at once; more get RESOURCE_EXHAUSTED"},
    {"limits", "max_concurrent_loads_per_principal", CAKE_FIELD(max_concurrent_loads_per_principal), 1, Pow2(20), "", "of those, one principal's (single-user mode: one local uid's)"},
    {"limits", "max_concurrent_loads_per_client", CAKE_FIELD(max_concurrent_loads_per_client), 1, Pow2(20), "", "of those, one client id's within its principal"},
    {"limits", "region_lease_ms", CAKE_FIELD(region_lease_ms), 100, 86400000, "", "a region its owner has not named for this long, and no load uses, is released"},
    {"dram", "capacity_bytes", CAKE_FIELD(dram_capacity_bytes), 1, Pow2(50), "--dram-capacity-mib", "DRAM tier size (the flag in MiB)", 20},
    {"dram", "read_gbps", CAKE_FIELD(dram_read_gbps), 0, 1e6, "--dram-read-gbps", "cap DRAM-tier reads at this many Gbit/s, for experiments; 0: none"},
    {"dram", "read_burst_us", CAKE_FIELD(dram_read_burst_us), 0, 1e6, "--dram-read-burst-us", "under a read cap, what an idle tier lets through at once, in microseconds of its rate; 0: one read after another"},
    {"dram", "prefault", CAKE_FIELD(dram_prefault), 0, 0, "--dram-prefault", "touch the whole DRAM tier at start-up"},
    {"dram", "promotion_queue_bytes", CAKE_FIELD(dram_promotion_queue_bytes), 0, Pow2(44), "", "chunks read from slower tiers waiting to be copied into DRAM; beyond, skipped"},
    {"disk", "root", CAKE_FIELD(disk_root), 0, 0, "--disk-root", "folder of the disk tier; setting it enables the tier"},
    {"disk", "capacity_bytes", CAKE_FIELD(disk_capacity_bytes), 1, Pow2(56), "--disk-capacity-mib", "disk tier size, chunk payload bytes (the flag in MiB)", 20},
    {"disk", "queue_depth", CAKE_FIELD(disk_queue_depth), 1, 4096, "", "reads in flight per reader"},
    {"disk", "io_backend", CAKE_FIELD(disk_io_backend), 0, 0, "--disk-io-backend", "auto (io_uring, else pread), uring or pread"},
    {"disk", "allow_buffered", CAKE_FIELD(disk_allow_buffered), 0, 0, "", "accept a filesystem without O_DIRECT (its page cache doubles memory use)"},
    {"disk", "recovery_threads", CAKE_FIELD(disk_recovery_threads), 1, 1024, "", "chunk headers read at once while the index is rebuilt after a crash"},
    {"disk", "index_checkpoint_ms", CAKE_FIELD(disk_index_checkpoint_ms), 0, 86400000, "", "the index also written this often while chunks arrive; 0: at a clean stop only"},
    {"disk", "read_gbps", CAKE_FIELD(disk_read_gbps), 0, 1e6, "--disk-read-gbps", "cap disk-tier reads at this many Gbit/s, for experiments; 0: none"},
    {"disk", "codec", CAKE_FIELD(disk_codec), 0, 0, "--disk-codec", "none, or planes-zstd: chunks stored losslessly compressed (bf16 KV about 1.45x smaller; decoding costs about 2 GB/s per core)"},
    {"remote", "endpoints", CAKE_FIELD(remote_endpoints), 0, 0, "--remote", "Redis host:port (a standalone server or cluster seeds); setting it enables the remote tier"},
    {"remote", "user", CAKE_FIELD(remote_user), 0, 0, "", "Redis ACL user; unset: AUTH with the password alone"},
    {"remote", "password", CAKE_FIELD(remote_password), 0, 0, "", "only in a config neither group nor others can read ($CAKE_REMOTE_PASSWORD wins)", 0, true},
    {"remote", "password_file", CAKE_FIELD(remote_password_file), 0, 0, "", "the password from this owner-only file"},
    {"remote", "key_prefix", CAKE_FIELD(remote_key_prefix), 0, 0, "--remote-key-prefix", "prefix of every Redis key"},
    {"remote", "part_bytes", CAKE_FIELD(remote_part_bytes), 4096, Pow2(29), "", "values are split into parts of this size"},
    {"remote", "connections", CAKE_FIELD(remote_connections), 1, 1024, "", "idle connections kept per Redis node"},
    {"remote", "read_threads", CAKE_FIELD(remote_read_threads), 0, 1024, "--remote-read-threads", "chunks read from Redis at once (a thread each); 0: one per master, at least 2, at most loader.io_threads"},
    {"remote", "connect_timeout_ms", CAKE_FIELD(remote_connect_timeout_ms), 1, 600000, "", "a connection to a Redis node not made by then has failed"},
    {"remote", "command_timeout_ms", CAKE_FIELD(remote_command_timeout_ms), 1, 600000, "", "a Redis command not answered by then has failed"},
    {"remote", "ttl_s", CAKE_FIELD(remote_ttl_s), 0, Pow2(31), "", "keys expire after this many seconds; 0: never (Redis's maxmemory policy evicts)"},
    {"remote", "scan_timeout_s", CAKE_FIELD(remote_scan_timeout_s), 1, 86400, "", "one node's scan (Verify, Evict) runs at most this long, whatever the node says of its size"},
    {"remote", "read_gbps", CAKE_FIELD(remote_read_gbps), 0, 1e6, "--remote-read-gbps", "cap remote-tier reads at this many Gbit/s, for experiments; 0: none"},
    {"remote", "codec", CAKE_FIELD(remote_codec), 0, 0, "--remote-codec", "none, or planes-zstd: chunks stored losslessly compressed (more chunks fit in Redis's memory)"},
    {"remote", "promote_to_disk", CAKE_FIELD(remote_promote_to_disk), 0, 0, "", "a chunk loaded from Redis is also copied onto the local disk tier"},
    {"cuda", "enabled", CAKE_FIELD(cuda_enabled), 0, 0, "--cuda", "device regions where the build has CUDA and a device answers (--no-cuda: host regions only)"},
    {"cuda", "devices", CAKE_FIELD(cuda_devices), 0, 1023, "--cuda-devices", "CUDA device ordinals engines may ask for; unset: every visible device"},
    {"cuda", "max_region_bytes", CAKE_FIELD(cuda_max_region_bytes), 1, Pow2(50), "", "the largest device region"},
    {"cuda", "pin_dram", CAKE_FIELD(cuda_pin_dram), 0, 0, "", "page-lock the DRAM tier at start-up, so DRAM hits reach devices in one DMA"},
    {"writeback", "queue_bytes", CAKE_FIELD(write_back_queue_bytes), 0, Pow2(44), "", "chunks waiting to be written to slower tiers; beyond it, Store writes them itself"},
    {"writeback", "threads", CAKE_FIELD(write_back_threads), 1, 64, "", "chunks written back at once"},
    {"loader", "window", CAKE_FIELD(load_window), 1, 4096, "--window", "reads in flight per load that asks for 0"},
    {"loader", "max_window", CAKE_FIELD(max_load_window), 1, 4096, "", "the most a load may ask for"},
    {"loader", "idle_timeout_ms", CAKE_FIELD(load_idle_timeout_ms), 50, 86400000, "", "a load whose client neither sends nor reads for this long is ended"},
    {"loader", "start_timeout_ms", CAKE_FIELD(load_start_timeout_ms), 50, 86400000, "", "a Load stream without a Start for this long is ended"},
    {"loader", "max_unstarted_streams", CAKE_FIELD(max_unstarted_streams), 1, Pow2(20), "", "Load streams open without a Start, all principals together"},
    {"loader", "max_unstarted_streams_per_principal", CAKE_FIELD(max_unstarted_streams_per_principal), 1, Pow2(20), "", "of those, one principal's"},
    {"loader", "max_inline_bytes", CAKE_FIELD(max_inline_bytes), Pow2(20), Pow2(44), "", "chunk bytes all inline loads together hold, read and not yet sent; beyond, reads wait"},
    {"loader", "max_inline_bytes_per_principal", CAKE_FIELD(max_inline_bytes_per_principal), Pow2(20), Pow2(44), "", "of those, one principal's; beyond, its reads wait"},
    {"loader", "io_threads", CAKE_FIELD(io_threads), 1, 1024, "--io-threads", "threads that run tier reads and Store copies"},
    {"loader", "arbiter", CAKE_FIELD(arbiter), 0, 0, "--arbiter", "which concurrent load's read goes next: srf (fewest chunks left), fifo or fair"},
    {"loader", "arbiter_starvation_ms", CAKE_FIELD(arbiter_starvation_ms), 1, 3600000, "", "srf: a read that has waited this long goes first"},
    {"prefetch", "enabled", CAKE_FIELD(prefetch_enabled), 0, 0, "", "copy a prompt's chunks from disk and Redis into DRAM when an engine's Lookup asks (prefetch)"},
    {"prefetch", "max_bytes", CAKE_FIELD(prefetch_max_bytes), 0, Pow2(44), "", "chunk bytes of all prefetches together: queued, being copied, or copied and not yet loaded (at most half the DRAM tier)"},
    {"prefetch", "reads_in_flight", CAKE_FIELD(prefetch_reads_in_flight), 1, 64, "", "prefetch copies at once, each on an I/O thread no load's read needs"},
    {"prefetch", "ttl_ms", CAKE_FIELD(prefetch_ttl_ms), 100, 86400000, "", "a prefetched chunk no load used by then is forgotten and counted wasted"},
    {"keys", "secret", CAKE_FIELD(key_secret), 0, 0, "", "mixed into every key; daemons that share a store must share it", 0, true},
};
// clang-format on

#undef CAKE_FIELD

constexpr std::string_view kTables[] = {"server", "tcp",  "metrics",   "access", "limits",   "dram", "disk",
                                        "remote", "cuda", "writeback", "loader", "prefetch", "keys"};

}  // namespace

std::span<const ConfigKey> ConfigKeys() { return kKeys; }

std::span<const std::string_view> ConfigTables() { return kTables; }

std::string FullKeyName(const ConfigKey& key) {
  return absl::StrCat(std::string(key.table), ".", std::string(key.name));
}

}  // namespace cake
