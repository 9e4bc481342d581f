// Shared pieces of cake-bench (see bench_common.h).
#include "bench/bench_common.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "testing/child_process.h"

namespace cake::bench {

double MicrosecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(samples.size()));
  const size_t index = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(samples.size()))) - 1;
  return samples[index];
}

double Median(std::vector<double> samples) { return Percentile(std::move(samples), 50); }

double Max(const std::vector<double>& samples) {
  return samples.empty() ? 0 : *std::max_element(samples.begin(), samples.end());
}

double Mean(const std::vector<double>& samples) {
  double sum = 0;
  for (double x : samples) sum += x;
  return samples.empty() ? 0 : sum / static_cast<double>(samples.size());
}

absl::StatusOr<std::filesystem::path> FreshPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return absl::InvalidArgumentError("--dir is required");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::filesystem::path path = std::filesystem::path(dir) / name;
  if (std::filesystem::exists(path, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(path.string(),
                                                      " already exists; the bench creates and deletes it itself: "
                                                      "remove it or choose another --dir"));
  }
  return path;
}

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && ::access((std::filesystem::path(dir) / program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

absl::StatusOr<int> RunProgram(const std::vector<std::string>& args, const std::filesystem::path& log) {
  return RunToCompletion(args, log.string());
}

absl::StatusOr<double> TimedIoOnlyLoad(Client& client, const LoadOptions& options, uint32_t chunks,
                                       uint64_t chunk_bytes, const ChunkCheck& check) {
  if (options.region == nullptr) return absl::InvalidArgumentError("TimedIoOnlyLoad needs a region");
  std::memset(options.region->data() + options.region_offset, 0, uint64_t{chunks} * chunk_bytes);
  LoadOptions load = options;
  load.io_only = true;
  const Clock::time_point start = Clock::now();
  CAKE_ASSIGN_OR_RETURN(auto session, client.StartLoad(load));
  auto done = session->WaitDone();
  const double seconds = SecondsSince(start);
  if (!done.ok()) return done.status();
  if (done->loaded_chunks != chunks) {
    return absl::InternalError(absl::StrCat("an I/O-only load of ", chunks, " chunks loaded ", done->loaded_chunks));
  }
  for (uint32_t c = 0; c < chunks; ++c) {
    const std::byte* bytes = options.region->data() + session->RegionOffset(c);
    CAKE_RETURN_IF_ERROR(check ? check({bytes, chunk_bytes}, c) : CheckChunkPattern({bytes, chunk_bytes}, c));
  }
  CAKE_RETURN_IF_ERROR(session->Release());
  return seconds;
}

double GigabytesPerSecond(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

absl::StatusOr<double> ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return absl::UnavailableError(absl::StrCat("cannot read /proc/", pid, "/stat"));
  // The command name (field 2) may hold spaces: fields after it start past the last ')'.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

bool DropPageCache() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "3\n", 2) == 2;
  ::close(fd);
  return ok;
}

std::optional<std::pair<uint64_t, double>> LoggedDiskRecovery(const std::string& log) {
  const size_t at = log.find("recovered ");
  if (at == std::string::npos) return std::nullopt;
  unsigned long long chunks = 0, bytes = 0;
  double ms = 0;
  if (std::sscanf(log.c_str() + at, "recovered %llu chunks (%llu bytes) in %lf ms", &chunks, &bytes, &ms) != 3) {
    return std::nullopt;
  }
  return std::make_pair(static_cast<uint64_t>(chunks), ms / 1000);
}

}  // namespace cake::bench
