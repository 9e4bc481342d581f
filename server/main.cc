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
#include "server/config.h"
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
  std::string run_dir, socket, log_level, key_secret;
  app.add_option("--run-dir", run_dir, "folder for the socket (server.run_dir)");
  app.add_option("--socket", socket, "unix socket path (server.socket)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error (server.log_level)");
  std::optional<uint64_t> dram_mib;
  // Counted flags: CLI11 sets an optional<bool> flag to false when absent, which would override the file.
  int64_t prefault_flags = 0, no_prefault_flags = 0;
  app.add_flag("--dram-prefault", prefault_flags, "touch the whole DRAM tier at start-up (dram.prefault)");
  app.add_flag("--no-dram-prefault", no_prefault_flags, "do not (dram.prefault = false)");
  app.add_option("--dram-capacity-mib", dram_mib, "DRAM tier size in MiB (dram.capacity_bytes)");
  std::optional<double> dram_gbps, dram_burst_us;
  app.add_option("--dram-read-burst-us", dram_burst_us,
                 "what an idle throttled DRAM tier lets through at once, in microseconds of its rate; 0 serves one "
                 "read after another (dram.read_burst_us)");
  app.add_option("--dram-read-gbps", dram_gbps, "cap DRAM-tier reads at this many Gbit/s, 0 for none (dram.read_gbps)");
  std::string disk_root;
  app.add_option("--disk-root", disk_root, "folder of the disk tier; enables it (disk.root)");
  std::optional<uint64_t> disk_mib;
  app.add_option("--disk-capacity-mib", disk_mib, "disk tier size in MiB (disk.capacity_bytes)");
  std::optional<double> disk_gbps;
  app.add_option("--disk-read-gbps", disk_gbps, "cap disk-tier reads at this many Gbit/s, 0 for none (disk.read_gbps)");
  std::vector<std::string> remote_endpoints;
  app.add_option("--remote", remote_endpoints,
                 "Redis host:port (a standalone server or cluster seeds; repeat or comma-separate); enables the remote "
                 "tier (remote.endpoints)")
      ->delimiter(',');
  std::string remote_prefix;
  app.add_option("--remote-key-prefix", remote_prefix, "prefix of every Redis key (remote.key_prefix)");
  std::optional<double> remote_gbps;
  app.add_option("--remote-read-gbps", remote_gbps,
                 "cap remote-tier reads at this many Gbit/s, 0 for none (remote.read_gbps)");
  std::string io_backend;
  app.add_option("--disk-io-backend", io_backend, "auto, uring or pread (disk.io_backend)");
  std::optional<uint32_t> io_threads, window;
  app.add_option("--io-threads", io_threads, "I/O threads (loader.io_threads)");
  app.add_option("--window", window, "reads in flight per load (loader.window)");
  std::string arbiter;
  app.add_option("--arbiter", arbiter, "srf, fifo or fair: which concurrent load's read goes next (loader.arbiter)");
  int64_t no_cuda_flags = 0;
  app.add_flag("--no-cuda", no_cuda_flags, "serve host regions only, even with a GPU (cuda.enabled = false)");
  std::vector<int> cuda_devices;
  app.add_option("--cuda-devices", cuda_devices, "CUDA device ordinals engines may ask for (cuda.devices)")
      ->delimiter(',');
  std::string metrics_listen;
  app.add_option("--metrics-listen", metrics_listen,
                 "serve Prometheus metrics on host:port, e.g. 127.0.0.1:9464 (metrics.listen)");
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
    if (!run_dir.empty()) {
      config.run_dir = run_dir;
      if (socket.empty()) config.socket.clear();
    }
    if (!socket.empty()) config.socket = socket;
    if (!log_level.empty()) config.log_level = log_level;
    if (dram_mib) config.dram_capacity_bytes = *dram_mib << 20;
    if (prefault_flags > 0) config.dram_prefault = true;
    if (no_prefault_flags > 0) config.dram_prefault = false;
    if (dram_gbps) config.dram_read_gbps = *dram_gbps;
    if (dram_burst_us) config.dram_read_burst_us = *dram_burst_us;
    if (!disk_root.empty()) config.disk_root = disk_root;
    if (disk_mib) config.disk_capacity_bytes = *disk_mib << 20;
    // Flags that name an enum's value are parsed by the config file's own words.
    if (!arbiter.empty()) {
      auto parsed = cake::ParseArbiterOption(arbiter, "--arbiter");
      if (!parsed.ok()) return parsed.status();
      config.arbiter = *parsed;
    }
    if (!io_backend.empty()) {
      auto parsed = cake::ParseIoBackendOption(io_backend, "--disk-io-backend");
      if (!parsed.ok()) return parsed.status();
      config.disk_io_backend = *parsed;
    }
    if (disk_gbps) config.disk_read_gbps = *disk_gbps;
    if (!remote_endpoints.empty()) config.remote_endpoints = remote_endpoints;
    if (!remote_prefix.empty()) config.remote_key_prefix = remote_prefix;
    if (remote_gbps) config.remote_read_gbps = *remote_gbps;
    if (io_threads) config.io_threads = *io_threads;
    if (window) config.load_window = *window;
    if (no_cuda_flags > 0) config.cuda_enabled = false;
    if (!cuda_devices.empty()) config.cuda_devices = cuda_devices;
    if (!metrics_listen.empty()) config.metrics_listen = metrics_listen;
    if (auto s = cake::ValidateConfig(config); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("invalid configuration: ", s.message()));
    }
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
