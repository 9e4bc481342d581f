#include "storage/io/io_engine.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cake {
namespace {

// Consecutive EINTR/EAGAIN answers tolerated for one piece before the read is given up as failed: enough
// for any real signal storm, and a bound so a misbehaving device or engine cannot spin a reader forever.
constexpr int kMaxRetriesWithoutProgress = 64;

// pread(2) behind the engine interface: requests queue up and each Wait performs the oldest one with a
// single call, so short reads and EINTR reach the driver exactly as io_uring would report them.
class PreadEngine final : public IoEngine {
 public:
  explicit PreadEngine(uint32_t depth) : depth_(depth) {}

  std::string_view name() const override { return "pread"; }
  uint32_t depth() const override { return depth_; }

  absl::Status Submit(std::span<const IoRequest> requests) override {
    if (queue_.size() + requests.size() > depth_) {
      return absl::InternalError(absl::StrCat("pread engine: ", queue_.size() + requests.size(),
                                              " requests in flight exceed the depth of ", depth_));
    }
    queue_.insert(queue_.end(), requests.begin(), requests.end());
    return absl::OkStatus();
  }

  absl::StatusOr<IoCompletion> Wait() override {
    if (queue_.empty()) return absl::InternalError("pread engine: Wait with nothing submitted");
    const IoRequest r = queue_.front();
    queue_.pop_front();
    const ssize_t n = ::pread(r.fd, r.buffer, r.length, static_cast<off_t>(r.offset));
    return IoCompletion{r.tag, n < 0 ? -int64_t{errno} : int64_t{n}};
  }

 private:
  const uint32_t depth_;
  std::deque<IoRequest> queue_;
};

}  // namespace

std::unique_ptr<IoEngine> MakePreadEngine(uint32_t depth) { return std::make_unique<PreadEngine>(depth); }

absl::StatusOr<std::unique_ptr<IoEngine>> MakeIoEngine(IoBackend backend, uint32_t depth) {
  switch (backend) {
    case IoBackend::kUring:
      return MakeUringEngine(depth);
    case IoBackend::kPread:
      return MakePreadEngine(depth);
    case IoBackend::kAuto:
      break;
  }
  return absl::InvalidArgumentError("MakeIoEngine needs a concrete backend (io_uring or pread), not auto");
}

absl::Status ReadSegments(IoEngine& engine, int fd, std::span<const ReadSegment> segments) {
  struct Piece {
    uint64_t offset;
    std::byte* buffer;
    size_t left;
    int retries = 0;
  };
  std::vector<Piece> pieces;
  for (const ReadSegment& s : segments) {
    for (size_t done = 0; done < s.buffer.size(); done += kMaxIoBytes) {
      pieces.push_back(Piece{s.offset + done, s.buffer.data() + done, std::min(kMaxIoBytes, s.buffer.size() - done)});
    }
  }
  const std::string engine_name(engine.name());  // absl::StrCat takes no std::string_view here
  const size_t depth = std::max<uint32_t>(engine.depth(), 1);
  std::vector<size_t> ready;  // pieces to (re)submit, in order: resubmissions first, then new pieces
  size_t next_new = 0;
  size_t in_flight = 0;
  absl::Status failure;
  std::vector<IoRequest> batch;
  batch.reserve(depth);

  while (true) {
    // Fill the queue in one submission, unless a failure is already known: then only drain.
    if (failure.ok()) {
      batch.clear();
      while (in_flight + batch.size() < depth && (!ready.empty() || next_new < pieces.size())) {
        size_t i;
        if (!ready.empty()) {
          i = ready.back();
          ready.pop_back();
        } else {
          i = next_new++;
        }
        const Piece& p = pieces[i];
        batch.push_back(IoRequest{fd, p.offset, p.buffer, static_cast<uint32_t>(p.left), i});
      }
      if (!batch.empty()) {
        absl::Status s = engine.Submit(batch);
        if (s.ok()) {
          in_flight += batch.size();
        } else {
          failure = absl::UnavailableError(absl::StrCat(engine_name, " submit failed: ", s.message()));
        }
      }
    }
    if (in_flight == 0) break;

    absl::StatusOr<IoCompletion> c = engine.Wait();
    if (!c.ok()) {
      // The engine cannot tell us about the rest: it is broken and its owner discards it.
      return absl::UnavailableError(absl::StrCat(engine_name, " wait failed: ", c.status().message()));
    }
    --in_flight;
    if (c->tag >= pieces.size()) {
      if (failure.ok()) failure = absl::InternalError(absl::StrCat(engine_name, " completed unknown tag ", c->tag));
      continue;
    }
    Piece& p = pieces[c->tag];
    const int64_t res = c->result;
    if (!failure.ok()) continue;  // draining: the outcome no longer matters, only that it is no longer in flight
    if (res < 0) {
      const int err = static_cast<int>(-res);
      if ((err == EINTR || err == EAGAIN) && ++p.retries <= kMaxRetriesWithoutProgress) {
        ready.push_back(c->tag);
        continue;
      }
      failure = absl::UnavailableError(absl::StrCat(engine_name, " read of ", p.left, " bytes at offset ", p.offset,
                                                    " failed: ", std::strerror(err)));
    } else if (res == 0) {
      failure = absl::DataLossError(
          absl::StrCat("unexpected end of file at offset ", p.offset, " with ", p.left, " bytes still to read"));
    } else if (static_cast<uint64_t>(res) > p.left) {
      failure = absl::UnavailableError(absl::StrCat(engine_name, " reported ", res, " bytes read for a request of ",
                                                    p.left, " at offset ", p.offset));
    } else if (static_cast<uint64_t>(res) < p.left) {
      // A short read: the kernel may stop early (signals, device limits); ask again for the rest.
      p.offset += res;
      p.buffer += res;
      p.left -= res;
      p.retries = 0;
      ready.push_back(c->tag);
    }
  }
  return failure;
}

}  // namespace cake
