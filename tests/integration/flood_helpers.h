// What the flood tests share: certificates for a TLS listener.
#pragma once

#include <string>

#include "tests/integration/fixture.h"

namespace cake::testing {

// A CA (`dir`/ca.pem) and a server certificate for localhost and 127.0.0.1 that it signed (`dir`/server.pem, its
// key `dir`/server.key, owner-only), made with openssl.
inline void MakeCertificates(const std::string& dir) {
  const std::string ec = "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1";
  const std::string in = "cd " + dir + " && ";
  REQUIRE(Run(in + ec + " -out ca.key").exit_code == 0);
  REQUIRE(Run(in + "openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj /CN=cake-test-ca").exit_code == 0);
  REQUIRE(Run(in + ec + " -out server.key && chmod 600 server.key").exit_code == 0);
  REQUIRE(Run(in + "openssl req -new -key server.key -out server.csr -subj /CN=localhost").exit_code == 0);
  WriteFile(dir, "server.ext", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  REQUIRE(Run(in + "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
                   "-days 2 -extfile server.ext")
              .exit_code == 0);
}

}  // namespace cake::testing
