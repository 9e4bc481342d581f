// UnixListener: the socket it binds, and which gRPC peer strings it recognises as its own connections.
#include "server/edge/unix_listener.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

namespace cake {

TEST_CASE("unix listener: binds with the mode asked and knows only its own connections", "[unix_listener]") {
  char dir[] = "/tmp/cake-listener-test-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/caked.sock";
  {
    auto listener = UnixListener::Bind(path, 0660);
    REQUIRE(listener.ok());
    struct stat st {};
    REQUIRE(stat(path.c_str(), &st) == 0);
    CHECK(S_ISSOCK(st.st_mode));
    CHECK((st.st_mode & 0777) == 0660);
    // A second daemon cannot bind over it.
    CHECK_FALSE(UnixListener::Bind(path, 0660).ok());
    // Nothing accepted yet: no peer string names a connection of ours, whatever the descriptor.
    for (const char* peer : {"fd:0", "fd:1", "fd:-1", "fd:", "fd:99999999999", "ipv4:127.0.0.1:5000", "unix:/x", ""}) {
      CHECK_FALSE((*listener)->PeerOf(peer).has_value());
    }
    CHECK((*listener)->accepted() == 0);
    (*listener)->Stop();  // never served: a no-op
  }
  std::filesystem::remove_all(dir);
}

}  // namespace cake
