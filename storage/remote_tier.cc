#include "storage/remote_tier.h"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/chunk_file.h"

namespace cake {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr std::string_view kRemoteMagic = "CAKERMT1";
constexpr uint32_t kRemoteFormatVersion = 1;
constexpr size_t kRemoteHeaderBytes = 64;
constexpr size_t kRemoteCheckedBytes = 56;  // the header checksum covers everything before it
constexpr int kClusterSlots = 16384;
constexpr int kMaxRedirects = 4;
constexpr auto kFirstBackoff = std::chrono::milliseconds(50);
constexpr auto kMinSlotRefreshInterval = std::chrono::milliseconds(100);

struct RemoteHeader {
  ChunkKey key;
  uint32_t parts = 0;
  uint64_t payload_length = 0;
  uint64_t part_bytes = 0;
  uint64_t payload_checksum = 0;
};

template <typename T>
void PutLe(char* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

template <typename T>
T GetLe(const char* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<uint8_t>(in[i])) << (8 * i);
  return value;
}

std::string EncodeRemoteHeader(const RemoteHeader& h) {
  std::string out(kRemoteHeaderBytes, '\0');
  char* p = out.data();
  std::memcpy(p, kRemoteMagic.data(), kRemoteMagic.size());
  PutLe<uint32_t>(p + 8, kRemoteFormatVersion);
  PutLe<uint32_t>(p + 12, h.parts);
  std::memcpy(p + 16, h.key.bytes.data(), kChunkKeyBytes);
  PutLe<uint64_t>(p + 32, h.payload_length);
  PutLe<uint64_t>(p + 40, h.part_bytes);
  PutLe<uint64_t>(p + 48, h.payload_checksum);
  PutLe<uint64_t>(p + 56, XXH3_64bits(p, kRemoteCheckedBytes));
  return out;
}

absl::StatusOr<RemoteHeader> ParseRemoteHeader(std::string_view bytes, const ChunkKey& expected_key) {
  if (bytes.size() != kRemoteHeaderBytes) {
    return absl::DataLossError(absl::StrCat("remote header is ", bytes.size(), " bytes; expected ", kRemoteHeaderBytes));
  }
  const char* p = bytes.data();
  if (std::memcmp(p, kRemoteMagic.data(), kRemoteMagic.size()) != 0) {
    return absl::DataLossError("remote header has a bad magic (not a Cake chunk)");
  }
  if (GetLe<uint64_t>(p + 56) != XXH3_64bits(p, kRemoteCheckedBytes)) {
    return absl::DataLossError("remote header checksum mismatch");
  }
  const uint32_t version = GetLe<uint32_t>(p + 8);
  if (version != kRemoteFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("remote chunk format version ", version, " is not known here"));
  }
  RemoteHeader h;
  h.parts = GetLe<uint32_t>(p + 12);
  std::memcpy(h.key.bytes.data(), p + 16, kChunkKeyBytes);
  h.payload_length = GetLe<uint64_t>(p + 32);
  h.part_bytes = GetLe<uint64_t>(p + 40);
  h.payload_checksum = GetLe<uint64_t>(p + 48);
  if (!(h.key == expected_key)) return absl::DataLossError("remote header names another chunk key");
  const uint64_t expected_parts = h.part_bytes == 0 ? 0 : (h.payload_length + h.part_bytes - 1) / h.part_bytes;
  if (h.part_bytes == 0 || h.parts != expected_parts) {
    return absl::DataLossError("remote header's part layout does not match its length");
  }
  return h;
}

// CRC16-XMODEM (polynomial 0x1021), the hash Redis Cluster maps keys to slots with.
uint16_t Crc16(std::string_view data) {
  uint16_t crc = 0;
  for (char c : data) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(c)) << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : crc << 1;
  }
  return crc;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Connection = std::unique_ptr<redisContext, ContextDeleter>;

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv;
  tv.tv_sec = ms.count() / 1000;
  tv.tv_usec = (ms.count() % 1000) * 1000;
  return tv;
}

bool IsError(const redisReply* r, std::string_view prefix) {
  return r != nullptr && r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).substr(0, prefix.size()) == prefix;
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381": the address at the end.
bool ParseRedirectTarget(const redisReply* r, std::string* host, int* port) {
  std::vector<absl::string_view> words = absl::StrSplit(absl::string_view(r->str, r->len), ' ');
  if (words.size() != 3) return false;
  const size_t colon = words[2].rfind(':');
  if (colon == absl::string_view::npos) return false;
  *host = std::string(words[2].substr(0, colon));
  return absl::SimpleAtoi(words[2].substr(colon + 1), port);
}

std::string GlobEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// One single-key command of a pipeline. Arguments are built when sent, so a value is never copied before hiredis
// formats it.
struct Command {
  std::string verb;
  std::string key;
  std::span<const std::byte> value;  // sent after the key when has_value
  bool has_value = false;
  std::vector<std::string> tail;
  int slot = 0;
  // For a GET whose value should land straight in the caller's buffer: a bulk reply of exactly this size is
  // received into it (reply: a string with len set and str null); any other reply is returned as usual.
  std::span<std::byte> sink;
};

