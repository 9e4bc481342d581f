// caked's command-line flags, made from the config's key list (server/config/config_keys.h): each key with a flag gets
// it, with the key's help and the key's range, and a flag given overrides the file.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace CLI {
class App;
}

namespace cake {

struct DaemonConfig;
struct ConfigKey;

class ConfigFlags {
 public:
  // Adds a flag to `app` for every key that has one; `app` fills them in when it parses.
  explicit ConfigFlags(CLI::App& app);
  ~ConfigFlags();
  ConfigFlags(const ConfigFlags&) = delete;
  ConfigFlags& operator=(const ConfigFlags&) = delete;

  // Sets the keys whose flags were given. A value outside its key's range, or an unknown word, is an
  // INVALID_ARGUMENT naming the key and the flag. --run-dir without --socket also drops the file's socket, so
  // the socket follows the folder.
  absl::Status ApplyTo(DaemonConfig& config) const;

 private:
  struct Given;
  std::vector<std::unique_ptr<Given>> given_;
};

}  // namespace cake
