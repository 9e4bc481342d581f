// One {value, name} table per enum gives both directions: the name of a value (logs, Stats, config files) and the
// value of a name (parsing), so the two cannot drift apart the way a switch and a chain of ifs can.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace cake {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// `value`'s name in `table`, or `fallback` for a value the table lacks (a number cast from the wire).
template <typename E, size_t N>
constexpr const char* NameIn(const EnumName<E> (&table)[N], E value, const char* fallback) {
  for (const EnumName<E>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return fallback;
}

// The value named `name` in `table`, or nullopt.
template <typename E, size_t N>
constexpr std::optional<E> ValueIn(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& entry : table) {
    if (name == entry.name) return entry.value;
  }
  return std::nullopt;
}

}  // namespace cake