// A reply made here rather than by hiredis' reader, freed by freeReplyObject like any other.
redisReply* NewReply(int type, std::string_view text = {}, long long integer = 0) {
  auto* r = static_cast<redisReply*>(calloc(1, sizeof(redisReply)));
  r->type = type;
  r->integer = integer;
  if (type == REDIS_REPLY_STRING || type == REDIS_REPLY_ERROR || type == REDIS_REPLY_STATUS) {
    r->str = static_cast<char*>(malloc(text.size() + 1));
    std::memcpy(r->str, text.data(), text.size());
    r->str[text.size()] = '\0';
    r->len = text.size();
  }
  return r;
}

// Reads the replies to GETs (and ASKING) straight from the socket, so a part's bytes go from the kernel into the
// caller's buffer in one copy. hiredis' reader would copy them twice more (into its buffer, then into a reply).
class DirectReplyReader {
 public:
  explicit DirectReplyReader(int fd) : fd_(fd) {}

  // One reply; a bulk reply of sink.size() bytes goes into sink. An error status for a broken connection.
  absl::StatusOr<redisReply*> Next(std::span<std::byte> sink) {
    auto line = Line();
    if (!line.ok()) return line.status();
    if (line->empty()) return absl::DataLossError("empty reply line");
    const char kind = (*line)[0];
    const std::string_view rest = std::string_view(*line).substr(1);
    switch (kind) {
      case '+':
        return NewReply(REDIS_REPLY_STATUS, rest);
      case '-':
        return NewReply(REDIS_REPLY_ERROR, rest);
      case ':': {
        long long value = 0;
        if (!absl::SimpleAtoi(absl::string_view(rest.data(), rest.size()), &value)) break;
        return NewReply(REDIS_REPLY_INTEGER, {}, value);
      }
      case '$': {
        long long length = 0;
        if (!absl::SimpleAtoi(absl::string_view(rest.data(), rest.size()), &length)) break;
        if (length < 0) return NewReply(REDIS_REPLY_NIL);
        redisReply* reply;
        if (static_cast<uint64_t>(length) == sink.size() && !sink.empty()) {
          if (absl::Status s = Exact(sink.data(), sink.size()); !s.ok()) return s;
          reply = NewReply(REDIS_REPLY_NIL);
          reply->type = REDIS_REPLY_STRING;  // landed in the sink: len set, str null
          reply->len = length;
        } else {
          std::string value(length, '\0');
          if (absl::Status s = Exact(reinterpret_cast<std::byte*>(value.data()), value.size()); !s.ok()) return s;
          reply = NewReply(REDIS_REPLY_STRING, value);
        }
        char crlf[2];
        if (absl::Status s = Exact(reinterpret_cast<std::byte*>(crlf), 2); !s.ok()) {
          freeReplyObject(reply);
          return s;
        }
        return reply;
      }
      default:
        break;
    }
    return absl::DataLossError(absl::StrCat("unexpected reply from Redis: ", *line));
  }

  // Bytes read past the last reply: a connection in that state is not reused.
  bool drained() const { return pos_ == end_; }

 private:
  absl::StatusOr<std::string> Line() {
    std::string line;
    while (true) {
      if (pos_ == end_) {
        if (absl::Status s = Fill(); !s.ok()) return s;
      }
      const char* start = buf_ + pos_;
      const char* nl = static_cast<const char*>(std::memchr(start, '\n', end_ - pos_));
      if (nl == nullptr) {
        line.append(start, end_ - pos_);
        pos_ = end_;
        continue;
      }
      line.append(start, nl - start);
      pos_ += nl - start + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return line;
    }
  }

  // n bytes into dst: what is buffered first, then straight from the socket.
  absl::Status Exact(std::byte* dst, size_t n) {
    const size_t buffered = std::min(n, end_ - pos_);
    std::memcpy(dst, buf_ + pos_, buffered);
    pos_ += buffered;
    size_t got = buffered;
    while (got < n) {
      const ssize_t r = recv(fd_, dst + got, n - got, 0);
      if (r > 0) {
        got += r;
      } else if (absl::Status s = Broken(r); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Fill() {
    while (true) {
      const ssize_t r = recv(fd_, buf_, sizeof(buf_), 0);
      if (r > 0) {
        pos_ = 0;
        end_ = r;
        return absl::OkStatus();
      }
      if (absl::Status s = Broken(r); !s.ok()) return s;
    }
  }

  // OK for an interrupted call (retry); the error otherwise.
  static absl::Status Broken(ssize_t r) {
    if (r == 0) return absl::UnavailableError("Server closed the connection");
    if (errno == EINTR) return absl::OkStatus();
    if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::DeadlineExceededError("timed out");
    return absl::UnavailableError(std::strerror(errno));
  }

  const int fd_;
  char buf_[16 << 10];
  size_t pos_ = 0, end_ = 0;
};

}  // namespace

int RedisKeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return Crc16(key) % kClusterSlots;
}

class RemoteTier::Impl {
 public:
  explicit Impl(const Options& options) : options_(options) {}

