// The C++ client library an engine links to use caked: regions, lookups, stores and Cake loads.
// Blocking calls, safe to use from several threads; a LoadSession is driven by one engine thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/strategy.h"
#include "cuda/cuda_backend.h"
#include "cuda/region.h"
#include "keys/namespace.h"
#include "keys/tier_kind.h"

namespace grpc {
class ChannelInterface;
}

namespace cake {

struct ClientOptions {
  ClientOptions() = default;
  // The usual case: a unix socket and a client id.
  ClientOptions(std::string socket, std::string id) : socket_path(std::move(socket)), client_id(std::move(id)) {}

  // Used as given, unchecked: naming a socket is this user's choice. Empty: $CAKE_SOCKET when set (also as given),
  // else ChooseDaemonSocket(DefaultSocketCandidates()).
  std::string socket_path;
  std::string client_id;  // default: "<hostname>-<pid>"
  // An engine or operator on another host: the daemon's TCP listener ("host:port") instead of the socket, with
  // TLS (tls_ca_file: the CA that signed the daemon's certificate), and either a client certificate
  // (tls_cert_file, tls_key_file) or a bearer token read from token_file. No regions over TCP: inline bytes.
  std::string address;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string token_file;
};

// The sockets a client looks at, in order, when neither ClientOptions::socket_path nor $CAKE_SOCKET names one.
struct DaemonSocketCandidates {
  // This user's own daemon (empty for root, whose daemon is the system one): $XDG_RUNTIME_DIR/cake/caked.sock, else
  // /tmp/cake-<uid>/caked.sock. Used only when its folder passes the daemon's rule (base/socket_folder.h) and it is
  // a socket: a folder in /tmp may have been made by another user, who would then receive the prompts.
  std::string own;
  // The system daemon's socket (/run/cake/caked.sock): used when it is a socket. Its folder belongs to the unit's
  // user, not to the caller, and lies where only root can create entries (/run).
  std::string system;
};

// The candidates for this process: by its effective uid and $XDG_RUNTIME_DIR, as the daemon picks its own socket.
DaemonSocketCandidates DefaultSocketCandidates();

struct DaemonSocketChoice {
  std::string path;
  // Candidates passed over because they failed the rule, each as "<path>: <why and what to do>": a tool shows them
  // as warnings (a squatted /tmp/cake-<uid> is worth knowing about even when the system daemon answered).
  std::vector<std::string> skipped;
};

// The socket to connect to: the own candidate when it passes the rule, else the system one. When neither is usable:
// FAILED_PRECONDITION when one was refused by the rule, UNAVAILABLE when there is simply no socket; the message names
// each candidate and why it was not used.
absl::StatusOr<DaemonSocketChoice> ChooseDaemonSocket(const DaemonSocketCandidates& candidates);

// Where clients look for the daemon, for display: $CAKE_SOCKET when set (taken as given), else
// ChooseDaemonSocket(DefaultSocketCandidates())'s path. When nothing is usable: this user's own path if no socket
// exists at all (where its daemon would listen), else the system daemon's path (never a refused one).
std::string DefaultSocketPath();

// A region the daemon created for this client, mapped into this process: host shared memory, or device memory
// opened through CUDA IPC.
class MappedRegion {
 public:
  MappedRegion(std::string id, SharedMemory shm) : id_(std::move(id)), size_(shm.size()), shm_(std::move(shm)) {}
  MappedRegion(std::string id, CudaIpcMapping device)
      : id_(std::move(id)), size_(device.size()), device_(std::move(device)) {}
  const std::string& id() const { return id_; }
  uint64_t size() const { return size_; }
  RegionBackend backend() const { return device_ ? RegionBackend::kCudaIpc : RegionBackend::kHostShm; }
  // Host regions: the bytes, mapped here. Device regions: nullptr (see device_data()).
  std::byte* data() const { return shm_ ? shm_->data() : nullptr; }
  // Device regions: a device pointer valid on device(). Host regions: nullptr.
  void* device_data() const { return device_ ? device_->device_data() : nullptr; }
  int device() const { return device_ ? device_->device() : -1; }
  // Either kind, synchronously: for engines and checks that want the bytes on the host. OUT_OF_RANGE outside.
  absl::Status CopyToHost(uint64_t offset, std::span<std::byte> dst) const;
  absl::Status CopyFromHost(uint64_t offset, std::span<const std::byte> src) const;

