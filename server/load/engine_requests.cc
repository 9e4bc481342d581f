#include "server/load/engine_requests.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/core/callers.h"
#include "server/edge/requests.h"

namespace cake {

absl::Status LoadRequest::CheckComputedThrough(uint32_t computed_through) const {
  if (computed_through <= keys.size() + 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("computed_through ", computed_through, " exceeds the prompt's ", keys.size(), " full chunks"));
}

absl::StatusOr<LoadRequest> ParseLoadStart(const v1::LoadStart& start, const Caller& caller,
                                           const std::function<absl::StatusOr<Caller>()>& identify_again,
                                           DaemonState& state) {
  // The policy may have been reloaded (SIGHUP) since the stream opened: a principal revoked since starts nothing.
  if (caller.policy != state.access()) {
    CAKE_ASSIGN_OR_RETURN(const Caller now, identify_again());
    CAKE_RETURN_IF_ERROR(AccessPolicy::Require(now, Role::kEngine, "Load"));
    if (now.principal->name != caller.principal->name) {
      return absl::PermissionDeniedError("the daemon's access policy changed since this stream opened; open another");
    }
  }
  if (state.draining) {
    return absl::UnavailableError("the daemon is draining and takes no new loads; compute, or try another daemon");
  }
  const DaemonConfig& config = state.config;
  CAKE_RETURN_IF_ERROR(CheckClientId(start.client_id()));
  CAKE_ASSIGN_OR_RETURN(Namespace ns, CallerNamespace(caller, start.namespace_(), config));
  LoadRequest out(std::move(ns));
  CAKE_ASSIGN_OR_RETURN(out.keys, PromptKeys(out.ns, start.prompt(), config));
  if (start.window() > config.max_load_window) {
    return absl::InvalidArgumentError(
        absl::StrCat("window ", start.window(), " exceeds loader.max_window (", config.max_load_window, ")"));
  }
  if (start.mode() != v1::LoadStart::MODE_CAKE && start.mode() != v1::LoadStart::MODE_IO_ONLY) {
    return absl::InvalidArgumentError(absl::StrCat("unknown load mode ", static_cast<int>(start.mode())));
  }
  if (start.compute_first_chunk_s() < 0 || start.compute_growth_s() < 0) {
    return absl::InvalidArgumentError("compute hints must not be negative");
  }
  CAKE_RETURN_IF_ERROR(out.CheckComputedThrough(start.computed_through()));
  if (start.region_id().empty()) {
    if (start.region_offset() != 0 || start.region_bytes() != 0) {
      return absl::InvalidArgumentError("region_offset and region_bytes need a region_id");
    }
    if (out.chunk_bytes() > config.max_message_bytes - 4096) {
      return absl::InvalidArgumentError(absl::StrCat("inline loads carry one chunk per message; a chunk of ",
                                                     out.chunk_bytes(), " bytes exceeds server.max_message_bytes"));
    }
  } else {
    CAKE_RETURN_IF_ERROR(CheckRegionsReachable(caller));
    RegionOwner owner(caller.principal->name, start.client_id());
    CAKE_ASSIGN_OR_RETURN(const uint64_t region_size, state.regions.Size(owner, start.region_id()));
    if (start.region_offset() > region_size) {
      return absl::OutOfRangeError(absl::StrCat("region_offset ", start.region_offset(), " is past the end of the ",
                                                region_size, "-byte region"));
    }
    const uint64_t available = region_size - start.region_offset();
    if (start.region_bytes() > available) {
      return absl::OutOfRangeError(absl::StrCat("region window [", start.region_offset(), ", +", start.region_bytes(),
                                                ") runs past the end of the ", region_size, "-byte region"));
    }
    out.region = LoadRequest::RegionWindow{std::move(owner), start.region_id(), start.region_offset(),
                                           start.region_bytes() == 0 ? available : start.region_bytes()};
  }
  out.client_id = start.client_id();
  out.accept_loaded_batch = start.accept_loaded_batch() && out.region.has_value();
  out.window = start.window() == 0 ? config.load_window : start.window();
  out.io_only_requested = start.mode() == v1::LoadStart::MODE_IO_ONLY;
  out.hint_first_chunk_s = start.compute_first_chunk_s();
  out.hint_growth_s = start.compute_growth_s();
  out.computed_through = start.computed_through();
  out.fairness_key = FairnessKey(caller);
  return out;
}

std::string FairnessKey(const Caller& caller) {
  return caller.policy->single_tenant() && caller.unix_socket ? absl::StrCat("uid ", caller.uid)
                                                              : caller.principal->name;
}

absl::StatusOr<StoreRequestChecked> ParseStore(const v1::StoreRequest& request, const Caller& caller,
                                               DaemonState& state) {
  CAKE_RETURN_IF_ERROR(CheckClientId(request.client_id()));
  CAKE_ASSIGN_OR_RETURN(const Namespace ns, CallerNamespace(caller, request.namespace_(), state.config));
  StoreRequestChecked out;
  CAKE_ASSIGN_OR_RETURN(out.keys, PromptKeys(ns, request.prompt(), state.config));
  out.first = request.first_chunk();
  out.count = request.chunk_count();
  out.chunk_bytes = ns.chunk_bytes();
  out.format = LossyFormat::Of(ns.spec());
  if (out.count == 0) return absl::InvalidArgumentError("chunk_count is 0: name the chunks to store");
  if (out.first + out.count > out.keys.size()) {
    return absl::OutOfRangeError(absl::StrCat("chunks [", out.first, ", ", out.first + out.count,
                                              ") are not all full chunks of a ", out.keys.size(), "-chunk prompt"));
  }
  if (request.region_id().empty()) {
    if (static_cast<uint64_t>(request.inline_chunks_size()) != out.count) {
      return absl::InvalidArgumentError(absl::StrCat("without a region_id, inline_chunks must hold chunk_count (",
                                                     out.count, ") chunks; it holds ", request.inline_chunks_size()));
    }
    for (int i = 0; i < request.inline_chunks_size(); ++i) {
      if (request.inline_chunks(i).size() != out.chunk_bytes) {
        return absl::InvalidArgumentError(absl::StrCat("inline chunk ", i, " is ", request.inline_chunks(i).size(),
                                                       " bytes; this namespace's chunks are ", out.chunk_bytes));
      }
    }
    return out;
  }
  if (request.inline_chunks_size() > 0) {
    return absl::InvalidArgumentError("send chunks in a region or inline, not both");
  }
  CAKE_RETURN_IF_ERROR(CheckRegionsReachable(caller));
  CAKE_ASSIGN_OR_RETURN(
      out.region, state.regions.Get(RegionOwner(caller.principal->name, request.client_id()), request.region_id()));
  if (out.count > UINT64_MAX / out.chunk_bytes) return absl::OutOfRangeError("chunk_count * chunk_bytes overflows");
  CAKE_RETURN_IF_ERROR(CheckRange(out.region->size(), request.region_offset(), out.count * out.chunk_bytes));
  return out;
}

absl::Status SilentClientError(bool before_start, std::chrono::nanoseconds timeout) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
  if (before_start) {
    return absl::DeadlineExceededError(
        absl::StrCat("no Start within ", ms, " ms of opening the Load stream (loader.start_timeout_ms)"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the load was ended after ", ms,
      " ms without a message from the client or a read of ours (loader.idle_timeout_ms); compute the rest of the "
      "prompt"));
}

absl::StatusOr<LoadLanding> ReserveLanding(RegionRegistry& regions, const LoadRequest& request, uint32_t cached) {
  const uint64_t chunk_bytes = request.chunk_bytes();
  if (!request.region) {
    ChunkLanding landing = ChunkLanding::Inline(chunk_bytes);
    landing.set_stored_format(LossyFormat::Of(request.ns.spec()));
    return LoadLanding{std::move(landing), {}, 0};
  }
  const uint64_t fit = std::min<uint64_t>(cached, request.region->bytes / chunk_bytes);
  const uint32_t window_first = cached - static_cast<uint32_t>(fit);
  CAKE_ASSIGN_OR_RETURN(RegionRegistry::WindowLease lease,
                        regions.ReserveWindow(request.region->owner, request.region->region_id, request.region->offset,
                                              fit * chunk_bytes));
  ChunkLanding landing = ChunkLanding::InRegion(lease.region(), request.region->offset, window_first, chunk_bytes);
  landing.set_stored_format(LossyFormat::Of(request.ns.spec()));
  return LoadLanding{std::move(landing), std::move(lease), window_first};
}

}  // namespace cake