  struct Node {
    std::string host;
    int port = 0;
    std::string address;
    std::mutex mu;
    std::vector<Connection> idle;
    SteadyClock::time_point down_until{};
    std::chrono::milliseconds backoff{0};
    std::string last_error;
  };

  absl::Status AddSeed(const std::string& endpoint) {
    const size_t colon = endpoint.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("remote endpoint '", endpoint, "' is not host:port"));
    }
    NodeFor(endpoint.substr(0, colon), port);
    return absl::OkStatus();
  }

  // ---- keys of one chunk ----
  std::string Tag(const ChunkKey& key) const { return absl::StrCat(options_.key_prefix, "{", key.Hex(), "}:"); }
  static int Slot(const ChunkKey& key) { return Crc16(key.Hex()) % kClusterSlots; }
  uint64_t PartsFor(uint64_t bytes, uint64_t part_bytes) const { return (bytes + part_bytes - 1) / part_bytes; }

  Command Cmd(std::string verb, std::string key, int slot) const {
    Command c;
    c.verb = std::move(verb);
    c.key = std::move(key);
    c.slot = slot;
    return c;
  }

  // Runs single-key commands, each routed to the node owning its slot, pipelined per node, following MOVED and
  // ASK redirects. One reply per command, in order. UNAVAILABLE when a node cannot be reached or redirects loop;
  // with allow_partial, the commands of a node that cannot be reached get a null reply instead and the others
  // still run (a lookup still finds what the live nodes hold).
  absl::StatusOr<std::vector<Reply>> Execute(const std::vector<Command>& commands, bool allow_partial = false) {
    std::vector<Reply> replies(commands.size());
    std::vector<size_t> pending(commands.size());
    for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
    for (int round = 0; round < kMaxRedirects && !pending.empty(); ++round) {
      std::map<Node*, std::vector<size_t>> by_node;
      for (size_t i : pending) by_node[OwnerOf(commands[i].slot)].push_back(i);
      std::vector<size_t> again;
      std::map<Node*, std::vector<size_t>> asked;
      bool refresh = false;
      for (auto& [node, indices] : by_node) {
        auto got = RunPipeline(*node, commands, indices, /*asking=*/false);
        if (!got.ok() && allow_partial) continue;
        if (!got.ok()) return got.status();
        for (size_t k = 0; k < indices.size(); ++k) Route(commands, indices[k], std::move((*got)[k]), replies, again,
                                                         asked, refresh);
      }
      // An ASK is for one command only: the slot is moving, and this key has gone ahead to the target.
      for (auto& [node, indices] : asked) {
        auto got = RunPipeline(*node, commands, indices, /*asking=*/true);
        if (!got.ok() && allow_partial) continue;
        if (!got.ok()) return got.status();
        std::map<Node*, std::vector<size_t>> asked_again;
        for (size_t k = 0; k < indices.size(); ++k) Route(commands, indices[k], std::move((*got)[k]), replies, again,
                                                         asked_again, refresh);
        for (auto& [n, more] : asked_again) again.insert(again.end(), more.begin(), more.end());
      }
      if (refresh) RefreshSlotMap(/*force=*/false);
      pending = std::move(again);
    }
    if (!pending.empty()) {
      errors_++;
      return absl::UnavailableError(absl::StrCat("Redis kept redirecting after ", kMaxRedirects, " rounds"));
    }
    return replies;
  }

  // Refreshes the slot map from any node that answers CLUSTER SLOTS (at most every 100 ms unless forced). A node
  // without cluster support makes this a standalone remote.
  void RefreshSlotMap(bool force) {
    {
      std::lock_guard lock(mu_);
      const auto now = SteadyClock::now();
      if (!force && now - last_refresh_ < kMinSlotRefreshInterval) return;
      last_refresh_ = now;
    }
    for (Node* node : NodesSnapshot()) {
      Command slots = Cmd("CLUSTER", "SLOTS", 0);
      std::vector<size_t> only = {0};
      auto got = RunPipeline(*node, std::vector<Command>{slots}, only, false);
      if (!got.ok()) continue;
      const redisReply* r = (*got)[0].get();
      if (r->type == REDIS_REPLY_ERROR) {
        // "ERR This instance has cluster support disabled": a standalone Redis.
        std::lock_guard lock(mu_);
        slot_owner_.clear();
        return;
      }
      if (r->type != REDIS_REPLY_ARRAY) continue;
      std::vector<int> owners(kClusterSlots, -1);
      for (size_t i = 0; i < r->elements; ++i) {
        const redisReply* range = r->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
        const redisReply* master = range->element[2];
        if (master->type != REDIS_REPLY_ARRAY || master->elements < 2) continue;
        std::string host(master->element[0]->str ? master->element[0]->str : "", master->element[0]->len);
        if (host.empty() || host == "?") host = node->host;  // Redis 7 leaves it empty for "the node you asked"
        const int index = NodeIndex(host, static_cast<int>(master->element[1]->integer));
        const long long first = range->element[0]->integer, last = range->element[1]->integer;
        for (long long s = std::max(0LL, first); s <= std::min<long long>(last, kClusterSlots - 1); ++s) {
          owners[s] = index;
        }
      }
      std::lock_guard lock(mu_);
      slot_owner_ = std::move(owners);
      return;
    }
  }

  bool is_cluster() const {
    std::lock_guard lock(mu_);
    return !slot_owner_.empty();
  }

  std::vector<Node*> Masters() const {
    std::lock_guard lock(mu_);
    std::vector<Node*> out;
    if (slot_owner_.empty()) {
      out.push_back(nodes_.front().get());
      return out;
    }
    std::vector<bool> seen(nodes_.size(), false);
    for (int owner : slot_owner_) {
      if (owner >= 0 && !seen[owner]) {
        seen[owner] = true;
        out.push_back(nodes_[owner].get());
      }
    }
    return out;
  }

  // Runs commands[indices] on one node in one pipeline (each after an ASKING when asking).
  absl::StatusOr<std::vector<Reply>> RunPipeline(Node& node, const std::vector<Command>& commands,
                                                 const std::vector<size_t>& indices, bool asking) {
    auto conn = Checkout(node);
    if (!conn.ok()) return conn.status();
    redisContext* c = conn->get();
    std::vector<const char*> argv;
    std::vector<size_t> argvlen;
    for (size_t i : indices) {
      const Command& cmd = commands[i];
      if (asking) redisAppendCommand(c, "ASKING");
      argv.clear();
      argvlen.clear();
      auto add = [&](const char* p, size_t n) {
        argv.push_back(p);
        argvlen.push_back(n);
      };
      add(cmd.verb.data(), cmd.verb.size());
      add(cmd.key.data(), cmd.key.size());
      if (cmd.has_value) add(reinterpret_cast<const char*>(cmd.value.data()), cmd.value.size());
      for (const std::string& t : cmd.tail) add(t.data(), t.size());
      if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), argvlen.data()) != REDIS_OK) {
        return Fail(node, c);
      }
    }
    std::vector<Reply> replies;
    replies.reserve(indices.size());
    const bool direct = std::any_of(indices.begin(), indices.end(), [&](size_t i) { return !commands[i].sink.empty(); });
    if (direct) {
      // Send everything, then read the replies ourselves (hiredis' reader must hold nothing unread).
      int done = 0;
      while (!done) {
        if (redisBufferWrite(c, &done) != REDIS_OK) return Fail(node, c);
      }
      if (c->reader->pos != c->reader->len) return Fail(node, c, "unread bytes before a pipeline");
      auto reader = std::make_unique<DirectReplyReader>(c->fd);
      for (size_t i : indices) {
        if (asking) {
          auto ok = reader->Next({});
          if (!ok.ok()) return Fail(node, c, ok.status());
          freeReplyObject(*ok);
        }
        auto reply = reader->Next(commands[i].sink);
        if (!reply.ok()) return Fail(node, c, reply.status());
        replies.emplace_back(*reply);
      }
      if (!reader->drained()) return Fail(node, c, "bytes after the last reply");
      Return(node, std::move(*conn));
      return replies;
    }
    for (size_t k = 0; k < indices.size(); ++k) {
      void* raw = nullptr;
      if (asking) {
        if (redisGetReply(c, &raw) != REDIS_OK) return Fail(node, c);
        freeReplyObject(raw);  // ASKING's +OK
      }
      if (redisGetReply(c, &raw) != REDIS_OK) return Fail(node, c);
      replies.emplace_back(static_cast<redisReply*>(raw));
    }
    Return(node, std::move(*conn));
    return replies;
  }

  Options options_;
  std::atomic<uint64_t> errors_{0}, connects_{0}, fast_failures_{0}, moved_{0}, ask_{0}, corrupt_removed_{0};

  // Usage() cache.
  mutable std::mutex usage_mu_;
  TierUsage usage_;
  SteadyClock::time_point usage_at_{};

 private:
  void Route(const std::vector<Command>& commands, size_t i, Reply reply, std::vector<Reply>& replies,
             std::vector<size_t>& again, std::map<Node*, std::vector<size_t>>& asked, bool& refresh) {
    std::string host;
    int port = 0;
    if (IsError(reply.get(), "MOVED ") && ParseRedirectTarget(reply.get(), &host, &port)) {
      moved_++;
      refresh = true;
      SetOwner(commands[i].slot, NodeIndex(host, port));  // right away; the full refresh follows
      again.push_back(i);
    } else if (IsError(reply.get(), "ASK ") && ParseRedirectTarget(reply.get(), &host, &port)) {
      ask_++;
      asked[NodeFor(host, port)].push_back(i);
    } else if (IsError(reply.get(), "TRYAGAIN")) {
      again.push_back(i);  // a multi-key operation mid-migration; ours are single-key, but be safe
    } else {
      replies[i] = std::move(reply);
    }
  }

  absl::Status Fail(Node& node, redisContext* c, std::string_view why) {
    MarkDown(node, std::string(why));
    return absl::UnavailableError(absl::StrCat("Redis at ", node.address, ": ", std::string(why)));
  }
  absl::Status Fail(Node& node, redisContext* c, const absl::Status& status) {
    if (status.code() == absl::StatusCode::kDeadlineExceeded) {
      return Fail(node, c, absl::StrCat("no answer within ", options_.command_timeout.count(), " ms"));
    }
    return Fail(node, c, std::string_view(status.message().data(), status.message().size()));
  }
  absl::Status Fail(Node& node, redisContext* c) {
    // hiredis reports a socket timeout as EAGAIN's text; say what it means.
    const bool timed_out = c->err == REDIS_ERR_IO && std::strcmp(c->errstr, std::strerror(EAGAIN)) == 0;
    const std::string why = timed_out ? absl::StrCat("no answer within ", options_.command_timeout.count(), " ms")
                            : c->errstr[0] ? std::string(c->errstr)
                                           : "connection error";
    MarkDown(node, why);
    return absl::UnavailableError(absl::StrCat("Redis at ", node.address, ": ", why));
  }

  absl::StatusOr<Connection> Checkout(Node& node) {
    {
      std::lock_guard lock(node.mu);
      if (SteadyClock::now() < node.down_until) {
        fast_failures_++;
        return absl::UnavailableError(absl::StrCat("Redis at ", node.address, " is unreachable (", node.last_error,
                                                   "); retrying after a back-off"));
      }
      if (!node.idle.empty()) {
        Connection c = std::move(node.idle.back());
        node.idle.pop_back();
        return c;
      }
    }
    Connection c(redisConnectWithTimeout(node.host.c_str(), node.port, ToTimeval(options_.connect_timeout)));
    if (c == nullptr) {
      MarkDown(node, "out of memory");
      return absl::UnavailableError("hiredis could not allocate a connection");
    }
    if (c->err) return Fail(node, c.get());
    redisSetTimeout(c.get(), ToTimeval(options_.command_timeout));
    redisEnableKeepAlive(c.get());
    // Keep the reader's buffer between replies: parts are megabytes, and hiredis would otherwise free and regrow
    // it for every one.
    c->reader->maxbuf = 0;
    if (!options_.password.empty()) {
      Reply r(static_cast<redisReply*>(
          options_.user.empty()
              ? redisCommand(c.get(), "AUTH %b", options_.password.data(), options_.password.size())
              : redisCommand(c.get(), "AUTH %b %b", options_.user.data(), options_.user.size(),
                             options_.password.data(), options_.password.size())));
      if (r == nullptr) return Fail(node, c.get());
      if (r->type == REDIS_REPLY_ERROR) {
        const std::string why = absl::StrCat("AUTH refused: ", std::string(r->str, r->len));
        MarkDown(node, why);
        return absl::UnavailableError(absl::StrCat("Redis at ", node.address, ": ", why));
      }
    }
    connects_++;
    return c;
  }

  void Return(Node& node, Connection c) {
    std::lock_guard lock(node.mu);
    node.backoff = std::chrono::milliseconds(0);
    if (node.idle.size() < options_.connections) node.idle.push_back(std::move(c));
  }

  void MarkDown(Node& node, const std::string& why) {
    errors_++;
    bool first;
    std::chrono::milliseconds backoff;
    {
      std::lock_guard lock(node.mu);
      first = node.backoff.count() == 0;
      node.backoff = first ? std::chrono::duration_cast<std::chrono::milliseconds>(kFirstBackoff)
                           : std::min(node.backoff * 2, options_.max_backoff);
      backoff = node.backoff;
      node.down_until = SteadyClock::now() + node.backoff;
      node.last_error = why;
      node.idle.clear();  // a server that dropped one connection has likely dropped them all
    }
    if (first) spdlog::warn("remote tier: Redis at {} failed ({}); its chunks are misses, retrying in {} ms", node.address,
                            why, backoff.count());
  }

  Node* OwnerOf(int slot) {
    std::lock_guard lock(mu_);
    if (!slot_owner_.empty() && slot_owner_[slot] >= 0) return nodes_[slot_owner_[slot]].get();
    return nodes_.front().get();
  }

  void SetOwner(int slot, int index) {
    std::lock_guard lock(mu_);
    if (slot_owner_.empty()) slot_owner_.assign(kClusterSlots, -1);
    slot_owner_[slot] = index;
  }

  int NodeIndex(const std::string& host, int port) {
    std::lock_guard lock(mu_);
    return NodeIndexLocked(host, port);
  }
  Node* NodeFor(const std::string& host, int port) {
    std::lock_guard lock(mu_);
    return nodes_[NodeIndexLocked(host, port)].get();
  }
  int NodeIndexLocked(const std::string& host, int port) {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->host == host && nodes_[i]->port == port) return static_cast<int>(i);
    }
    auto node = std::make_unique<Node>();
    node->host = host;
    node->port = port;
    node->address = absl::StrCat(host, ":", port);
    nodes_.push_back(std::move(node));
    return static_cast<int>(nodes_.size() - 1);
  }
  std::vector<Node*> NodesSnapshot() {
    std::lock_guard lock(mu_);
    std::vector<Node*> out;
    for (auto& n : nodes_) out.push_back(n.get());
    return out;
  }

  mutable std::mutex mu_;
  // Nodes are never removed, so a Node* stays valid for the tier's life.
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<int> slot_owner_;  // index into nodes_ per slot; empty: not a cluster (everything goes to the seed)
  SteadyClock::time_point last_refresh_{};
};

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Open(const Options& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("remote tier: no Redis endpoint configured");
  if (options.key_prefix.find_first_of("{}") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote key prefix '", options.key_prefix, "' must not contain '{' or '}' (Redis hash tags)"));
  }
  if (options.part_bytes == 0) return absl::InvalidArgumentError("remote part_bytes must be above 0");
  if (options.part_bytes > (uint64_t{512} << 20)) {
    return absl::InvalidArgumentError("remote part_bytes must be at most 512 MiB (Redis's largest value)");
  }
  if (options.connections == 0) return absl::InvalidArgumentError("remote connections must be above 0");
  if (options.connect_timeout.count() <= 0 || options.command_timeout.count() <= 0) {
    return absl::InvalidArgumentError("remote timeouts must be above 0");
  }
  auto impl = std::make_unique<Impl>(options);
  for (const std::string& endpoint : options.endpoints) {
    if (absl::Status s = impl->AddSeed(endpoint); !s.ok()) return s;
  }
  impl->RefreshSlotMap(/*force=*/true);
  auto tier = std::unique_ptr<RemoteTier>(new RemoteTier(std::move(impl)));
  const auto masters = tier->impl_->Masters();
  const Counters s = tier->counters();
  if (s.errors > 0) {
    spdlog::warn("remote tier: Redis at {} does not answer yet; lookups there are misses until it does",
                 options.endpoints.front());
  } else if (tier->is_cluster()) {
    spdlog::info("remote tier: Redis Cluster with {} masters (seed {}), key prefix '{}', parts of {} bytes",
                 masters.size(), options.endpoints.front(), options.key_prefix, options.part_bytes);
  } else {
    spdlog::info("remote tier: Redis at {}, key prefix '{}', parts of {} bytes", options.endpoints.front(),
                 options.key_prefix, options.part_bytes);
  }
  return tier;
}

