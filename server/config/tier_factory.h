// The daemon's tiers, built from its configuration at start-up: DRAM always, the disk when it has a root, Redis
// when it has endpoints, fastest first, each behind a read cap where the config sets one.
#pragma once

#include "absl/status/status.h"
#include "cuda/cuda_backend.h"
#include "server/config/config.h"
#include "storage/tier_manager.h"

namespace cake {

// Adds the configured tiers to `tiers`. With `page_lock_dram` (a usable CUDA device and cuda.pin_dram), the DRAM
// arena is page-locked into `dram_pinned`, so DRAM hits reach device regions in one DMA; a failure to lock is
// logged and costs only that. `remote_masters`, when not null, gets the masters the remote tier found
// (RemoteTier::masters; 0 without a remote tier or an answer). Errors: the DRAM reservation, the disk root or the
// remote options are unusable.
absl::Status AddTiersFromConfig(const DaemonConfig& config, bool page_lock_dram, TierManager& tiers,
                                PinnedRange& dram_pinned, uint32_t* remote_masters = nullptr);

}  // namespace cake
