// caked: the Cake KV-cache loader daemon. Configuration: embedded defaults, then --config FILE, then flags.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "server/config/config.h"
#include "server/config/config_flags.h"
#include "server/daemon.h"
#include "server/systemd_notify.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  // Block the stop signals in every thread (gRPC's included); the main thread waits for them with sigwait, so
  // stopping runs as ordinary code instead of inside a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);  // not a stop: reload (below)
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // Keep freed request buffers (a 128K-token prompt is 512 KiB) in the heap instead of handing them back to the
  // kernel after every call: re-faulting them cost more than hashing the prompt (docs/benchmarks.md, Lookup).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  signal(SIGPIPE, SIG_IGN);

  CLI::App app{"caked: loads KV-cache chunks of cached prompt prefixes while the engine computes the rest"};
  app.set_version_flag("--version", std::string("caked ") + CAKE_VERSION);
  std::string config_file;
  app.add_option("--config", config_file, "TOML configuration file (deploy/caked.toml documents every key)");
  cake::ConfigFlags flags(app);  // one per key that has a flag (server/config/config_keys.cc)
  bool check_config = false, print_config = false;
  app.add_flag("--check-config", check_config, "validate the configuration and exit");
  app.add_flag("--print-config", print_config,
               "print the effective configuration (defaults, file and flags; secrets masked) as TOML and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  // The configuration: defaults, the file, then the flags. Built again on SIGHUP, so a reload applies the file's
  // changes and keeps what the flags said.
  auto build_config = [&]() -> absl::StatusOr<cake::DaemonConfig> {
    cake::DaemonConfig config = cake::DefaultConfig();
    if (!config_file.empty()) {
      auto loaded = cake::LoadConfigFile(config_file, config);
      if (!loaded.ok()) return loaded.status();
      config = *loaded;
    }
    if (auto s = flags.ApplyTo(config); !s.ok()) return s;
    if (auto s = cake::ValidateConfig(config); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("invalid configuration: ", s.message()));
    }
    if (auto s = cake::ReadConfigSecrets(config); !s.ok()) return s;
    return config;
  };
  auto built = build_config();
  if (!built.ok()) {
    std::fprintf(stderr, "caked: %s\n", std::string(built.status().message()).c_str());
    return 2;
  }
  const cake::DaemonConfig config = *std::move(built);
  if (print_config) {
    std::fputs(cake::FormatConfig(config).c_str(), stdout);
    return 0;
  }
  if (check_config) {
    std::printf("configuration is valid; socket %s\n", config.socket_path().c_str());
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  cake::ConfigureLogFormat();

  // Start-up can take minutes (prefaulting or page-locking the DRAM tier, rebuilding a large disk index): while
  // it runs, systemd hears that it does (STATUS=) and extends its start timeout, 30 s at a time.
  std::atomic<bool> started{false};
  std::thread start_progress([&started] {
    cake::NotifySystemd("STATUS=starting: building the tiers (prefault, pinning, disk index)");
    for (int waited_ms = 0; !started; waited_ms += 100) {
      if (waited_ms % 10000 == 0) cake::NotifySystemd("EXTEND_TIMEOUT_USEC=30000000");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto daemon = cake::Daemon::Start(config);
  started = true;
  start_progress.join();
  if (!daemon.ok()) {
    spdlog::critical("cannot start: {}", daemon.status().ToString());
    return 1;
  }
  cake::NotifySystemd(std::string("STATUS=serving on ") + (*daemon)->socket_path());
  (*daemon)->SetStopRequest([] { kill(getpid(), SIGTERM); });  // Drain with exit_when_idle: stop as on SIGTERM
  cake::NotifySystemd("READY=1");

  // The watchdog is fed only after a client's path through the socket got an answer (Daemon::CheckServing),
  // and never once the stop has begun.
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread watchdog;
  if (auto interval = cake::SystemdWatchdogInterval()) {
    watchdog = std::thread([&, period = *interval / 2] {
      // Half the period, so a slow answer still comes well within WatchdogSec of the last ping.
      const auto check_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(period / 2);
      bool failing = false;
      std::unique_lock lock(mu);
      while (!cv.wait_for(lock, period, [&] { return stopping; })) {
        lock.unlock();
        const absl::Status serving = (*daemon)->CheckServing(check_timeout);
        lock.lock();
        if (stopping) break;
        if (serving.ok()) {
          cake::NotifySystemd("WATCHDOG=1");
          if (failing) spdlog::info("self-check: the daemon answers on its socket again");
        } else if (!failing) {
          spdlog::error("self-check failed, the systemd watchdog is no longer fed: {}", serving.ToString());
        }
        failing = !serving.ok();
      }
    });
  }

  int sig = 0;
  while (sigwait(&stop_signals, &sig) == 0 && sig == SIGHUP) {
    // SIGHUP: the file again, for what can change while serving (Daemon::Reload: [access] and its token files,
    // the log level, read caps). TLS certificates are re-read on their own every tcp.tls_reload_s.
    if (config_file.empty()) {
      spdlog::warn("SIGHUP: no --config file to reload; nothing changed");
      continue;
    }
    auto reread = build_config();
    absl::Status reloaded = reread.ok() ? (*daemon)->Reload(*reread) : reread.status();
    if (!reloaded.ok()) spdlog::error("SIGHUP: not reloaded, the running configuration stays: {}", reloaded.ToString());
  }
  spdlog::info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  cake::NotifySystemd("STOPPING=1");
  {
    std::lock_guard lock(mu);
    stopping = true;
  }
  cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
  (*daemon)->Stop();
  return 0;
}
