// An attacker on a caked's TLS port that has no credentials, from a source address of its choosing (a TCP peer is
// counted by its address; all of 127.0.0.0/8 is loopback). First it opens health Watch streams over a few
// connections (anyone may open those); then it opens connections that finish the TLS handshake and HTTP/2's (the
// preface, both SETTINGS and their acknowledgements) and make no call. It prints one line of counts and then holds
// every connection and stream it got, answering nothing (not even a stop's GOAWAY ping), until it is killed.
//
// Raw OpenSSL and hand-made HTTP/2 frames rather than a gRPC client: a gRPC channel cannot bind a source address,
// and one whose connection is closed at accept reconnects on its own, so the counts would drift. The integration
// suite runs it as another user (a test process may not run gRPC or OpenSSL between fork and exec).
//
// cake_flood_peer <daemon address A.B.C.D> <port> <source address A.B.C.D> <TLS connections> <Watch streams>
//                 <connections for the Watch streams>
//
// The line: "ready handshakes=<completed> handshakes_refused=<closed at accept or failed> watches=<answered with a
// status> watches_refused=<ended without one (RESOURCE_EXHAUSTED past a cap), or not answered within 5 s>
// watch_connections=<established>".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint8_t kData = 0x0, kHeaders = 0x1, kRstStream = 0x3, kSettings = 0x4, kPing = 0x6;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;
// Watch streams opened at once on a connection, all answered before the next batch: under the daemon's
// server.max_streams_per_connection (512) however many the connection carries.
constexpr int kWatchBatch = 64;

struct Frame {
  uint8_t type = 0;
  uint8_t flags = 0;
  uint32_t stream = 0;
  std::string payload;
};

std::string FrameBytes(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string out;
  const uint32_t length = static_cast<uint32_t>(payload.size());
  out.push_back(static_cast<char>(length >> 16));
  out.push_back(static_cast<char>(length >> 8));
  out.push_back(static_cast<char>(length));
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>(((stream & 0x7fffffff) >> shift) & 0xff));
  return out + payload;
}

// HPACK "literal header field without indexing, new name", no Huffman: every name and value here is < 127 bytes.
std::string Header(const std::string& name, const std::string& value) {
  return std::string(1, '\0') + static_cast<char>(name.size()) + name + static_cast<char>(value.size()) + value;
}

