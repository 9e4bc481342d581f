#include "server/load/inline_window.h"

namespace cake {

InlineWindow::~InlineWindow() {
  if (held_chunks_ > 0) budget_.Give(held_chunks_ * chunk_bytes_, holder_);
}

InlineWindow::Room InlineWindow::Reserve(const std::function<void()>& on_room) {
  // Read chunks waiting below one not yet landed count too: reads land out of order, and a slow read of the
  // highest chunk must not let the ones below it pile up past the window.
  if (reading_ + waiting_.size() + queued_ >= window_) return Room::kWindowFull;
  if (held_chunks_ > live_chunks()) return Room::kYes;  // a chunk's worth is held spare already
  if (waiting_for_budget_) return Room::kStillQueued;
  if (!budget_.TakeOrWait(chunk_bytes_, on_room, holder_)) {
    waiting_for_budget_ = true;
    return Room::kQueuedForBudget;
  }
  ++held_chunks_;
  return Room::kYes;
}

void InlineWindow::ReadDone(uint32_t chunk, bool ok, std::string bytes) {
  --reading_;
  if (ok) waiting_[chunk] = std::move(bytes);
}

std::string InlineWindow::TakeForMessage(uint32_t chunk) {
  auto it = waiting_.find(chunk);
  if (it == waiting_.end()) return {};
  std::string bytes = std::move(it->second);
  waiting_.erase(it);
  ++queued_;
  return bytes;
}

void InlineWindow::WriteStarted() {
  if (queued_ > 0) --queued_;
  writing_ = true;
}

void InlineWindow::Drop() {
  waiting_.clear();
  queued_ = 0;
}

uint64_t InlineWindow::TakeSpareBytes() {
  const uint64_t live = live_chunks();
  if (held_chunks_ <= live) return 0;
  const uint64_t spare = held_chunks_ - live;
  held_chunks_ = live;
  return spare * chunk_bytes_;
}

void InlineWindow::GiveBack(uint64_t bytes) const {
  if (bytes > 0) budget_.Give(bytes, holder_);
}

}  // namespace cake
