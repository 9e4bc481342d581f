// Random names nobody can guess or collide with: region ids and shared-memory names (another local user must not
// guess a live one), temporary file names (concurrent writers, threads or daemons, must never pick the same).
#pragma once

#include <string>

namespace cake {

// 128 bits from the kernel's generator, as 32 hex digits.
std::string RandomHex128();

}  // namespace cake