RemoteTier::RemoteTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteTier::~RemoteTier() = default;

bool RemoteTier::Contains(const ChunkKey& key) const { return ContainsEach(std::span(&key, 1))[0]; }

std::vector<bool> RemoteTier::ContainsEach(std::span<const ChunkKey> keys) const {
  std::vector<bool> found(keys.size(), false);
  if (keys.empty()) return found;
  std::vector<Command> commands;
  commands.reserve(keys.size());
  for (const ChunkKey& key : keys) commands.push_back(impl_->Cmd("EXISTS", impl_->Tag(key) + "h", Impl::Slot(key)));
  // An unreachable node holds nothing, as far as a lookup can tell.
  auto replies = impl_->Execute(commands, /*allow_partial=*/true);
  if (!replies.ok()) return found;
  for (size_t i = 0; i < keys.size(); ++i) {
    const redisReply* r = (*replies)[i].get();
    found[i] = r != nullptr && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
  }
  return found;
}

absl::Status RemoteTier::Read(const ChunkKey& key, std::span<std::byte> dst) {
  Impl& impl = *impl_;
  const std::string tag = impl.Tag(key);
  const int slot = Impl::Slot(key);
  // The header and every part in one pipeline, assuming this daemon's part size; a value written with another
  // part size takes a second round.
  auto part_commands = [&](uint64_t part_bytes, std::vector<Command>& commands) {
    const uint64_t parts = impl.PartsFor(dst.size(), part_bytes);
    for (uint64_t i = 0; i < parts; ++i) {
      Command get = impl.Cmd("GET", absl::StrCat(tag, i), slot);
      const uint64_t offset = i * part_bytes;
      get.sink = dst.subspan(offset, std::min<uint64_t>(part_bytes, dst.size() - offset));
      commands.push_back(std::move(get));
    }
  };
  std::vector<Command> commands;
  commands.push_back(impl.Cmd("GET", tag + "h", slot));
  part_commands(impl.options_.part_bytes, commands);
  auto replies = impl.Execute(commands);
  if (!replies.ok()) return replies.status();

  const redisReply* head = (*replies)[0].get();
  if (head->type == REDIS_REPLY_NIL) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in Redis"));
  if (head->type != REDIS_REPLY_STRING) {
    impl.errors_++;
    return absl::UnavailableError(absl::StrCat("Redis answered GET with ", head->type == REDIS_REPLY_ERROR
                                                                                 ? std::string(head->str, head->len)
                                                                                 : "a reply that is not a value"));
  }
  auto corrupt = [&](const std::string& why, uint64_t parts) {
    std::vector<Command> dels;
    dels.push_back(impl.Cmd("DEL", tag + "h", slot));
    for (uint64_t i = 0; i < parts; ++i) dels.push_back(impl.Cmd("DEL", absl::StrCat(tag, i), slot));
    (void)impl.Execute(dels);
    impl.corrupt_removed_++;
    return absl::DataLossError(absl::StrCat("remote chunk ", key.Hex(), ": ", why, "; removed"));
  };
  auto header = ParseRemoteHeader(std::string_view(head->str, head->len), key);
  if (header.status().code() == absl::StatusCode::kFailedPrecondition) return header.status();  // a newer writer's
  if (!header.ok()) return corrupt(std::string(header.status().message()), 0);
  if (header->payload_length != dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", key.Hex(), " holds ", header->payload_length,
                                                   " bytes; the destination has ", dst.size()));
  }
  if (header->part_bytes != impl.options_.part_bytes) {
    std::vector<Command> again;
    again.push_back(impl.Cmd("GET", tag + "h", slot));
    part_commands(header->part_bytes, again);
    replies = impl.Execute(again);
    if (!replies.ok()) return replies.status();
  }
  for (uint32_t i = 0; i < header->parts; ++i) {
    const redisReply* part = (*replies)[i + 1].get();
    const uint64_t offset = uint64_t{i} * header->part_bytes;
    const uint64_t expected = std::min<uint64_t>(header->part_bytes, dst.size() - offset);
    if (part->type != REDIS_REPLY_STRING || static_cast<uint64_t>(part->len) != expected) {
      return corrupt(absl::StrCat("part ", i, " is missing or the wrong size (evicted by Redis?)"), header->parts);
    }
    if (part->str != nullptr) std::memcpy(dst.data() + offset, part->str, expected);  // else it landed in place
  }
  if (PayloadChecksum(dst) != header->payload_checksum) return corrupt("payload checksum mismatch", header->parts);
  return absl::OkStatus();
}

