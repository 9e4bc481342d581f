// RedisClusterClient: connection pools, back-off, the slot map and redirects; hiredis connects, RunExchanges and
// RespParser carry the commands and replies.
#include "storage/redis/redis_cluster_client.h"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "storage/redis/socket_engine.h"

namespace cake {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr int kMaxRedirects = 4;
constexpr auto kFirstBackoff = std::chrono::milliseconds(50);
constexpr auto kMinSlotRefreshInterval = std::chrono::milliseconds(100);

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};

// One connection: hiredis made it (connect, timeouts, keep-alive); its replies go through its own parser, which
// is kept with it because a connection comes back to the pool only in step (the parser drained).
struct Connection {
  std::unique_ptr<redisContext, ContextDeleter> context;
  std::unique_ptr<RespParser> parser = std::make_unique<RespParser>();
  int fd() const { return context->fd; }
};

// Values up to this size are copied into the request text; longer ones are sent from where they are.
constexpr size_t kMaxCopiedValueBytes = 4 << 10;

// A pipeline's bytes in RESP: the protocol text in one buffer, long values referenced where they lie, so a
// part of a chunk reaches the socket without a copy (hiredis' formatting copies every argument).
class RequestBuilder {
 public:
  void Command(const RedisCommand& cmd) {
    Begin(2 + (cmd.has_value ? 1 : 0) + cmd.tail.size());
    Text(cmd.verb);
    Text(cmd.key);
    if (cmd.has_value) Value(cmd.value);
    for (const std::string& t : cmd.tail) Text(t);
  }
  void Command(const std::vector<std::string>& argv) {
    Begin(argv.size());
    for (const std::string& a : argv) Text(a);
  }

  // The pieces to send, pointing into this builder (which must outlive the send) and into the values.
  std::vector<iovec> Pieces() {
    std::vector<iovec> out;
    size_t text_at = 0;
    for (const Outside& v : outside_) {
      if (v.text_offset > text_at) out.push_back({text_.data() + text_at, v.text_offset - text_at});
      out.push_back({const_cast<std::byte*>(v.value.data()), v.value.size()});
      text_at = v.text_offset;
    }
    if (text_.size() > text_at) out.push_back({text_.data() + text_at, text_.size() - text_at});
    return out;
  }

 private:
  struct Outside {
    size_t text_offset;  // where in the text it goes
    std::span<const std::byte> value;
  };
  void Begin(size_t argc) { absl::StrAppend(&text_, "*", argc, "\r\n"); }
  void Text(std::string_view arg) {
    absl::StrAppend(&text_, "$", arg.size(), "\r\n", absl::string_view(arg.data(), arg.size()), "\r\n");
  }
  void Value(std::span<const std::byte> value) {
    if (value.size() <= kMaxCopiedValueBytes) {
      return Text(std::string_view(reinterpret_cast<const char*>(value.data()), value.size()));
    }
    absl::StrAppend(&text_, "$", value.size(), "\r\n");
    outside_.push_back({text_.size(), value});
    text_ += "\r\n";
  }

  std::string text_;
  std::vector<Outside> outside_;
};

// CRC16-XMODEM (polynomial 0x1021), the hash Redis Cluster maps keys to slots with.
uint16_t Crc16(std::string_view data) {
  uint16_t crc = 0;
  for (char c : data) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(c)) << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : crc << 1;
  }
  return crc;
}

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv;
  tv.tv_sec = ms.count() / 1000;
  tv.tv_usec = (ms.count() % 1000) * 1000;
  return tv;
}

bool IsError(const redisReply* r, std::string_view prefix) {
  return r != nullptr && r->type == REDIS_REPLY_ERROR &&
         std::string_view(r->str, r->len).substr(0, prefix.size()) == prefix;
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

}  // namespace

int RedisKeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return Crc16(key) % kRedisClusterSlots;
}