 private:
  std::string id_;
  uint64_t size_;
  std::optional<SharedMemory> shm_;
  std::optional<CudaIpcMapping> device_;
};

// Where RegisterRegion puts the memory.
struct RegionRequest {
  enum class Kind { kHost, kCuda, kAuto };  // kAuto: device memory when the daemon serves it, else host
  Kind kind = Kind::kHost;
  int device = 0;  // CUDA ordinal, for kCuda and kAuto
};

// The prompt as tokens or as the engine's own 16-byte chunk keys (exactly one of the two).
struct PromptRef {
  std::span<const uint32_t> tokens;
  std::span<const std::string> chunk_keys;
};

struct LookupResult {
  uint32_t total_chunks = 0;
  uint32_t cached_chunks = 0;
  std::vector<TierKind> tiers;
  uint64_t chunk_bytes = 0;
  uint32_t prefetch_chunks = 0;  // with LookupOptions::prefetch: chunks the daemon queued for copying into DRAM
};

struct LookupOptions {
  // The prompt will be loaded soon (its request waits in the engine's queue): the daemon copies its chunks on
  // disk or in Redis into DRAM meanwhile, the tail first, with I/O no running load needs.
  bool prefetch = false;
};

struct StoreResult {
  uint32_t stored_chunks = 0;
  uint32_t already_cached = 0;
};

struct LoadOptions {
  NamespaceSpec ns;
  PromptRef prompt;
  const MappedRegion* region = nullptr;  // nullptr: chunk bytes come inline on the stream
  uint64_t region_offset = 0;
  uint64_t region_bytes = 0;         // 0: the rest of the region
  bool io_only = false;              // load every cached chunk, whatever the engine computes
  uint32_t window = 0;               // 0: the daemon's default
  double compute_first_chunk_s = 0;  // optional hints for the daemon's meeting-point prediction
  double compute_growth_s = 0;
  // Chunks [0, computed_through) the engine holds already or computes regardless: never loaded. With io_only,
  // a fixed split (the engine computes below, the daemon loads the rest).
  uint32_t computed_through = 0;
};

struct LoadPlan {
  std::string load_id;
  uint32_t total_chunks = 0;
  uint32_t cached_chunks = 0;
  uint32_t lowest_loadable = 0;
  uint64_t chunk_bytes = 0;
  std::optional<uint32_t> predicted_meeting_chunk;
  std::vector<TierKind> tiers;
  // How the daemon serves the request (cake.v1.LoadPlan.Strategy): kCake, compute until a chunk is resident;
  // kIoOnly, compute only [0, lowest_loadable) and wait; kComputeOnly, compute everything.
  using Strategy = cake::Strategy;
  Strategy strategy = Strategy::kCake;
  std::optional<double> predicted_cake_s, predicted_compute_only_s, predicted_io_only_s;
};

// What an engine computing the front of a prompt does next: the engine side of the Cake protocol, written once
// for every C++ engine (cake/load.py's Step and next_front_step are the same rule). An engine loops:
//   kCompute: compute chunk c, ReportProgress(c + 1);  kWait: WaitResidentUntil(c, until), then ask again;
//   kStop: WaitDone(), compute up to its meeting chunk, use the loaded rest.
struct FrontStep {
  enum class Action { kCompute, kWait, kStop };
  Action action = Action::kCompute;
  std::chrono::steady_clock::time_point until;  // kWait only
  // kCompute only: the engine may compute up to this chunk (exclusive) before it must ask again, unless a chunk
  // it reaches is resident first (the predicted meeting, the limit, or one chunk when paced): what an engine that
  // computes several chunks per step caps its steps at.
  uint32_t compute_through = 0;
};

// What NextFrontStep weighs beyond the plan and the loads, each optional (cake/load.py's next_front_step takes the
// same as keyword arguments).
struct FrontStepExtras {
  // The stream ended without Done: nothing more lands, so the front never waits (it computes on to the limit).
  bool stream_ended = false;
  // The paced mode: the engine's own estimate of what computing next_chunk takes, in seconds. The loads' measured
  // pace then replaces the predicted meeting: wait (until now + 1.5 x resident_in_s + 2 ms) when the loads reach
  // next_chunk no later than computing it would, once per chunk, else compute that one chunk and ask again. It
  // adapts when the engine runs faster or slower than its hint said, which the prediction cannot. The Python
  // session measures the pace itself (next_step(c, compute_s)); LoadSession::NextStep does not, so a C++ engine
  // that wants this mode passes the ETA it measured.
  std::optional<double> compute_s;
  std::optional<double> resident_in_s;  // when the loads reach next_chunk at their pace, seconds (nullopt: no pace)
  bool paced_wait_given = false;        // the engine already waited once for next_chunk on the pace
};

// The rule, on what the engine knows when it is about to compute chunk `next_chunk`: the plan, when the load
// started, the lowest chunk of the loaded suffix, and the meeting chunk once Done arrived. tests/golden/
// front_steps.toml pins it, row by row, here (tests/client/front_step_golden_test.cc) and in Python.
//  - Stop at the limit: lowest_loadable under I/O-only (the engine computes only below it), else cached_chunks.
//  - Once Done arrived: compute up to its meeting chunk (failed reads move it up), stop there.
//  - Stop when next_chunk is resident (then all of [next_chunk, cached) are).
//  - Under another strategy than Cake, or once the stream ended: compute on to the limit.
//  - Paced (extras.compute_s): as FrontStepExtras says.
//  - Under Cake with a prediction, compute up to the predicted meeting chunk, and there wait until `started` plus
//    the predicted Cake time with a fifth of slack and a millisecond: computing past the meeting is work thrown
//    away, but past that deadline the loads fell behind, and waiting longer is worse than computing on.
//  - Otherwise compute on to the limit.
FrontStep NextFrontStep(const LoadPlan& plan, std::chrono::steady_clock::time_point started, uint32_t next_chunk,
                        uint32_t loaded_low, std::optional<uint32_t> done_meeting,
                        std::chrono::steady_clock::time_point now, const FrontStepExtras& extras = {});

struct LoadDone {
  uint32_t meeting_chunk = 0;  // compute [0, meeting_chunk), use the loaded [meeting_chunk, cached_chunks)
  uint32_t loaded_chunks = 0;
  uint32_t failed_chunks = 0;
};

// One Cake load. After each engine step: ReportProgress(c), then NextStep(c) says whether to compute on, wait or
// stop. Release() once the loaded chunks have been copied out. A daemon message that breaks the protocol (a chunk
// outside the plan or the region, a second Plan, Done before its chunks) ends the load: Release() returns
// DATA_LOSS, and the engine computes what was not loaded.
class LoadSession {
 public:
  virtual ~LoadSession() = default;  // cancels the load if it was not released

