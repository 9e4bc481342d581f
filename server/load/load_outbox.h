// The messages one load has for its client, written one at a time (gRPC allows one write in flight per stream).
// Chunks that landed while a write was out go as one ChunksLoaded to a client that accepts it: the client's cost
// per message, not the daemon's, is what limits small chunks.
#pragma once

#include <deque>

#include "cake/v1/kv.pb.h"

namespace cake {

class LoadOutbox {
 public:
  // Landed chunks in one ChunksLoaded at most (about 20 bytes each: a message stays small).
  static constexpr int kMaxLoadedBatch = 1024;

  explicit LoadOutbox(bool batch_loaded = false) : batch_loaded_(batch_loaded) {}

  void Push(v1::LoadResponse message) { queued_.push_back(std::move(message)); }
  // The next message to write, valid until WriteDone; null while one is being written or none waits.
  const v1::LoadResponse* StartWrite();
  void WriteDone() { writing_ = false; }
  // What waits is dropped; a write in progress stays valid until WriteDone.
  void Clear() { queued_.clear(); }

  bool writing() const { return writing_; }
  size_t queued() const { return queued_.size(); }

 private:
  bool batch_loaded_;
  std::deque<v1::LoadResponse> queued_;
  v1::LoadResponse current_;  // gRPC reads it while the write is out
  bool writing_ = false;
};

}  // namespace cake
