#include "base/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace cake {

std::string RandomHex128() {
  // getrandom(2), not std::random_device: the latter opens /dev/urandom on every call and throws when the process
  // is out of descriptors, which a flood of idle connections can cause; getrandom needs no descriptor. It blocks
  // only before the kernel's pool is first seeded (early boot), never after.
  unsigned char bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n > 0) {
      filled += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      // ENOSYS (a kernel before 3.17) is the only other failure: nothing would be safe to name regions with.
      std::abort();
    }
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(32);
  for (unsigned char b : bytes) {
    hex.push_back(kDigits[b >> 4]);
    hex.push_back(kDigits[b & 15]);
  }
  return hex;
}

}  // namespace cake
