#include "server/load/load_outbox.h"

namespace cake {

const v1::LoadResponse* LoadOutbox::StartWrite() {
  if (writing_ || queued_.empty()) return nullptr;
  writing_ = true;
  current_ = std::move(queued_.front());
  queued_.pop_front();
  // Only consecutive landed chunks, and never inline ones (their bytes are the message): a Done stays behind them.
  if (batch_loaded_ && current_.has_loaded() && current_.loaded().data().empty() && !queued_.empty() &&
      queued_.front().has_loaded()) {
    v1::LoadResponse batch;
    v1::ChunksLoaded* chunks = batch.mutable_loaded_batch();
    chunks->add_chunks()->Swap(current_.mutable_loaded());
    while (!queued_.empty() && queued_.front().has_loaded() && chunks->chunks_size() < kMaxLoadedBatch) {
      chunks->add_chunks()->Swap(queued_.front().mutable_loaded());
      queued_.pop_front();
    }
    current_ = std::move(batch);
  }
  return &current_;
}

}  // namespace cake
