#include "base/random_id.h"

#include <cstdint>
#include <random>

namespace cake {

std::string RandomHex128() {
  std::random_device rd("/dev/urandom");
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(32);
  for (int i = 0; i < 4; ++i) {
    uint32_t v = rd();
    for (int j = 0; j < 8; ++j, v >>= 4) hex.push_back(kDigits[v & 15]);
  }
  return hex;
}

}  // namespace cake
