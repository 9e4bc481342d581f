// What earlier loads taught the daemon about each namespace's engine, read by the planner (PlanLoad) when the
// next load of that namespace starts.
#pragma once

#include <cstddef>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"
#include "keys/namespace.h"
#include "scheduler/planner.h"

namespace cake {

// What earlier loads taught the daemon about each namespace's engine: its compute cost per chunk. A new load's
// plan starts from it, so an engine that sends no hints still gets a planned split from its second load on.
class ComputeModels {
 public:
  ComputeModel Get(const ChunkKey& ns) const {
    MutexLock lock(&mu_);
    auto it = models_.find(ns);
    return it == models_.end() ? ComputeModel() : it->second;
  }
  // Older knowledge fades (the engine's load changes), the latest load counts most.
  void Learn(const ChunkKey& ns, const ComputeModel& observed) {
    if (!observed.known()) return;
    MutexLock lock(&mu_);
    if (models_.size() >= kMaxNamespaces && !models_.contains(ns)) models_.clear();  // rare: start over
    ComputeModel& model = models_[ns];
    model.Scale(0.5);
    model.Merge(observed);
  }

 private:
  static constexpr size_t kMaxNamespaces = 4096;
  mutable Mutex mu_;
  absl::flat_hash_map<ChunkKey, ComputeModel> models_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cake