absl::Status RemoteTier::Write(const ChunkKey& key, std::span<const std::byte> src) {
  Impl& impl = *impl_;
  const std::string tag = impl.Tag(key);
  const int slot = Impl::Slot(key);
  const uint64_t part_bytes = impl.options_.part_bytes;
  std::vector<std::string> expiry;
  if (impl.options_.ttl.count() > 0) expiry = {"EX", std::to_string(impl.options_.ttl.count())};

  RemoteHeader header;
  header.key = key;
  header.payload_length = src.size();
  header.part_bytes = part_bytes;
  header.parts = static_cast<uint32_t>(impl.PartsFor(src.size(), part_bytes));
  header.payload_checksum = PayloadChecksum(src);
  const std::string encoded = EncodeRemoteHeader(header);

  std::vector<Command> commands;
  for (uint32_t i = 0; i < header.parts; ++i) {
    Command c = impl.Cmd("SET", absl::StrCat(tag, i), slot);
    const uint64_t offset = uint64_t{i} * part_bytes;
    c.value = src.subspan(offset, std::min<uint64_t>(part_bytes, src.size() - offset));
    c.has_value = true;
    c.tail = expiry;
    commands.push_back(std::move(c));
  }
  // The header last: a reader that sees it sees every part written before it.
  Command head = impl.Cmd("SET", tag + "h", slot);
  head.value = std::as_bytes(std::span(encoded));
  head.has_value = true;
  head.tail = expiry;
  commands.push_back(std::move(head));

  auto replies = impl.Execute(commands);
  if (!replies.ok()) return replies.status();
  for (const Reply& r : *replies) {
    if (r->type == REDIS_REPLY_STATUS) continue;
    const std::string why = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "an unexpected reply";
    impl.errors_++;
    if (why.rfind("OOM", 0) == 0) {
      return absl::ResourceExhaustedError(absl::StrCat("Redis is full (maxmemory reached, noeviction?): ", why));
    }
    return absl::UnavailableError(absl::StrCat("Redis refused a write: ", why));
  }
  return absl::OkStatus();
}

