// A program outside the Cake tree that links the installed client library (tests/package). Prints the package's
// version and the socket it would use; given a socket, it connects, pings, prints the daemon's status line with its
// version, and maps one host region, which exercises everything an engine links (gRPC, protobuf, shared memory).
#include <cstdio>
#include <cstring>
#include <string>

#include "client/client.h"

#ifndef CAKE_CONSUMER_VERSION
#define CAKE_CONSUMER_VERSION "unknown"
#endif

int main(int argc, char** argv) {
  std::printf("cake client library %s; default socket %s\n", CAKE_CONSUMER_VERSION, cake::DefaultSocketPath().c_str());
  if (argc < 2) return 0;

  auto client = cake::Client::Connect(cake::ClientOptions(argv[1], "cake-consumer"));
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  if (absl::Status ping = (*client)->Ping(); !ping.ok()) {
    std::fprintf(stderr, "ping: %s\n", ping.ToString().c_str());
    return 1;
  }
  auto status = (*client)->Status();
  if (!status.ok()) {
    std::fprintf(stderr, "status: %s\n", status.status().ToString().c_str());
    return 1;
  }
  std::printf("version: %s\n", status->version.c_str());

  auto region = (*client)->RegisterRegion(1 << 20);
  if (!region.ok()) {
    std::fprintf(stderr, "region: %s\n", region.status().ToString().c_str());
    return 1;
  }
  std::memset(region->data(), 0x5a, region->size());
  if (absl::Status released = (*client)->ReleaseRegion(*region); !released.ok()) {
    std::fprintf(stderr, "release: %s\n", released.ToString().c_str());
    return 1;
  }
  std::printf("mapped and released a %llu-byte host region\n", static_cast<unsigned long long>(region->size()));
  return 0;
}
