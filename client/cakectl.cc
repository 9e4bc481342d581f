// cakectl: the operator's command line for a running caked.
//
// Exit status: 0 done; 1 the daemon refused or failed the call (its message on stderr), health is NOT_SERVING, or
// verify found bad chunks; 2 bad usage; 3 no daemon answers (not running, wrong socket or address, or unreachable),
// or the only socket found was refused as unsafe (a folder another user controls).
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "base/strategy.h"
#include "cake/v1/admin.grpc.pb.h"
#include "client/client.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/wire_enums.h"

namespace {

constexpr int kRefused = 1;
constexpr int kBadUsage = 2;
constexpr int kNotRunning = 3;

// Bytes for people: 1536 -> "1.5 KiB".
std::string Bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%d B", bytes) : absl::StrFormat("%.1f %s", value, units[unit]);
}

std::string Duration(double seconds) {
  const auto s = static_cast<uint64_t>(seconds);
  if (s >= 86400) return absl::StrFormat("%dd %dh %dm", s / 86400, s % 86400 / 3600, s % 3600 / 60);
  if (s >= 3600) return absl::StrFormat("%dh %dm %ds", s / 3600, s % 3600 / 60, s % 60);
  if (s >= 60) return absl::StrFormat("%dm %ds", s / 60, s % 60);
  return absl::StrFormat("%.1fs", seconds);
}

std::string Json(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

// The words an operator types and reads for the wire's enums.
const char* TierName(int tier) { return cake::TierKindName(cake::TierKindFromWire(tier)); }
const char* RegionKindName(int kind) { return kind == cake::v1::REGION_CUDA_IPC ? "cuda" : "host"; }
const char* PhaseName(int phase) {
  switch (phase) {
    case cake::v1::LOAD_PHASE_LOOKING_UP:
      return "looking_up";
    case cake::v1::LOAD_PHASE_LOADING:
      return "loading";
    case cake::v1::LOAD_PHASE_MET:
      return "met";
  }
  return "?";
}
const std::map<std::string, cake::v1::TierKind> kTiers = {
    {"dram", cake::v1::TIER_DRAM}, {"disk", cake::v1::TIER_DISK}, {"remote", cake::v1::TIER_REMOTE}};

std::string StatusText(const cake::v1::StatusResponse& r) {
  std::string backends;
  for (int kind : r.region_kinds()) {
    absl::StrAppend(&backends, backends.empty() ? "" : ", ",
                    kind == cake::v1::REGION_CUDA_IPC ? "cuda-ipc" : "host-shm");
  }
  std::string out = absl::StrFormat(
      "version:        %s\npid:            %u\nuptime:         %s\nlisten:         %s\nregion kinds:   %s\n"
      "active loads:   %u%s\nregions:        %u (%s)\n",
      r.version(), r.pid(), Duration(r.uptime_s()), r.listen_address(), backends, r.active_loads(),
      r.draining() ? " (draining: new loads refused)" : "", r.regions(), Bytes(r.region_bytes()));
  if (r.regions_released_in_use() > 0) {
    // Their memory is still mapped for live loads and counts against the region limits until those end.
    absl::StrAppendFormat(&out, "                %u of them (%s) released, still in use by loads\n",
                          r.regions_released_in_use(), Bytes(r.region_bytes_released_in_use()));
  }
  for (const cake::v1::TierStatus& t : r.tiers()) {
    const double used = t.capacity_bytes() > 0
                            ? 100.0 * static_cast<double>(t.used_bytes()) / static_cast<double>(t.capacity_bytes())
                            : 0;
    absl::StrAppendFormat(
        &out, "tier %-6s      %u chunks, %s of %s (%.0f%%)%s\n", std::string(TierName(t.tier())) + ":", t.chunks(),
        Bytes(t.used_bytes()), Bytes(t.capacity_bytes()), used,
        t.read_limit_gbps() > 0 ? absl::StrFormat(", reads capped at %g Gbit/s", t.read_limit_gbps()) : "");
  }
  return out;
}

using Admin = cake::v1::AdminService::Stub;

// The daemon a subcommand talks to, reached once the command line is parsed, whichever subcommand it names.
struct Daemon {
  std::unique_ptr<cake::Client> client;
  std::unique_ptr<Admin> admin;  // on the client's channel
  bool json = false;             // --output json

  // One AdminService call through its generated stub: 0, or the exit status its failure means.
  template <typename Rpc, typename Request, typename Response>
  int Call(Rpc rpc, const Request& request, Response* response) const {
    grpc::ClientContext context;
    const grpc::Status s = ((*admin).*rpc)(&context, request, response);
    if (s.ok()) return 0;
    std::fprintf(stderr, "cakectl: %s: %s\n",
                 absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())).c_str(),
                 s.error_message().c_str());
    return s.error_code() == grpc::StatusCode::UNAVAILABLE ? kNotRunning : kRefused;
  }
};