absl::Status RemoteTier::Remove(const ChunkKey& key) {
  Impl& impl = *impl_;
  const std::string tag = impl.Tag(key);
  const int slot = Impl::Slot(key);
  auto replies = impl.Execute({impl.Cmd("GET", tag + "h", slot)});
  if (!replies.ok()) return replies.status();
  const redisReply* head = (*replies)[0].get();
  if (head->type == REDIS_REPLY_NIL) return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in Redis"));
  uint32_t parts = 0;
  if (head->type == REDIS_REPLY_STRING) {
    auto header = ParseRemoteHeader(std::string_view(head->str, head->len), key);
    if (header.ok()) parts = header->parts;
  }
  std::vector<Command> dels;
  dels.push_back(impl.Cmd("DEL", tag + "h", slot));  // first: the chunk is gone for readers before its parts are
  for (uint32_t i = 0; i < parts; ++i) dels.push_back(impl.Cmd("DEL", absl::StrCat(tag, i), slot));
  auto deleted = impl.Execute(dels);
  return deleted.ok() ? absl::OkStatus() : deleted.status();
}

TierUsage RemoteTier::Usage() const {
  Impl& impl = *impl_;
  std::lock_guard lock(impl.usage_mu_);
  const auto now = SteadyClock::now();
  if (impl.usage_at_ != SteadyClock::time_point{} && now - impl.usage_at_ < std::chrono::seconds(1)) {
    return impl.usage_;
  }
  TierUsage usage;
  for (Impl::Node* node : impl.Masters()) {
    auto replies = impl.RunPipeline(*node, {impl.Cmd("INFO", "memory", 0)}, {0}, false);
    if (!replies.ok() || (*replies)[0]->type != REDIS_REPLY_STRING) continue;
    for (absl::string_view line : absl::StrSplit(absl::string_view((*replies)[0]->str, (*replies)[0]->len), "\r\n")) {
      uint64_t value = 0;
      if (line.rfind("used_memory:", 0) == 0 && absl::SimpleAtoi(line.substr(12), &value)) usage.used_bytes += value;
      if (line.rfind("maxmemory:", 0) == 0 && absl::SimpleAtoi(line.substr(10), &value)) usage.capacity_bytes += value;
    }
  }
  impl.usage_ = usage;
  impl.usage_at_ = now;
  return usage;
}

