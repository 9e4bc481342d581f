// The rule a unix socket's folder must meet before caked serves in it or a client trusts a daemon found there: one
// statement of it, so the daemon (when it creates the folder) and the clients (when they find a socket) agree.
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace cake {

// Whether `folder` is safe to hold this process's daemon socket, checked by this process's effective uid. The
// folder must be a real folder (not a symbolic link) owned by this user (or by root). Where its parent is writable by
// others (the /tmp fallback), anyone could have made it first and would then be able to swap the socket: there it
// must be owned by this user and writable by nobody else ((mode & 022) == 0).
// OK when it is; NOT_FOUND when it does not exist; FAILED_PRECONDITION otherwise, with a message naming the folder
// and what is wrong, followed by `remedy` (what the reader should do: the daemon and a client advise differently).
// Checks only: creates and changes nothing.
absl::Status CheckSocketFolder(std::string_view folder, std::string_view remedy);

// Whether `socket_path` is a unix socket itself (lstat: a symbolic link is not one). NOT_FOUND when nothing is
// there; FAILED_PRECONDITION naming the path and what it is instead, followed by `remedy`.
absl::Status CheckSocketFile(std::string_view socket_path, std::string_view remedy);

}  // namespace cake