// A subcommand: the CLI11 command that says whether it was given, and what it then does with the daemon (its
// result is the exit status). `run` holds the subcommand's options, which CLI11 fills in while parsing.
struct Command {
  CLI::App* command;
  std::function<int(const Daemon&)> run;
};

// The options before the subcommand: which daemon, how to reach it, and how to print.
struct GlobalOptions {
  std::string socket;
  cake::ClientOptions client;
  std::string output = "text";
};

void AddGlobalOptions(CLI::App& app, GlobalOptions& options) {
  app.add_option("--socket", options.socket,
                 "the daemon's unix socket, used as given (default: $CAKE_SOCKET, also as given; else your own "
                 "daemon's socket when its folder is safely yours, else the system daemon's)");
  app.add_option("--address", options.client.address, "the daemon's TCP listener, host:port, instead of the socket");
  app.add_option("--tls-ca", options.client.tls_ca_file, "TCP: the CA that signed the daemon's certificate (PEM)");
  app.add_option("--tls-cert", options.client.tls_cert_file, "TCP: this client's certificate (PEM), for mTLS");
  app.add_option("--tls-key", options.client.tls_key_file, "TCP: this client's private key (PEM)");
  app.add_option("--token-file", options.client.token_file, "TCP: a file holding this client's bearer token");
  app.add_option("--output,-o", options.output, "text (for people) or json (protobuf's JSON of the reply)")
      ->check(CLI::IsMember({"text", "json"}));
}

// Connects as the global options say; warns on stderr of every socket it passed over as unsafe.
absl::StatusOr<std::unique_ptr<cake::Client>> ConnectDaemon(const GlobalOptions& global) {
  cake::ClientOptions options = global.client;
  options.socket_path = global.socket;
  options.client_id = "cakectl";
  const char* env_socket = std::getenv("CAKE_SOCKET");
  if (options.socket_path.empty() && options.address.empty() && (env_socket == nullptr || *env_socket == '\0')) {
    // Connect would choose the same way; choosing here as well lets an operator see a refused socket (a squatted
    // /tmp/cake-<uid>) even when the system daemon answers in its place.
    if (auto choice = cake::ChooseDaemonSocket(cake::DefaultSocketCandidates()); choice.ok()) {
      for (const std::string& skipped : choice->skipped) {
        std::fprintf(stderr, "cakectl: warning: %s\n", skipped.c_str());
      }
      options.socket_path = choice->path;
    }
  }
  return cake::Client::Connect(options);
}

Command AddStatusCommand(CLI::App& app) {
  return {app.add_subcommand("status", "version, uptime, tiers, live loads and regions"), [](const Daemon& d) {
            cake::v1::StatusResponse r;
            if (int rc = d.Call(&Admin::Status, cake::v1::StatusRequest(), &r); rc != 0) return rc;
            std::fputs((d.json ? Json(r) : StatusText(r)).c_str(), stdout);
            return 0;
          }};
}

Command AddStatsCommand(CLI::App& app) {
  return {app.add_subcommand("stats", "every counter, one per line"), [](const Daemon& d) {
            cake::v1::StatsResponse r;
            if (int rc = d.Call(&Admin::Stats, cake::v1::StatsRequest(), &r); rc != 0) return rc;
            if (d.json) {
              std::fputs(Json(r).c_str(), stdout);
            } else {
              std::map<std::string, uint64_t> sorted(r.counters().begin(), r.counters().end());
              for (const auto& [name, value] : sorted)
                std::printf("%s %llu\n", name.c_str(), static_cast<unsigned long long>(value));
            }
            return 0;
          }};
}

