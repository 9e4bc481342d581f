// The helpers cake-demo and the benches share (see harness.h).
#include "examples/harness/harness.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace cake::harness {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t PatternWord(uint32_t chunk, uint64_t word) { return SplitMix64((uint64_t{chunk} << 40) ^ word); }

std::string JsonQuoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<DaemonTarget> OpenDaemon(const std::string& socket_path, const std::vector<std::string>& spawn_args,
                                        const std::string& client_id) {
  DaemonTarget target;
  target.socket_path = socket_path;
  if (socket_path.empty()) {
    // Benches and the demo start daemons with large tiers (prefaulted DRAM, big disk indexes): give them time.
    CAKE_ASSIGN_OR_RETURN(
        auto spawned, SpawnedDaemon::Start(SpawnedDaemon::SiblingCakedPath(), spawn_args, std::chrono::seconds(180)));
    target.socket_path = spawned.socket_path();
    target.spawned.emplace(std::move(spawned));
  }
  CAKE_ASSIGN_OR_RETURN(auto client, Client::Connect({target.socket_path, client_id}));
  target.client = std::move(client);
  return target;
}

absl::Status WaitForCounter(Client& client, const std::string& name, uint64_t at_least,
                            std::chrono::milliseconds stall_timeout) {
  uint64_t value = 0;
  Clock::time_point last_change = Clock::now();
  for (;;) {
    CAKE_ASSIGN_OR_RETURN(auto stats, client.Stats());
    auto it = stats.find(name);
    const uint64_t now = it == stats.end() ? 0 : it->second;
    if (now >= at_least) return absl::OkStatus();
    if (now != value) {
      value = now;
      last_change = Clock::now();
    } else if (Clock::now() - last_change > stall_timeout) {
      return absl::DeadlineExceededError(absl::StrCat("counter ", name, " stayed at ", value, " (waiting for ",
                                                      at_least, ") for ", stall_timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void PreciseSleepUntil(Clock::time_point deadline) {
  constexpr auto kSpinMargin = std::chrono::microseconds(300);
  if (deadline - Clock::now() > kSpinMargin) std::this_thread::sleep_until(deadline - kSpinMargin);
  while (Clock::now() < deadline) {
  }
}

void JsonReport::Set(const std::string& key, double value) {
  std::string encoded;
  if (!std::isfinite(value)) {
    encoded = "null";  // JSON has no NaN or infinity; null says "not measured" without breaking parsers
  } else if (value == std::floor(value) && std::fabs(value) < 0x1p53) {
    encoded = absl::StrFormat("%.0f", value);  // counts and byte sizes stay exact
  } else {
    encoded = absl::StrFormat("%.6g", value);
  }
  fields_.emplace_back(key, std::move(encoded));
}

void JsonReport::Set(const std::string& key, const std::string& value) { fields_.emplace_back(key, JsonQuoted(value)); }

void JsonReport::SetRaw(const std::string& key, std::string json) { fields_.emplace_back(key, std::move(json)); }

std::string JsonReport::ToString() const {
  std::string text = "{\n";
  for (size_t i = 0; i < fields_.size(); ++i) {
    absl::StrAppend(&text, "  ", JsonQuoted(fields_[i].first), ": ", fields_[i].second,
                    i + 1 < fields_.size() ? ",\n" : "\n");
  }
  text += "}";
  return text;
}

absl::Status JsonReport::WriteTo(const std::string& path) const {
  if (path.empty()) return absl::OkStatus();
  const std::string text = ToString() + "\n";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

std::vector<uint32_t> SyntheticPrompt(size_t count, uint32_t seed) {
  std::vector<uint32_t> tokens(count);
  for (size_t i = 0; i < count; ++i) tokens[i] = static_cast<uint32_t>(SplitMix64((uint64_t{seed} << 32) ^ i) % 128000);
  return tokens;
}

void FillChunkPattern(std::span<std::byte> dst, uint32_t chunk) {
  const size_t words = dst.size() / 8;
  for (size_t w = 0; w < words; ++w) {
    const uint64_t v = PatternWord(chunk, w);
    std::memcpy(dst.data() + w * 8, &v, 8);
  }
  if (const size_t tail = dst.size() % 8; tail != 0) {
    const uint64_t v = PatternWord(chunk, words);
    std::memcpy(dst.data() + words * 8, &v, tail);
  }
}

absl::Status CheckChunkPattern(std::span<const std::byte> bytes, uint32_t chunk) {
  const size_t words = bytes.size() / 8;
  for (size_t w = 0; w <= words; ++w) {
    const size_t n = w < words ? 8 : bytes.size() % 8;
    if (n == 0) break;
    const uint64_t expected = PatternWord(chunk, w);
    if (std::memcmp(bytes.data() + w * 8, &expected, n) != 0) {
      return absl::DataLossError(
          absl::StrCat("chunk ", chunk, " differs from its pattern at byte ", w * 8, " (of ", bytes.size(), ")"));
    }
  }
  return absl::OkStatus();
}

void RemoveQuietly(const std::filesystem::path& path) {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

absl::StatusOr<ScratchDir> ScratchDir::Create(const std::string& name) {
  std::string pattern = (std::filesystem::temp_directory_path() / (name + "-XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", std::strerror(errno)));
  }
  return ScratchDir(pattern);
}

std::string ScratchDir::WriteFile(const std::string& name, const std::string& text) const {
  const std::string file = (path_ / name).string();
  std::ofstream(file) << text;
  return file;
}

std::string ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace cake::harness