void RemoteTier::ForEach(const std::function<void(const ChunkKey&, uint64_t)>& fn) const {
  Impl& impl = *impl_;
  const std::string pattern = GlobEscape(impl.options_.key_prefix) + "{*}:h";
  for (Impl::Node* node : impl.Masters()) {
    std::string cursor = "0";
    do {
      Command scan = impl.Cmd("SCAN", cursor, 0);
      scan.tail = {"MATCH", pattern, "COUNT", "1000"};
      auto replies = impl.RunPipeline(*node, {scan}, {0}, false);
      if (!replies.ok()) break;
      const redisReply* r = (*replies)[0].get();
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) break;
      cursor = std::string(r->element[0]->str, r->element[0]->len);
      const redisReply* keys = r->element[1];
      std::vector<Command> heads;
      std::vector<ChunkKey> chunk_keys;
      for (size_t i = 0; i < keys->elements; ++i) {
        std::string_view name(keys->element[i]->str, keys->element[i]->len);
        const size_t open = name.find('{', impl.options_.key_prefix.size());
        const size_t close = name.find('}', open);
        if (open == std::string_view::npos || close == std::string_view::npos) continue;
        auto key = ChunkKeyFromFileName(std::string(name.substr(open + 1, close - open - 1)) + std::string(kChunkFileSuffix));
        if (!key.ok()) continue;  // not one of ours
        chunk_keys.push_back(*key);
        heads.push_back(impl.Cmd("GET", std::string(name), Impl::Slot(*key)));
      }
      if (heads.empty()) continue;
      auto values = impl.Execute(heads);
      if (!values.ok()) break;
      for (size_t i = 0; i < heads.size(); ++i) {
        const redisReply* v = (*values)[i].get();
        if (v->type != REDIS_REPLY_STRING) continue;  // removed meanwhile
        auto header = ParseRemoteHeader(std::string_view(v->str, v->len), chunk_keys[i]);
        if (header.ok()) fn(chunk_keys[i], header->payload_length);
      }
    } while (cursor != "0");
  }
}

RemoteTier::Counters RemoteTier::counters() const {
  Counters s;
  s.errors = impl_->errors_.load();
  s.connects = impl_->connects_.load();
  s.fast_failures = impl_->fast_failures_.load();
  s.moved = impl_->moved_.load();
  s.ask = impl_->ask_.load();
  s.corrupt_removed = impl_->corrupt_removed_.load();
  return s;
}

TierStats RemoteTier::Stats() const {
  const Counters c = counters();
  TierStats stats;
  stats.corrupt_removed = c.corrupt_removed;
  stats.own = {{"errors", c.errors}, {"connects", c.connects}, {"fast_failures", c.fast_failures},
               {"moved", c.moved}, {"ask", c.ask}};
  return stats;
}

bool RemoteTier::is_cluster() const { return impl_->is_cluster(); }

}  // namespace cake