Command AddPingCommand(CLI::App& app) {
  return {app.add_subcommand("ping", "exit 0 when the daemon answers"), [](const Daemon& d) {
            cake::v1::PingResponse r;
            if (int rc = d.Call(&Admin::Ping, cake::v1::PingRequest(), &r); rc != 0) return rc;
            std::puts(d.json ? "{}" : "ok");
            return 0;
          }};
}

Command AddEvictCommand(CLI::App& app) {
  auto tier = std::make_shared<std::string>();
  CLI::App* evict = app.add_subcommand("evict", "drop every chunk of one tier");
  evict->add_option("--tier", *tier, "dram, disk or remote (remote: every chunk under the daemon's key prefix)")
      ->required()
      ->check(CLI::IsMember({"dram", "disk", "remote"}));
  return {evict, [tier](const Daemon& d) {
            cake::v1::EvictRequest request;
            request.set_tier(kTiers.at(*tier));
            cake::v1::EvictResponse r;
            if (int rc = d.Call(&Admin::Evict, request, &r); rc != 0) return rc;
            if (d.json)
              std::fputs(Json(r).c_str(), stdout);
            else
              std::printf("evicted %llu chunks (%s) from %s\n", static_cast<unsigned long long>(r.chunks()),
                          Bytes(r.bytes()).c_str(), tier->c_str());
            return 0;
          }};
}

Command AddReadCapCommand(CLI::App& app) {
  struct Options {
    std::string tier;
    double gbps = 0;
  };
  auto options = std::make_shared<Options>();
  CLI::App* read_cap = app.add_subcommand("read-cap", "change a capped tier's read cap while the daemon runs");
  read_cap->add_option("--tier", options->tier, "dram, disk or remote")
      ->required()
      ->check(CLI::IsMember({"dram", "disk", "remote"}));
  read_cap->add_option("--gbps", options->gbps, "the new cap, Gbit/s")->required();
  return {read_cap, [options](const Daemon& d) {
            cake::v1::SetReadCapRequest request;
            request.set_tier(kTiers.at(options->tier));
            request.set_gbps(options->gbps);
            cake::v1::SetReadCapResponse r;
            if (int rc = d.Call(&Admin::SetReadCap, request, &r); rc != 0) return rc;
            if (d.json)
              std::fputs(Json(r).c_str(), stdout);
            else
              std::printf("%s read cap: %g -> %g Gbit/s\n", options->tier.c_str(), r.previous_gbps(), options->gbps);
            return 0;
          }};
}

