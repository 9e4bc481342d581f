// The daemon's live loads: who owns each (for admission and fairness), what can end it from outside (a stop, a
// region released, a reload revoking its caller) and what an operator sees of it (cakectl loads).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "base/strategy.h"
#include "cake/v1/admin.pb.h"
#include "server/edge/access.h"

namespace cake {

// Where a live load is (values match cake.v1.LoadPhase): asking the tiers how much of the prompt they hold,
// loading, or met (the split is final; it waits for its engine's Release).
enum class LoadPhase : int { kLookingUp = 1, kLoading = 2, kMet = 3 };
inline constexpr v1::LoadPhase ToWire(LoadPhase phase) { return static_cast<v1::LoadPhase>(phase); }
static_assert(ToWire(LoadPhase::kLookingUp) == v1::LOAD_PHASE_LOOKING_UP &&
              ToWire(LoadPhase::kLoading) == v1::LOAD_PHASE_LOADING && ToWire(LoadPhase::kMet) == v1::LOAD_PHASE_MET &&
              v1::LoadPhase_MAX == v1::LOAD_PHASE_MET);

// What an operator sees of one running load (cakectl loads).
struct LoadSummary {
  std::string load_id;
  std::string principal;  // empty in single-user mode
  std::string client_id;
  std::string tenant;
  std::string model;
  Strategy strategy = Strategy::kCake;
  LoadPhase phase = LoadPhase::kLookingUp;
  uint32_t total_chunks = 0;
  uint32_t cached_chunks = 0;
  uint32_t loaded_chunks = 0;     // landed so far
  uint32_t computed_through = 0;  // what the engine reported
  bool inline_bytes = false;
  double age_s = 0;
};

// Whose a live load is: what admission counts it against, and what can end it early (an operator's release of
// its region, a reload that revokes its principal).
struct LoadOwner {
  // Who is counted for fairness: the principal's name, or in single-user mode (one principal for every local
  // user) the peer's uid as "uid N", so one local user cannot hold every slot either.
  std::string fairness_key;
  std::string client_id;  // the client's own word: only a finer split within one principal
  std::string region_id;  // empty for inline loads
  PeerFacts peer;         // as the daemon saw the caller at Start, to ask a reloaded policy again
  std::string principal;  // the name the policy gave the caller at Start
  std::string tenant;     // the load's namespace's tenant, which a reloaded policy may take from the principal
};

// How many loads run at once: all together, per principal (fairness key) and per client of one principal.
struct LoadCaps {
  uint32_t total = 256;
  uint32_t per_principal = 256;
  uint32_t per_client = 256;
};

// Live loads, so a stopping daemon can cancel them, Status can count them and an operator can list them.
class LoadTracker {
 public:
  // A load ended from outside is told why; it finishes its stream with that status.
  using CancelFn = std::function<void(const absl::Status& why)>;
  // Returns a ticket, or RESOURCE_EXHAUSTED naming the cap (limits.max_concurrent_loads, ..._per_principal,
  // ..._per_client) that is full. Both callbacks may be called from any thread, never under the tracker's lock,
  // until Remove; `describe` answers nullopt for a load that is ending.
  absl::StatusOr<uint64_t> TryAdd(const LoadCaps& caps, LoadOwner owner, CancelFn cancel,
                                  std::function<std::optional<LoadSummary>()> describe = nullptr);
  void Remove(uint64_t ticket);
  // Ends every load for which `verdict` answers a status (never called under the tracker's lock... the verdict is;
  // it must not call back into the tracker). Returns how many.
  size_t CancelIf(const std::function<std::optional<absl::Status>(const LoadOwner&)>& verdict);
  void CancelAll(const absl::Status& why);
  // Ends the loads whose window lies in `region_id` (cakectl regions release --end-loads).
  size_t CancelUsingRegion(const std::string& region_id, const absl::Status& why);
  // After a reload: ends the loads whose caller the new policy no longer names as the same principal with the
  // engine role (a revoked token, a uid taken off a principal).
  size_t CancelRevoked(const AccessPolicy& policy);
  uint32_t active() const;
  std::vector<LoadSummary> List() const;

 private:
  struct Live {
    LoadOwner owner;
    CancelFn cancel;
    std::function<std::optional<LoadSummary>()> describe;
  };
  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Live> loads_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> per_principal_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<std::string, std::string>, uint32_t> per_client_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace cake
