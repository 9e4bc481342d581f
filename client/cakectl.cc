// cakectl: the operator's command line for a running caked.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "client/client.h"

int main(int argc, char** argv) {
  CLI::App app{"cakectl: inspect and manage a running caked"};
  std::string socket;
  app.add_option("--socket", socket, "the daemon's unix socket (default: the daemon's default)");
  cake::ClientOptions options;
  app.add_option("--address", options.address, "the daemon's TCP listener, host:port, instead of the socket");
  app.add_option("--tls-ca", options.tls_ca_file, "TCP: the CA that signed the daemon's certificate (PEM)");
  app.add_option("--tls-cert", options.tls_cert_file, "TCP: this client's certificate (PEM), for mTLS");
  app.add_option("--tls-key", options.tls_key_file, "TCP: this client's private key (PEM)");
  app.add_option("--token-file", options.token_file, "TCP: a file holding this client's bearer token");
  app.require_subcommand(1);
  auto* status = app.add_subcommand("status", "version, uptime, tiers, live loads and regions");
  auto* stats = app.add_subcommand("stats", "every counter, one per line");
  auto* ping = app.add_subcommand("ping", "exit 0 when the daemon answers");
  auto* evict = app.add_subcommand("evict", "drop every chunk of one tier");
  std::string evict_tier;
  evict->add_option("--tier", evict_tier, "dram, disk or remote (remote: every chunk under the daemon's key prefix)")
      ->required();
  auto* read_cap = app.add_subcommand("read-cap", "change a capped tier's read cap while the daemon runs");
  std::string cap_tier;
  double cap_gbps = 0;
  read_cap->add_option("--tier", cap_tier, "dram, disk or remote")->required();
  read_cap->add_option("--gbps", cap_gbps, "the new cap, Gbit/s")->required();
  CLI11_PARSE(app, argc, argv);

  options.socket_path = socket;
  options.client_id = "cakectl";
  auto client = cake::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "cakectl: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  if (status->parsed()) {
    auto text = (*client)->StatusText();
    if (!text.ok()) {
      std::fprintf(stderr, "cakectl: %s\n", text.status().ToString().c_str());
      return 1;
    }
    std::fputs(text->c_str(), stdout);
  } else if (stats->parsed()) {
    auto counters = (*client)->Stats();
    if (!counters.ok()) {
      std::fprintf(stderr, "cakectl: %s\n", counters.status().ToString().c_str());
      return 1;
    }
    for (const auto& [name, value] : *counters)
      std::printf("%s %llu\n", name.c_str(), static_cast<unsigned long long>(value));
  } else if (evict->parsed()) {
    auto evicted = (*client)->Evict(evict_tier);
    if (!evicted.ok()) {
      std::fprintf(stderr, "cakectl: %s\n", evicted.status().ToString().c_str());
      return 1;
    }
    std::printf("evicted %llu chunks from %s\n", static_cast<unsigned long long>(*evicted), evict_tier.c_str());
  } else if (read_cap->parsed()) {
    auto previous = (*client)->SetReadCap(cap_tier, cap_gbps);
    if (!previous.ok()) {
      std::fprintf(stderr, "cakectl: %s\n", previous.status().ToString().c_str());
      return 1;
    }
    std::printf("%s read cap: %g -> %g Gbit/s\n", cap_tier.c_str(), *previous, cap_gbps);
  } else if (ping->parsed()) {
    if (auto s = (*client)->Ping(); !s.ok()) {
      std::fprintf(stderr, "cakectl: %s\n", s.ToString().c_str());
      return 1;
    }
    std::puts("ok");
  }
  return 0;
}