Command AddDrainCommand(CLI::App& app) {
  struct Options {
    bool exit_when_idle = false;
    bool resume = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* drain = app.add_subcommand("drain", "take no new loads (health NOT_SERVING); running ones finish");
  drain->add_flag("--exit-when-idle", options->exit_when_idle, "then stop the daemon once no load runs");
  drain->add_flag("--resume", options->resume, "take loads again");
  return {drain, [options](const Daemon& d) {
            cake::v1::DrainRequest request;
            request.set_exit_when_idle(options->exit_when_idle);
            request.set_resume(options->resume);
            cake::v1::DrainResponse r;
            if (int rc = d.Call(&Admin::Drain, request, &r); rc != 0) return rc;
            if (d.json)
              std::fputs(Json(r).c_str(), stdout);
            else
              std::printf("%s; %u loads running%s\n", r.draining() ? "draining: new loads are refused" : "taking loads",
                          r.active_loads(), options->exit_when_idle ? "; the daemon stops once none is" : "");
            return 0;
          }};
}

Command AddHealthCommand(CLI::App& app) {
  auto service = std::make_shared<std::string>();
  CLI::App* health =
      app.add_subcommand("health", "gRPC health check: exit 0 when SERVING, 1 when NOT_SERVING (probes)");
  health->add_option("--service", *service, "a service to ask about, e.g. cake.v1.KvService (default: all)");
  return {health, [service](const Daemon& d) {
            auto serving = d.client->Serving(*service);
            if (!serving.ok()) {
              std::fprintf(stderr, "cakectl: %s\n", serving.status().ToString().c_str());
              return serving.status().code() == absl::StatusCode::kUnavailable ? kNotRunning : kRefused;
            }
            if (d.json)
              std::printf("{\n \"status\": \"%s\"\n}\n", *serving ? "SERVING" : "NOT_SERVING");
            else
              std::puts(*serving ? "SERVING" : "NOT_SERVING");
            return *serving ? 0 : kRefused;
          }};
}

// `regions release`: one region, whoever owns it.
int ReleaseRegion(const Daemon& d, const std::string& region_id, bool end_loads) {
  cake::v1::ReleaseAnyRegionRequest request;
  request.set_region_id(region_id);
  request.set_end_loads(end_loads);
  cake::v1::ReleaseAnyRegionResponse r;
  if (int rc = d.Call(&Admin::ReleaseAnyRegion, request, &r); rc != 0) return rc;
  if (d.json) {
    std::fputs(Json(r).c_str(), stdout);
  } else {
    const std::string owner = r.principal().empty() ? r.client_id() : r.principal() + "/" + r.client_id();
    std::printf("%s %s (%s) of %s\n", r.already_released() ? "already released:" : "released", region_id.c_str(),
                Bytes(r.bytes()).c_str(), owner.c_str());
    if (end_loads) {
      std::printf("%u loads using it ended; its memory goes once their last reads land\n", r.loads_ended());
    } else if (r.loads_using() > 0) {
      std::printf(
          "%u loads still use it: it stays (and counts against the region limits) until they end; "
          "--end-loads ends them\n",
          r.loads_using());
    }
  }
  return 0;
}

// `regions` and `regions list`: every region, by owner.
int ListRegions(const Daemon& d) {
  cake::v1::ListRegionsResponse r;
  if (int rc = d.Call(&Admin::ListRegions, cake::v1::ListRegionsRequest(), &r); rc != 0) return rc;
  if (d.json) {
    std::fputs(Json(r).c_str(), stdout);
  } else {
    std::printf("%-34s %-24s %-5s %10s %7s %9s\n", "REGION", "OWNER", "KIND", "SIZE", "WINDOWS", "LEASE");
    for (const cake::v1::RegionSummary& g : r.regions()) {
      const std::string owner = g.principal().empty() ? g.client_id() : g.principal() + "/" + g.client_id();
      // A released one has no lease left to show: what keeps it is its loads.
      const std::string lease = g.released() ? absl::StrFormat("released, in use by %u load%s", g.loads_using(),
                                                               g.loads_using() == 1 ? "" : "s")
                                             : Duration(g.lease_left_s());
      std::printf("%-34s %-24s %-5s %10s %7u %9s\n", g.region_id().c_str(), owner.c_str(), RegionKindName(g.kind()),
                  Bytes(g.bytes()).c_str(), g.windows(), lease.c_str());
    }
    std::printf("%d regions\n", r.regions_size());
  }
  return 0;
}

Command AddRegionsCommand(CLI::App& app) {
  struct Options {
    std::string release_id;
    bool end_loads = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* regions = app.add_subcommand("regions", "list every registered region, or release one");
  regions->require_subcommand(0, 1);
  regions->add_subcommand("list", "every region, by owner (the default)");
  CLI::App* release = regions->add_subcommand("release", "release a region whoever owns it");
  release->add_option("region_id", options->release_id, "the id `cakectl regions` shows")->required();
  release->add_flag("--end-loads", options->end_loads,
                    "also end the loads still using it (their engines compute the rest), so its memory "
                    "goes now");
  return {regions, [options, release](const Daemon& d) {
            return release->parsed() ? ReleaseRegion(d, options->release_id, options->end_loads) : ListRegions(d);
          }};
}

Command AddLoadsCommand(CLI::App& app) {
  CLI::App* loads = app.add_subcommand("loads", "the loads running now");
  loads->require_subcommand(0, 1);
  loads->add_subcommand("list", "the default");
  return {loads, [](const Daemon& d) {
            cake::v1::ListLoadsResponse r;
            if (int rc = d.Call(&Admin::ListLoads, cake::v1::ListLoadsRequest(), &r); rc != 0) return rc;
            if (d.json) {
              std::fputs(Json(r).c_str(), stdout);
            } else {
              std::printf("%-12s %-20s %-16s %-24s %-12s %-7s %15s %8s\n", "LOAD", "CLIENT", "TENANT", "MODEL",
                          "STRATEGY", "PHASE", "LOADED/CACHED", "AGE");
              for (const cake::v1::LoadSummary& l : r.loads()) {
                const std::string client = l.principal().empty() ? l.client_id() : l.principal() + "/" + l.client_id();
                std::printf("%-12s %-20s %-16s %-24s %-12s %-7s %7u/%-7u %8s\n", l.load_id().c_str(), client.c_str(),
                            l.tenant().c_str(), l.model().c_str(),
                            cake::StrategyName(cake::StrategyFromWire(l.strategy())), PhaseName(l.phase()),
                            l.loaded_chunks(), l.cached_chunks(), Duration(l.age_s()).c_str());
              }
              std::printf("%d loads\n", r.loads_size());
            }
            return 0;
          }};
}

Command AddConfigCommand(CLI::App& app) {
  return {app.add_subcommand("config", "the daemon's effective configuration (TOML; secrets masked)"),
          [](const Daemon& d) {
            cake::v1::GetConfigResponse r;
            if (int rc = d.Call(&Admin::GetConfig, cake::v1::GetConfigRequest(), &r); rc != 0) return rc;
            std::fputs(d.json ? Json(r).c_str() : r.toml().c_str(), stdout);
            return 0;
          }};
}

Command AddVerifyCommand(CLI::App& app) {
  auto tier = std::make_shared<std::string>("disk");
  CLI::App* verify =
      app.add_subcommand("verify", "re-read a tier's chunks, check their checksums, remove corrupt ones");
  verify->add_option("--tier", *tier, "disk or remote (default: disk)")
      ->check(CLI::IsMember({"dram", "disk", "remote"}));
  return {verify, [tier](const Daemon& d) {
            cake::v1::VerifyRequest request;
            request.set_tier(kTiers.at(*tier));
            cake::v1::VerifyResponse r;
            if (int rc = d.Call(&Admin::Verify, request, &r); rc != 0) return rc;
            if (d.json)
              std::fputs(Json(r).c_str(), stdout);
            else
              std::printf(
                  "%s tier: %llu chunks (%s) checked in %s: %llu corrupt (removed), %llu unreadable, %llu gone "
                  "meanwhile\n",
                  tier->c_str(), static_cast<unsigned long long>(r.chunks_checked()), Bytes(r.bytes_checked()).c_str(),
                  Duration(r.seconds()).c_str(), static_cast<unsigned long long>(r.corrupt_removed()),
                  static_cast<unsigned long long>(r.unreadable()), static_cast<unsigned long long>(r.vanished()));
            return r.corrupt_removed() > 0 || r.unreadable() > 0 ? kRefused : 0;
          }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cakectl: inspect and manage a running caked"};
  app.set_version_flag("--version", std::string("cakectl ") + CAKE_VERSION);
  GlobalOptions global;
  AddGlobalOptions(app, global);
  app.require_subcommand(1);
  // In the order --help lists them.
  const Command commands[] = {AddStatusCommand(app), AddStatsCommand(app),   AddPingCommand(app),
                              AddEvictCommand(app),  AddReadCapCommand(app), AddDrainCommand(app),
                              AddHealthCommand(app), AddRegionsCommand(app), AddLoadsCommand(app),
                              AddConfigCommand(app), AddVerifyCommand(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kBadUsage;  // --help and --version exit 0
  }

  auto client = ConnectDaemon(global);
  if (!client.ok()) {
    std::fprintf(stderr, "cakectl: %s\n", std::string(client.status().message()).c_str());
    return kNotRunning;
  }
  Daemon daemon;
  daemon.admin = cake::v1::AdminService::NewStub((*client)->channel());
  daemon.client = std::move(*client);
  daemon.json = global.output == "json";
  for (const Command& c : commands) {
    if (c.command->parsed()) return c.run(daemon);
  }
  return 0;
}
