#include "server/config/config_flags.h"

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "server/config/config.h"
#include "server/config/config_keys.h"

namespace cake {

// What the command line said for one key; CLI11 writes into it while parsing.
struct ConfigFlags::Given {
  const ConfigKey* key = nullptr;
  std::optional<uint64_t> unsigned_value;
  std::optional<double> double_value;
  std::optional<std::string> word;  // strings and enum words
  std::vector<std::string> strings;
  std::vector<int> ints;
  // Counted: CLI11 sets an optional<bool> flag to false when it is absent, which would override the file.
  int64_t on = 0;
  int64_t off = 0;
};

ConfigFlags::ConfigFlags(CLI::App& app) {
  for (const ConfigKey& key : ConfigKeys()) {
    if (key.flag.empty()) continue;
    auto given = std::make_unique<Given>();
    given->key = &key;
    const std::string flag(key.flag);
    const std::string help = absl::StrCat(std::string(key.help), " (", FullKeyName(key), ")");
    std::visit(
        [&](auto field) {
          using T = std::remove_reference_t<decltype(field(std::declval<DaemonConfig&>()))>;
          if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>) {
            app.add_option(flag, given->unsigned_value, help);
          } else if constexpr (std::is_same_v<T, double>) {
            app.add_option(flag, given->double_value, help);
          } else if constexpr (std::is_same_v<T, bool>) {
            app.add_flag(flag, given->on, help);
            app.add_flag("--no-" + flag.substr(2), given->off, absl::StrCat("the opposite of ", flag));
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            app.add_option(flag, given->strings, absl::StrCat(help, "; repeat or comma-separate"))->delimiter(',');
          } else if constexpr (std::is_same_v<T, std::vector<int>>) {
            app.add_option(flag, given->ints, absl::StrCat(help, "; repeat or comma-separate"))->delimiter(',');
          } else {  // strings and enum words
            app.add_option(flag, given->word, help);
          }
        },
        key.field);
    given_.push_back(std::move(given));
  }
}

ConfigFlags::~ConfigFlags() = default;

absl::Status ConfigFlags::ApplyTo(DaemonConfig& config) const {
  bool run_dir_given = false, socket_given = false;
  for (const auto& given : given_) {
    const ConfigKey& key = *given->key;
    const auto out_of_range = [&](std::string_view expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(FullKeyName(key), " (", std::string(key.flag), ") must be ", std::string(expected)));
    };
    absl::Status status = std::visit(
        [&](auto field) -> absl::Status {
          auto& value = field(config);
          using T = std::remove_reference_t<decltype(value)>;
          if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>) {
            if (!given->unsigned_value) return absl::OkStatus();
            const uint64_t v = *given->unsigned_value;
            const uint64_t min = static_cast<uint64_t>(key.min), max = static_cast<uint64_t>(key.max);
            if (v > (max >> key.flag_shift) || (v << key.flag_shift) < min) {
              return out_of_range(absl::StrCat("an integer from ",
                                               (min + (uint64_t{1} << key.flag_shift) - 1) >> key.flag_shift, " to ",
                                               max >> key.flag_shift));
            }
            value = static_cast<T>(v << key.flag_shift);
          } else if constexpr (std::is_same_v<T, double>) {
            if (!given->double_value) return absl::OkStatus();
            if (!(*given->double_value >= key.min && *given->double_value <= key.max)) {
              return out_of_range(absl::StrCat("a number from ", key.min, " to ", key.max));
            }
            value = *given->double_value;
          } else if constexpr (std::is_same_v<T, bool>) {
            if (given->on > 0 && given->off > 0) {
              return absl::InvalidArgumentError(absl::StrCat(
                  std::string(key.flag), " and --no-", std::string(key.flag.substr(2)), " contradict each other"));
            }
            if (given->on > 0) value = true;
            if (given->off > 0) value = false;
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            if (!given->strings.empty()) value = given->strings;
          } else if constexpr (std::is_same_v<T, std::vector<int>>) {
            if (given->ints.empty()) return absl::OkStatus();
            for (int v : given->ints) {
              if (v < key.min || v > key.max) {
                return out_of_range(absl::StrCat("a list of integers from ", key.min, " to ", key.max));
              }
            }
            value = given->ints;
          } else if constexpr (std::is_same_v<T, std::string>) {
            if (!given->word) return absl::OkStatus();
            value = *given->word;
            run_dir_given |= &value == &config.run_dir;
            socket_given |= &value == &config.socket;
          } else {
            if (!given->word) return absl::OkStatus();
            // An enum's words are the file's: the flag is parsed by the key's own parser.
            absl::StatusOr<T> parsed;
            if constexpr (std::is_same_v<T, IoBackend>) {
              parsed = ParseIoBackendOption(*given->word, key.flag);
            } else if constexpr (std::is_same_v<T, ChunkCodec>) {
              parsed = ParseChunkCodecOption(*given->word, key.flag);
            } else {
              parsed = ParseArbiterOption(*given->word, key.flag);
            }
            if (!parsed.ok()) return parsed.status();
            value = *parsed;
          }
          return absl::OkStatus();
        },
        key.field);
    if (!status.ok()) return status;
  }
  if (run_dir_given && !socket_given) config.socket.clear();
  return absl::OkStatus();
}

}  // namespace cake