struct RedisClusterClient::Node {
  std::string host;
  int port = 0;
  std::string address;
  Mutex mu;
  std::vector<Connection> idle ABSL_GUARDED_BY(mu);
  SteadyClock::time_point down_until ABSL_GUARDED_BY(mu){};
  std::chrono::milliseconds backoff ABSL_GUARDED_BY(mu){0};
  std::string last_error ABSL_GUARDED_BY(mu);
};

class RedisClusterClient::Impl {
 public:
  explicit Impl(const Options& options) : options_(options) {}
  ~Impl() {
    {
      MutexLock lock(&probe_mu_);
      stopping_ = true;
    }
    probe_wake_.SignalAll();
    if (prober_.joinable()) prober_.join();
  }

  absl::Status AddSeed(const std::string& endpoint) {
    const size_t colon = endpoint.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("endpoint '", endpoint, "' is not host:port"));
    }
    MutexLock lock(&mu_);
    if (NodeIndexLocked(endpoint.substr(0, colon), port) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxNodes, " Redis endpoints"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<RedisReply>> Execute(const std::vector<RedisCommand>& commands, bool allow_partial) {
    std::vector<int> slots(commands.size());
    for (size_t i = 0; i < commands.size(); ++i) slots[i] = RedisKeySlot(commands[i].key);
    std::vector<RedisReply> replies(commands.size());
    std::vector<size_t> pending(commands.size());
    for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
    // A refresh forced by a refused redirect happens at most once a call, so a hostile node costs a call one
    // CLUSTER SLOTS more, not one per round.
    bool forced_once = false;
    for (int round = 0; round < kMaxRedirects && !pending.empty(); ++round) {
      std::vector<size_t> again;
      bool refresh = false;
      bool force = false;
      // A round is two passes: every pending command to its slot's owner, then the ones answered ASK to the node
      // named, each after an ASKING. An ASK is for one command only: the slot is moving, and this key has gone
      // ahead to the target. An ASK answered with another ASK waits for the next round, like a MOVED.
      std::map<Node*, std::vector<size_t>> to_send;
      for (size_t i : pending) to_send[OwnerOf(slots[i])].push_back(i);
      for (const bool asking : {false, true}) {
        if (to_send.empty()) break;
        std::vector<NodeBatch> batches;
        for (auto& [node, indices] : to_send) batches.push_back(NodeBatch{node, std::move(indices)});
        RunBatches(batches, commands, asking);
        std::map<Node*, std::vector<size_t>> to_ask;
        for (NodeBatch& batch : batches) {
          if (!batch.replies.ok()) {
            // A node that cannot be reached sends no MOVED: if it died and a replica took its slots over, only
            // another node's slot map says so. Asked now (at most every 100 ms, skipping nodes that are down), so
            // calls go to the new master once the cluster has promoted it, instead of failing for as long as the
            // dead node stays in our map.
            RefreshSlotMapAfterFailure();
            if (allow_partial) continue;
            return batch.replies.status();
          }
          std::map<Node*, std::vector<size_t>> asked;
          for (size_t k = 0; k < batch.indices.size(); ++k) {
            const size_t i = batch.indices[k];
            RedisReply& reply = (*batch.replies)[k];
            const RouteVerdict verdict = Route(slots[i], reply.get());
            refresh = refresh || verdict.refresh;
            force = force || verdict.force;
            switch (verdict.next) {
              case RouteVerdict::kReply:
                replies[i] = std::move(reply);
                break;
              case RouteVerdict::kAgain:
                again.push_back(i);
                break;
              case RouteVerdict::kAsk:
                asked[verdict.ask].push_back(i);
                break;
            }
          }
          for (auto& [node, indices] : asked) {
            std::vector<size_t>& into = asking ? again : to_ask[node];
            into.insert(into.end(), indices.begin(), indices.end());
          }
        }
        to_send = std::move(to_ask);
      }
      // A redirect to a node we do not know yet is, after a failover, the replica that took over: its address
      // comes only from a fresh map, and waiting out the 100 ms would spend this call's rounds on the same refusal.
      if (force && !forced_once) {
        forced_once = true;
        RefreshSlotMap(/*force=*/true);
      } else if (refresh) {
        RefreshSlotMap(/*force=*/false);
      }
      pending = std::move(again);
    }
    if (!pending.empty()) {
      errors_++;
      return absl::UnavailableError(absl::StrCat("Redis kept redirecting after ", kMaxRedirects, " rounds"));
    }
    return replies;
  }

  // From any node that answers CLUSTER SLOTS (at most every 100 ms unless forced). A node without cluster support
  // makes this a standalone client.
  void RefreshSlotMap(bool force) {
    {
      MutexLock lock(&mu_);
      const auto now = SteadyClock::now();
      if (!force && now - last_refresh_ < kMinSlotRefreshInterval) return;
      last_refresh_ = now;
    }
    for (Node* node : NodesSnapshot()) {
      {
        // A node backing off would refuse the call anyway (and count a fast failure no caller made); a dead seed
        // must not hold up the map the others can give.
        MutexLock lock(&node->mu);
        if (node->backoff.count() > 0) continue;
      }
      RedisCommand slots;
      slots.verb = "CLUSTER";
      slots.key = "SLOTS";
      auto got = RunPipeline(*node, std::vector<RedisCommand>{slots}, {0}, false);
      if (!got.ok()) continue;
      const redisReply* r = (*got)[0].get();
      if (r->type == REDIS_REPLY_ERROR) {
        // "ERR This instance has cluster support disabled": a standalone Redis.
        MutexLock lock(&mu_);
        slot_owner_.clear();
        return;
      }
      if (r->type != REDIS_REPLY_ARRAY) continue;
      std::vector<int> owners(kRedisClusterSlots, -1);
      for (size_t i = 0; i < r->elements; ++i) {
        const redisReply* range = r->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
        const redisReply* master = range->element[2];
        if (master->type != REDIS_REPLY_ARRAY || master->elements < 2) continue;
        const redisReply* host_reply = master->element[0];
        const redisReply* port_reply = master->element[1];
        if (host_reply->type != REDIS_REPLY_STRING || host_reply->len > 255 ||
            port_reply->type != REDIS_REPLY_INTEGER || port_reply->integer <= 0 || port_reply->integer > 65535) {
          continue;  // not a node address
        }
        std::string host(host_reply->str, host_reply->len);
        if (host.empty() || host == "?") host = node->host;  // Redis 7 leaves it empty for "the node you asked"
        const int index = NodeIndex(host, static_cast<int>(port_reply->integer));
        if (index < 0) continue;  // more nodes than any cluster has: the rest of the map is not believed
        const long long first = range->element[0]->integer, last = range->element[1]->integer;
        for (long long s = std::max(0LL, first); s <= std::min<long long>(last, kRedisClusterSlots - 1); ++s) {
          owners[s] = index;
        }
      }
      MutexLock lock(&mu_);
      slot_owner_ = std::move(owners);
      return;
    }
  }

  bool is_cluster() const {
    MutexLock lock(&mu_);
    return !slot_owner_.empty();
  }

  // After a node failed a call: a cluster's map is asked again (rate-limited); a standalone server has no other
  // node to ask.
  void RefreshSlotMapAfterFailure() {
    if (is_cluster()) RefreshSlotMap(/*force=*/false);
  }

  std::vector<Node*> Masters() const {
    MutexLock lock(&mu_);
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

  // One node's share of a round: which commands, and what came of them.
  struct NodeBatch {
    Node* node = nullptr;
    std::vector<size_t> indices;  // into the commands
    absl::StatusOr<std::vector<RedisReply>> replies = std::vector<RedisReply>();
  };

  // Runs every batch's commands on its node, each node in one pipeline (each command after an ASKING when
  // asking), all nodes at once from this thread. A node that cannot be reached, fails or stalls fails its own
  // batch (and is marked down); the others are answered.
  void RunBatches(std::vector<NodeBatch>& batches, const std::vector<RedisCommand>& commands, bool asking) {
    struct Live {
      NodeBatch* batch;
      Connection conn;
      RequestBuilder request;
    };
    std::vector<Live> live;
    live.reserve(batches.size());
    for (NodeBatch& batch : batches) {
      auto conn = Checkout(*batch.node);
      if (!conn.ok()) {
        batch.replies = conn.status();
        continue;
      }
      Live& l = live.emplace_back(Live{&batch, std::move(*conn), RequestBuilder()});
      for (size_t i : batch.indices) {
        if (asking) {
          l.request.Command(std::vector<std::string>{"ASKING"});
          l.conn.parser->Expect({});
        }
        l.request.Command(commands[i]);
        l.conn.parser->Expect(commands[i].sink, commands[i].on_landed ? &commands[i].on_landed : nullptr);
      }
    }
    std::vector<SocketExchange> exchanges(live.size());
    for (size_t k = 0; k < live.size(); ++k) {
      exchanges[k].fd = live[k].conn.fd();
      exchanges[k].request = live[k].request.Pieces();
      exchanges[k].parser = live[k].conn.parser.get();
    }
    if (!exchanges.empty()) {
      RunExchanges(ThisThreadSocketEngine(options_.use_io_uring), exchanges, options_.command_timeout);
    }
    for (size_t k = 0; k < live.size(); ++k) {
      Node& node = *live[k].batch->node;
      RespParser& parser = *live[k].conn.parser;
      if (!exchanges[k].status.ok()) {
        live[k].batch->replies = Fail(node, exchanges[k].status);
        continue;
      }
      std::vector<RedisReply> replies;
      replies.reserve(live[k].batch->indices.size());
      bool in_step = true;
      while (parser.has_reply()) {
        RedisReply reply = parser.PopReply();
        if (asking) {
          in_step = in_step && reply->type == REDIS_REPLY_STATUS;
          reply = parser.PopReply();
        }
        replies.push_back(std::move(reply));
      }
      if (!in_step) {
        live[k].batch->replies = Fail(node, "ASKING was not answered +OK");
      } else if (!parser.drained()) {
        live[k].batch->replies = Fail(node, "bytes after the last reply");
      } else {
        live[k].batch->replies = std::move(replies);
        Return(node, std::move(live[k].conn));
      }
    }
  }

  // Runs commands[indices] on one node in one pipeline (each after an ASKING when asking).
  absl::StatusOr<std::vector<RedisReply>> RunPipeline(Node& node, const std::vector<RedisCommand>& commands,
                                                      const std::vector<size_t>& indices, bool asking) {
    std::vector<NodeBatch> batches(1);
    batches[0].node = &node;
    batches[0].indices = indices;
    RunBatches(batches, commands, asking);
    return std::move(batches[0].replies);
  }

  // One command on a connection not yet handed out (AUTH, a probe's PING).
  absl::StatusOr<RedisReply> RoundTrip(Node& node, Connection& conn, const std::vector<std::string>& argv) {
    RequestBuilder request;
    request.Command(argv);
    conn.parser->Expect({});
    SocketExchange exchange;
    exchange.fd = conn.fd();
    exchange.request = request.Pieces();
    exchange.parser = conn.parser.get();
    RunExchanges(ThisThreadSocketEngine(options_.use_io_uring), std::span(&exchange, 1), options_.command_timeout);
    if (!exchange.status.ok()) return Fail(node, exchange.status);
    RedisReply reply = conn.parser->PopReply();
    if (!conn.parser->drained()) return Fail(node, "bytes after the reply");
    return reply;
  }

  Counters counters() const {
    Counters s;
    s.errors = errors_.load();
    s.connects = connects_.load();
    s.fast_failures = fast_failures_.load();
    s.moved = moved_.load();
    s.ask = ask_.load();
    s.redirects_refused = redirects_refused_.load();
    return s;
  }

 private:
  // What one reply means for its command, from Route.
  struct RouteVerdict {
    enum Next { kReply, kAgain, kAsk };
    Next next = kReply;    // the reply is the command's; send it again next round; or ask `ask` this round
    Node* ask = nullptr;   // kAsk: the node an ASK named
    bool refresh = false;  // ask for the slot map after this round
    bool force = false;    // and without waiting out the 100 ms
  };

  // Counts and logs a redirect, and takes a MOVED's new owner into the map at once.
  RouteVerdict Route(int slot, const redisReply* reply) {
    std::string host;
    int port = 0;
    const bool moved = IsError(reply, "MOVED ") && ParseRedirectTarget(reply, &host, &port);
    const bool ask = !moved && IsError(reply, "ASK ") && ParseRedirectTarget(reply, &host, &port);
    const int target = moved || ask ? KnownNodeIndex(host, port) : -1;
    if ((moved || ask) && target < 0) {
      // Only the cluster's own map (from the seeds) names nodes: a redirect anywhere else could send our
      // password to whoever asks. Ask the map again; the command goes where it says.
      if (redirects_refused_++ == 0) {
        spdlog::warn("{}: a Redis redirect to {}:{}, which no seed or slot map named, was not followed",
                     options_.log_name, host, port);
      }
      return RouteVerdict{.next = RouteVerdict::kAgain, .refresh = true, .force = true};
    }
    if (moved) {
      moved_++;
      SetOwner(slot, target);  // right away; the full refresh follows
      return RouteVerdict{.next = RouteVerdict::kAgain, .refresh = true};
    }
    if (ask) {
      ask_++;
      return RouteVerdict{.next = RouteVerdict::kAsk, .ask = NodeAt(target)};
    }
    if (IsError(reply, "TRYAGAIN")) {
      // A multi-key operation mid-migration; ours are single-key, but be safe.
      return RouteVerdict{.next = RouteVerdict::kAgain};
    }
    return RouteVerdict{};
  }

  absl::Status Fail(Node& node, std::string_view why) {
    MarkDown(node, std::string(why));
    return absl::UnavailableError(absl::StrCat("Redis at ", node.address, ": ", std::string(why)));
  }
  absl::Status Fail(Node& node, const absl::Status& status) {
    if (status.code() == absl::StatusCode::kDeadlineExceeded) {
      return Fail(node, absl::StrCat("no answer within ", options_.command_timeout.count(), " ms"));
    }
    return Fail(node, std::string_view(status.message().data(), status.message().size()));
  }
  // A failure hiredis reported on c (while connecting: everything after goes through RunExchanges).
  absl::Status FailIo(Node& node, redisContext* c) {
    // hiredis reports a socket timeout as EAGAIN's text; say what it means.
    const bool timed_out = c->err == REDIS_ERR_IO && std::strcmp(c->errstr, std::strerror(EAGAIN)) == 0;
    const std::string why = timed_out      ? absl::StrCat("no answer within ", options_.connect_timeout.count(), " ms")
                            : c->errstr[0] ? std::string(c->errstr)
                                           : "connection error";
    MarkDown(node, why);
    return absl::UnavailableError(absl::StrCat("Redis at ", node.address, ": ", why));
  }

  absl::StatusOr<Connection> Checkout(Node& node) {
    {
      MutexLock lock(&node.mu);
      // A node that failed stays down until the prober has seen it answer: no caller waits to find out (a
      // frozen Redis would cost each one the whole command timeout).
      if (node.backoff.count() > 0) {
        fast_failures_++;
        return absl::UnavailableError(absl::StrCat("Redis at ", node.address, " is unreachable (", node.last_error,
                                                   "); probing it in the background"));
      }
      if (!node.idle.empty()) {
        Connection c = std::move(node.idle.back());
        node.idle.pop_back();
        return c;
      }
    }
    return Connect(node);
  }

  // A new connection, authenticated. Failures mark the node down.
  absl::StatusOr<Connection> Connect(Node& node) {
    Connection c;
    c.context.reset(redisConnectWithTimeout(node.host.c_str(), node.port, ToTimeval(options_.connect_timeout)));
    if (c.context == nullptr) {
      MarkDown(node, "out of memory");
      return absl::UnavailableError("hiredis could not allocate a connection");
    }
    if (c.context->err) return FailIo(node, c.context.get());
    redisEnableKeepAlive(c.context.get());
    if (!options_.password.empty()) {
      std::vector<std::string> auth = {"AUTH"};
      if (!options_.user.empty()) auth.push_back(options_.user);
      auth.push_back(options_.password);
      CAKE_ASSIGN_OR_RETURN(const RedisReply r, RoundTrip(node, c, auth));
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
    MutexLock lock(&node.mu);
    node.backoff = std::chrono::milliseconds(0);
    if (node.idle.size() < options_.connections) node.idle.push_back(std::move(c));
  }

  void MarkDown(Node& node, const std::string& why) {
    errors_++;
    bool first;
    std::chrono::milliseconds backoff;
    {
      MutexLock lock(&node.mu);
      first = node.backoff.count() == 0;
      node.backoff = first ? std::chrono::duration_cast<std::chrono::milliseconds>(kFirstBackoff)
                           : std::min(node.backoff * 2, options_.max_backoff);
      backoff = node.backoff;
      node.down_until = SteadyClock::now() + node.backoff;
      node.last_error = why;
      node.idle.clear();  // a server that dropped one connection has likely dropped them all
    }
    if (first) {
      spdlog::warn("{}: Redis at {} failed ({}); calls to it fail at once until it answers a probe (first in {} ms)",
                   options_.log_name, node.address, why, backoff.count());
    }
    MutexLock lock(&probe_mu_);
    if (!prober_.joinable() && !stopping_) prober_ = std::thread([this] { ProbeDownNodes(); });
    probe_wake_.SignalAll();
  }

  // The one thread that tries nodes marked down, each when its back-off ends: a PING over a new connection
  // brings a node back; a failure doubles its back-off (up to max_backoff).
  void ProbeDownNodes() {
    MutexLock lock(&probe_mu_);
    while (!stopping_) {
      Node* due = nullptr;
      SteadyClock::time_point next = SteadyClock::time_point::max();
      for (Node* node : NodesSnapshot()) {
        MutexLock node_lock(&node->mu);
        if (node->backoff.count() > 0 && node->down_until < next) {
          next = node->down_until;
          due = node;
        }
      }
      if (due == nullptr) {
        probe_wake_.Wait(&probe_mu_);
      } else if (next > SteadyClock::now()) {
        probe_wake_.WaitUntil(&probe_mu_, next);
      } else {
        probe_mu_.Unlock();  // a probe waits on the network
        Probe(*due);
        probe_mu_.Lock();
      }
    }
  }

  void Probe(Node& node) {
    auto conn = Connect(node);
    if (!conn.ok()) return;  // Connect marked it down again
    auto pong = RoundTrip(node, *conn, {"PING"});
    if (!pong.ok()) return;  // RoundTrip marked it down again
    if ((*pong)->type == REDIS_REPLY_ERROR) return (void)Fail(node, std::string_view((*pong)->str, (*pong)->len));
    spdlog::info("{}: Redis at {} answers again", options_.log_name, node.address);
    Return(node, std::move(*conn));
  }

  Node* OwnerOf(int slot) {
    MutexLock lock(&mu_);
    if (!slot_owner_.empty() && slot_owner_[slot] >= 0) return nodes_[slot_owner_[slot]].get();
    return nodes_.front().get();
  }

  void SetOwner(int slot, int index) {
    MutexLock lock(&mu_);
    if (slot_owner_.empty()) slot_owner_.assign(kRedisClusterSlots, -1);
    slot_owner_[slot] = index;
  }

  // The node at host:port, added when it is new (seeds and slot maps only: the sources trusted to name nodes);
  // -1 when the list is full.
  int NodeIndex(const std::string& host, int port) {
    MutexLock lock(&mu_);
    return NodeIndexLocked(host, port);
  }
  int NodeIndexLocked(const std::string& host, int port) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->host == host && nodes_[i]->port == port) return static_cast<int>(i);
    }
    if (nodes_.size() >= kMaxNodes) return -1;
    auto node = std::make_unique<Node>();
    node->host = host;
    node->port = port;
    node->address = absl::StrCat(host, ":", port);
    nodes_.push_back(std::move(node));
    return static_cast<int>(nodes_.size() - 1);
  }
  // A node already known, never added: -1 otherwise.
  int KnownNodeIndex(const std::string& host, int port) {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->host == host && nodes_[i]->port == port) return static_cast<int>(i);
    }
    return -1;
  }
  Node* NodeAt(int index) {
    MutexLock lock(&mu_);
    return nodes_[index].get();
  }
  std::vector<Node*> NodesSnapshot() {
    MutexLock lock(&mu_);
    std::vector<Node*> out;
    for (auto& n : nodes_) out.push_back(n.get());
    return out;
  }

  const Options options_;
  Mutex probe_mu_;
  CondVar probe_wake_;
  bool stopping_ ABSL_GUARDED_BY(probe_mu_) = false;
  std::thread prober_;  // started by the first failure
  std::atomic<uint64_t> errors_{0}, connects_{0}, fast_failures_{0}, moved_{0}, ask_{0}, redirects_refused_{0};

  mutable Mutex mu_;
  // Nodes are never removed, so a Node* stays valid for the client's life.
  std::vector<std::unique_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  // Index into nodes_ per slot; empty: not a cluster (everything goes to the seed).
  std::vector<int> slot_owner_ ABSL_GUARDED_BY(mu_);
  SteadyClock::time_point last_refresh_ ABSL_GUARDED_BY(mu_){};
};