  virtual absl::StatusOr<LoadPlan> WaitPlan() = 0;
  // NextFrontStep on this load's state, for the chunk the engine would compute next (waits for the Plan; an error
  // if the stream ended first).
  virtual absl::StatusOr<FrontStep> NextStep(uint32_t next_chunk) = 0;
  virtual absl::Status ReportProgress(uint32_t computed_through) = 0;
  // Whether chunk's bytes are in the region (or held inline); true means all of [chunk, cached) are.
  virtual bool IsResident(uint32_t chunk) const = 0;
  // The lowest chunk of the loaded suffix [LoadedLow(), cached) so far (cached_chunks while nothing is loaded).
  virtual uint32_t LoadedLow() const = 0;
  // Where the daemon placed chunk in the region (ChunkLoaded.region_offset; valid once resident).
  virtual uint64_t RegionOffset(uint32_t chunk) const = 0;
  // Inline loads: the chunk's bytes (empty unless resident).
  virtual std::string_view InlineChunk(uint32_t chunk) const = 0;
  // Blocks until the daemon reports the final split; an error if the stream failed.
  virtual absl::StatusOr<LoadDone> WaitDone() = 0;
  // Blocks until chunk is resident or Done arrived; returns IsResident(chunk).
  virtual bool WaitResident(uint32_t chunk) = 0;
  // The same, giving up at `deadline` (an engine waiting at the predicted meeting for loads that fell behind).
  virtual bool WaitResidentUntil(uint32_t chunk, std::chrono::steady_clock::time_point deadline) = 0;
  // Tells the daemon the chunks were copied out and ends the stream; returns its final status.
  virtual absl::Status Release() = 0;
};

// cake.v1.GetLimitsResponse: what the daemon accepts. A daemon too old to answer GetLimits is taken to have the
// defaults below (its configuration's defaults when it was written). tests/golden/limit_defaults.toml pins them
// against the daemon's DaemonConfig{} and the Python client's cake.Limits().
struct DaemonLimits {
  uint64_t max_message_bytes = uint64_t{256} << 20;
  uint32_t load_start_timeout_ms = 60000;
  uint32_t load_idle_timeout_ms = 60000;
  uint32_t default_chunk_tokens = 256;
  uint32_t max_chunk_tokens = 1u << 16;
  uint64_t min_chunk_bytes = 4096;
  uint64_t max_prompt_tokens = 1u << 20;
  uint32_t region_lease_ms = 30000;
  uint32_t default_load_window = 4;
  uint32_t max_load_window = 64;
  uint64_t max_region_bytes = uint64_t{64} << 30;  // host regions
};

// cake.v1.StatusResponse, typed.
struct DaemonStatus {
  struct Tier {
    TierKind kind = TierKind::kNone;
    uint64_t used_bytes = 0;
    uint64_t capacity_bytes = 0;
    uint64_t chunks = 0;
    double read_cap_gbps = 0;  // 0: not capped
  };
  std::string version;
  uint32_t pid = 0;
  double uptime_s = 0;
  std::string listen_address;
  bool cuda_regions = false;  // RegisterRegion can make device regions here
  std::vector<Tier> tiers;
  uint32_t active_loads = 0;
  uint32_t regions = 0;
  uint64_t region_bytes = 0;
  uint32_t regions_released_in_use = 0;
  bool draining = false;
  std::string metrics_address;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options = {});
  virtual ~Client() = default;

