// The chunks one inline load holds in the daemon's memory (being read, read and waiting for the chunks above them,
// queued for the client, being written) and the share of the daemon's inline budget taken for them. A slow client
// holds at most its window of chunks; all inline loads together at most loader.max_inline_bytes.
//
// Not thread-safe: the load's own lock guards it. GiveBack alone may be called without that lock (and must be:
// giving back wakes other loads, which take their own locks).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "server/core/inline_budget.h"

namespace cake {

class InlineWindow {
 public:
  InlineWindow(InlineBudget& budget, std::string holder, uint64_t chunk_bytes, uint32_t window)
      : budget_(budget), holder_(std::move(holder)), chunk_bytes_(chunk_bytes), window_(window) {}
  ~InlineWindow();  // gives back everything it holds
  InlineWindow(const InlineWindow&) = delete;
  InlineWindow& operator=(const InlineWindow&) = delete;

  enum class Room {
    kYes,              // read: a chunk's worth of the budget is held for it
    kWindowFull,       // wait for a read to land or a write to finish
    kQueuedForBudget,  // wait: `on_room` runs once some of the budget comes back (then ask again)
    kStillQueued,      // the same, queued by an earlier call
  };
  // Before each read. The budget is taken before the read, so the bytes count from the moment they exist.
  Room Reserve(const std::function<void()>& on_room);
  // What `on_room` calls first, under the owner's lock.
  void RoomCameBack() { waiting_for_budget_ = false; }
  void ReadIssued() { ++reading_; }
  // A read ended: its bytes, when it succeeded, wait for the chunks above it to land.
  void ReadDone(uint32_t chunk, bool ok, std::string bytes);
  // A landed chunk's bytes, for its message (queued until written).
  std::string TakeForMessage(uint32_t chunk);
  void WriteStarted();
  void WriteDone() { writing_ = false; }
  // The split is final: chunks below the meeting that landed out of order are not sent.
  void DropWaiting() { waiting_.clear(); }
  // The load ended: what waited to be sent is gone too.
  void Drop();

  // Budget no chunk holds any longer, to hand to GiveBack once the caller's lock is dropped.
  uint64_t TakeSpareBytes();
  void GiveBack(uint64_t bytes) const;

  // Its reads wait for the daemon's budget (others hold it): the load waits on the daemon, not on its client.
  bool waiting_for_budget() const { return waiting_for_budget_; }
  uint64_t live_chunks() const { return reading_ + waiting_.size() + queued_ + (writing_ ? 1 : 0); }
  uint64_t held_bytes() const { return held_chunks_ * chunk_bytes_; }

 private:
  InlineBudget& budget_;
  const std::string holder_;  // whose share of the budget (LoadRequest::fairness_key)
  const uint64_t chunk_bytes_;
  const uint32_t window_;
  uint64_t held_chunks_ = 0;  // chunks' worth taken from the budget
  uint32_t reading_ = 0;
  absl::flat_hash_map<uint32_t, std::string> waiting_;  // read, below a chunk not yet landed
  uint32_t queued_ = 0;
  bool writing_ = false;
  bool waiting_for_budget_ = false;
};

}  // namespace cake