class Connection {
 public:
  ~Connection() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) ::close(fd_);
  }

  // TCP from `source`, then TLS (no client certificate; the server's is not checked: an attacker does not care).
  bool Open(SSL_CTX* ctx, const sockaddr_in& target, const sockaddr_in& source) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return false;
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    const timeval timeout{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    if (::bind(fd_, reinterpret_cast<const sockaddr*>(&source), sizeof(source)) != 0 ||
        ::connect(fd_, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) != 0) {
      return false;
    }
    ssl_ = SSL_new(ctx);
    SSL_set_fd(ssl_, fd_);
    SSL_set_tlsext_host_name(ssl_, "localhost");
    return SSL_connect(ssl_) == 1;
  }

  // The client preface and an empty SETTINGS; then the server's SETTINGS, acknowledged.
  bool StartHttp2() {
    if (!Write(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + FrameBytes(kSettings, 0, 0, ""))) return false;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    Frame frame;
    while (Clock::now() < deadline && Read(frame)) {
      if (frame.type == kSettings && (frame.flags & kAck) == 0) return Write(FrameBytes(kSettings, kAck, 0, ""));
    }
    return false;
  }

  // grpc.health.v1.Health/Watch for the whole daemon (service ""), on a stream of its own; returns its id.
  uint32_t StartWatch() {
    const uint32_t stream = next_stream_;
    next_stream_ += 2;
    const std::string headers = Header(":method", "POST") + Header(":scheme", "https") +
                                Header(":path", "/grpc.health.v1.Health/Watch") + Header(":authority", "localhost") +
                                Header("content-type", "application/grpc") + Header("te", "trailers");
    // An empty HealthCheckRequest: the gRPC message prefix (not compressed, 0 bytes) and nothing else.
    pending_ += FrameBytes(kHeaders, kEndHeaders, stream, headers) +
                FrameBytes(kData, kEndStream, stream, std::string(5, '\0'));
    return stream;
  }
  bool Flush() {
    const bool ok = Write(pending_);
    pending_.clear();
    return ok;
  }

  // The next frame, reading as needed (false on an error, the end, or 5 s without a byte). Answers PINGs while
  // the tool still reads; once it holds, it reads nothing more.
  bool Read(Frame& frame) {
    while (true) {
      if (buffer_.size() >= 9) {
        const auto* b = reinterpret_cast<const uint8_t*>(buffer_.data());
        const size_t length = (size_t{b[0]} << 16) | (size_t{b[1]} << 8) | b[2];
        if (buffer_.size() >= 9 + length) {
          frame.type = b[3];
          frame.flags = b[4];
          frame.stream = ((uint32_t{b[5]} & 0x7f) << 24) | (uint32_t{b[6]} << 16) | (uint32_t{b[7]} << 8) | b[8];
          frame.payload = buffer_.substr(9, length);
          buffer_.erase(0, 9 + length);
          if (frame.type == kPing && (frame.flags & kAck) == 0) Write(FrameBytes(kPing, kAck, 0, frame.payload));
          return true;
        }
      }
      char chunk[16384];
      const int n = SSL_read(ssl_, chunk, sizeof(chunk));
      if (n <= 0) return false;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  bool Write(const std::string& bytes) {
    const int size = static_cast<int>(bytes.size());
    return size == 0 || SSL_write(ssl_, bytes.data(), size) == size;
  }

  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::string buffer_;
  std::string pending_;
  uint32_t next_stream_ = 1;
};

sockaddr_in Address(const char* ip, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, ip, &addr.sin_addr) != 1) {
    std::fprintf(stderr, "not an IPv4 address: %s\n", ip);
    std::exit(64);
  }
  return addr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: %s <address> <port> <source address> <TLS connections> <Watch streams> "
                 "<connections for them>\n",
                 argv[0]);
    return 64;
  }
  const sockaddr_in target = Address(argv[1], std::atoi(argv[2]));
  const sockaddr_in source = Address(argv[3], 0);
  const int handshakes = std::atoi(argv[4]);
  const int watches = std::atoi(argv[5]);
  const int watch_connections = watches > 0 ? std::max(1, std::atoi(argv[6])) : 0;
  ::signal(SIGPIPE, SIG_IGN);  // a write to a connection the daemon closed fails, not kills

  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx, kAlpn, sizeof(kAlpn));
  std::vector<Connection*> held;  // never freed: held until the tool is killed

  // Watch streams first, spread evenly over their connections; each is answered with a status (served) or ended
  // at once (refused past server.max_health_watches_per_peer or server.max_health_watches).
  int watches_served = 0, watches_refused = 0, watch_connections_open = 0;
  for (int c = 0; c < watch_connections; ++c) {
    const int streams = watches / watch_connections + (c < watches % watch_connections ? 1 : 0);
    auto* connection = new Connection;
    if (!connection->Open(ctx, target, source) || !connection->StartHttp2()) {
      delete connection;
      ERR_clear_error();
      watches_refused += streams;  // never reached the daemon's health service
      continue;
    }
    ++watch_connections_open;
    held.push_back(connection);
    std::map<uint32_t, bool> open;  // stream -> answered with a message yet
    int sent = 0, undecided = 0;
    Frame frame;
    while (sent < streams || undecided > 0) {
      if (undecided == 0) {
        const int batch = std::min(kWatchBatch, streams - sent);
        for (int i = 0; i < batch; ++i) open[connection->StartWatch()] = false;
        sent += batch;
        undecided += batch;
        if (!connection->Flush()) break;
      }
      if (!connection->Read(frame)) break;
      auto it = open.find(frame.stream);
      if (it == open.end()) continue;
      if (frame.type == kData && !frame.payload.empty() && !it->second) {
        it->second = true;
        ++watches_served;
        --undecided;
      } else if ((frame.type == kHeaders && (frame.flags & kEndStream) != 0) || frame.type == kRstStream) {
        if (!it->second) {
          ++watches_refused;
          --undecided;
        }
        open.erase(it);
      }
    }
    undecided += streams - sent;
    watches_refused += undecided;  // no word within 5 s: not served
  }

  // Connections that finish both handshakes and call nothing.
  int completed = 0, refused = 0;
  for (int i = 0; i < handshakes; ++i) {
    auto* connection = new Connection;
    if (connection->Open(ctx, target, source) && connection->StartHttp2()) {
      ++completed;
      held.push_back(connection);
    } else {
      ++refused;
      delete connection;
      ERR_clear_error();
    }
  }
  std::printf("ready handshakes=%d handshakes_refused=%d watches=%d watches_refused=%d watch_connections=%d\n",
              completed, refused, watches_served, watches_refused, watch_connections_open);
  std::fflush(stdout);
  while (true) ::pause();
}