  virtual const std::string& client_id() const = 0;
  virtual absl::StatusOr<MappedRegion> RegisterRegion(uint64_t bytes, RegionRequest where = {}) = 0;
  virtual absl::Status ReleaseRegion(const MappedRegion& region) = 0;
  virtual absl::StatusOr<LookupResult> Lookup(const NamespaceSpec& ns, const PromptRef& prompt,
                                              LookupOptions options = {}) = 0;
  // Chunks [first_chunk, first_chunk + count) lie one after another in the region from region_offset.
  virtual absl::StatusOr<StoreResult> Store(const NamespaceSpec& ns, const PromptRef& prompt, uint32_t first_chunk,
                                            uint32_t count, const MappedRegion& region, uint64_t region_offset) = 0;
  virtual absl::StatusOr<StoreResult> StoreInline(const NamespaceSpec& ns, const PromptRef& prompt,
                                                  uint32_t first_chunk, std::span<const std::string_view> chunks) = 0;
  virtual absl::StatusOr<std::unique_ptr<LoadSession>> StartLoad(const LoadOptions& options) = 0;

  virtual absl::Status Ping() = 0;
  // What the daemon accepts (GetLimits): sizes and timers a client must agree with. Asked once, then kept.
  virtual absl::StatusOr<DaemonLimits> Limits() = 0;
  virtual absl::StatusOr<std::map<std::string, uint64_t>> Stats() = 0;
  // Drops every chunk of one tier; returns how many.
  virtual absl::StatusOr<uint64_t> Evict(TierKind tier) = 0;
  // Changes a capped tier's read cap; returns the previous cap, Gbit/s.
  virtual absl::StatusOr<double> SetReadCap(TierKind tier, double gbps) = 0;
  virtual absl::StatusOr<DaemonStatus> Status() = 0;
  // gRPC's standard health check: whether the daemon serves `service` ("" is the whole daemon; NOT_SERVING while
  // drained or stopping). NOT_FOUND for a service it does not know.
  virtual absl::StatusOr<bool> Serving(const std::string& service) = 0;
  // The connection, for tools that call the generated stubs themselves (cakectl's AdminService calls).
  virtual std::shared_ptr<grpc::ChannelInterface> channel() const = 0;
};

}  // namespace cake