absl::StatusOr<std::unique_ptr<RedisClusterClient>> RedisClusterClient::Open(const Options& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no Redis endpoint configured");
  if (options.connections == 0) return absl::InvalidArgumentError("connections must be above 0");
  if (options.connect_timeout.count() <= 0 || options.command_timeout.count() <= 0) {
    return absl::InvalidArgumentError("timeouts must be above 0");
  }
  auto impl = std::make_unique<Impl>(options);
  for (const std::string& endpoint : options.endpoints) {
    CAKE_RETURN_IF_ERROR(impl->AddSeed(endpoint));
  }
  impl->RefreshSlotMap(/*force=*/true);
  return std::unique_ptr<RedisClusterClient>(new RedisClusterClient(std::move(impl)));
}

RedisClusterClient::RedisClusterClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RedisClusterClient::~RedisClusterClient() = default;

absl::StatusOr<std::vector<RedisReply>> RedisClusterClient::Execute(const std::vector<RedisCommand>& commands,
                                                                    bool allow_partial) {
  return impl_->Execute(commands, allow_partial);
}

std::vector<RedisClusterClient::Node*> RedisClusterClient::Masters() const { return impl_->Masters(); }

absl::StatusOr<RedisReply> RedisClusterClient::RunOn(Node& node, const RedisCommand& command) {
  auto replies = impl_->RunPipeline(node, {command}, {0}, /*asking=*/false);
  if (!replies.ok()) return replies.status();
  return std::move((*replies)[0]);
}

RedisClusterClient::Counters RedisClusterClient::counters() const { return impl_->counters(); }

bool RedisClusterClient::is_cluster() const { return impl_->is_cluster(); }

}  // namespace cake
