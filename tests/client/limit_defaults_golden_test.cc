// The limits a client assumes of a daemon too old to answer GetLimits, against tests/golden/limit_defaults.toml:
// the C++ client's DaemonLimits{}, the daemon's own DaemonConfig{} (read through its key table) and, in
// python/tests/test_golden_rules.py, the Python client's cake.Limits(): a default changed in one place alone fails.
#include <toml++/toml.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cake/v1/kv.pb.h"
#include "client/client.h"
#include "server/config/config.h"
#include "server/config/config_keys.h"

namespace cake {
namespace {

// DaemonLimits's fields by their GetLimitsResponse names (C++ cannot list a struct's fields, so this map is checked
// against the proto's fields below: a field added to both without a row here fails).
const std::map<std::string, std::function<uint64_t(const DaemonLimits&)>>& LimitFields() {
  static const auto* fields = new std::map<std::string, std::function<uint64_t(const DaemonLimits&)>>{
      {"max_message_bytes", [](const DaemonLimits& l) { return l.max_message_bytes; }},
      {"load_start_timeout_ms", [](const DaemonLimits& l) { return uint64_t{l.load_start_timeout_ms}; }},
      {"load_idle_timeout_ms", [](const DaemonLimits& l) { return uint64_t{l.load_idle_timeout_ms}; }},
      {"default_chunk_tokens", [](const DaemonLimits& l) { return uint64_t{l.default_chunk_tokens}; }},
      {"max_chunk_tokens", [](const DaemonLimits& l) { return uint64_t{l.max_chunk_tokens}; }},
      {"min_chunk_bytes", [](const DaemonLimits& l) { return l.min_chunk_bytes; }},
      {"max_prompt_tokens", [](const DaemonLimits& l) { return l.max_prompt_tokens; }},
      {"region_lease_ms", [](const DaemonLimits& l) { return uint64_t{l.region_lease_ms}; }},
      {"default_load_window", [](const DaemonLimits& l) { return uint64_t{l.default_load_window}; }},
      {"max_load_window", [](const DaemonLimits& l) { return uint64_t{l.max_load_window}; }},
      {"max_region_bytes", [](const DaemonLimits& l) { return l.max_region_bytes; }},
  };
  return *fields;
}

// The default of a daemon configuration key ("loader.window"), by the daemon's own key table; nullopt when there is
// no such numeric key.
std::optional<uint64_t> DaemonDefault(const std::string& full_name) {
  DaemonConfig defaults;
  for (const ConfigKey& key : ConfigKeys()) {
    if (FullKeyName(key) != full_name) continue;
    if (const auto* field = std::get_if<uint32_t& (*)(DaemonConfig&)>(&key.field)) return (*field)(defaults);
    if (const auto* field = std::get_if<uint64_t& (*)(DaemonConfig&)>(&key.field)) return (*field)(defaults);
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("limit defaults: DaemonLimits{} and the daemon's DaemonConfig{} equal tests/golden/limit_defaults.toml",
          "[client][golden]") {
  const toml::table file = toml::parse_file(CAKE_SOURCE_DIR "/tests/golden/limit_defaults.toml");
  const toml::array* rows = file["limit"].as_array();
  REQUIRE(rows != nullptr);
  const DaemonLimits fallback;
  std::vector<std::string> keys;
  for (const toml::node& node : *rows) {
    const toml::table& row = *node.as_table();
    const std::string key = row["key"].value_or(std::string());
    const std::string daemon_key = row["daemon_key"].value_or(std::string());
    const uint64_t value = static_cast<uint64_t>(row["value"].value_or(int64_t{-1}));
    INFO(key << " (the daemon's " << daemon_key << ")");
    keys.push_back(key);
    const auto field = LimitFields().find(key);
    REQUIRE(field != LimitFields().end());
    CHECK(field->second(fallback) == value);
    const std::optional<uint64_t> daemon = DaemonDefault(daemon_key);
    REQUIRE(daemon.has_value());
    CHECK(*daemon == value);
  }
  // The rows are GetLimitsResponse's fields, in its order, and DaemonLimits has each.
  std::vector<std::string> proto_fields;
  const google::protobuf::Descriptor* response = v1::GetLimitsResponse::descriptor();
  for (int i = 0; i < response->field_count(); ++i) proto_fields.push_back(std::string(response->field(i)->name()));
  CHECK(keys == proto_fields);
  CHECK(LimitFields().size() == keys.size());
}

}  // namespace cake
