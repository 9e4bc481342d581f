// Sends `count` Pings of `mib` MiB each to a caked, all at once, each on its own connection, and prints every
// call's outcome ("<code> <message> (<ms> ms)", one line each). A Ping that large is valid protobuf: PingRequest with
// an unknown field, which the daemon's parser keeps whole. The integration suite runs it as another user (gRPC does not
// survive fork), to see what a caller the daemon does not know can make it hold.
//
// Another method (health, reflection, a Load stream) takes the same bytes: an unknown field is valid in any message.
//
// cake_large_pings <target: unix:PATH or HOST:PORT> <count> <mib> [<CA file: TLS without a client certificate, or
//                  "-" for none> [<method: /package.Service/Method; /cake.v1.AdminService/Ping unless given>]]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"

namespace {

std::string Varint(uint64_t value) {
  std::string out;
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 6) return 64;
  const std::string target = argv[1];
  const int count = std::atoi(argv[2]);
  const uint64_t bytes = uint64_t(std::atoi(argv[3])) << 20;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  const std::string method = argc == 6 ? argv[5] : "/cake.v1.AdminService/Ping";
  if (argc >= 5 && std::string(argv[4]) != "-") {
    std::stringstream ca;
    ca << std::ifstream(argv[4]).rdbuf();
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ca.str();
    credentials = grpc::SslCredentials(options);
  }
  // One slice for every call: gRPC references it, so the tool holds the payload once.
  const grpc::Slice payload(Varint((1000 << 3) | 2) + Varint(bytes) + std::string(bytes, 'x'));
  struct Call {
    std::shared_ptr<grpc::Channel> channel;
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    std::chrono::steady_clock::time_point finished;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < count; ++i) {
    auto call = std::make_unique<Call>();
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    call->channel = grpc::CreateCustomChannel(target, credentials, args);
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    call->request = grpc::ByteBuffer(&payload, 1);
    calls.push_back(std::move(call));
  }
  const auto started = std::chrono::steady_clock::now();
  for (auto& call : calls) {
    grpc::GenericStub(call->channel)
        .UnaryCall(&call->context, method, grpc::StubOptions(), &call->request, &call->response,
                   [c = call.get()](grpc::Status s) {
                     c->finished = std::chrono::steady_clock::now();
                     c->done.set_value(std::move(s));
                   });
  }
  for (auto& call : calls) {
    const grpc::Status status = call->done.get_future().get();
    std::printf("%d %s (%.0f ms)\n", static_cast<int>(status.error_code()), status.error_message().c_str(),
                std::chrono::duration<double, std::milli>(call->finished - started).count());
  }
  // Not a return: tearing down channels that still hold most of a refused message to send takes gRPC up to 10 s.
  std::fflush(stdout);
  std::_Exit(0);
}
