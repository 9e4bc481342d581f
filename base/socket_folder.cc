// The socket folder rule (base/socket_folder.h): lstat and stat only, so the daemon and every client can afford it.
#include "base/socket_folder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cake {
namespace {

// Debian's Abseil has its own string_view, which StrCat takes and std::string_view is not: strings here.
absl::Status Refuse(const std::string& what, const std::string& path, const std::string& problem,
                    std::string_view remedy) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " ", path, " ", problem, remedy.empty() ? "" : "; ", std::string(remedy)));
}

// "/tmp/cake-1000/" names the same folder as "/tmp/cake-1000", and its parent is /tmp, not the folder itself.
std::string WithoutTrailingSlashes(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return std::string(path);
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status CheckSocketFolder(std::string_view folder_arg, std::string_view remedy) {
  const std::string what = "the socket folder";
  const std::string folder = WithoutTrailingSlashes(folder_arg);
  struct stat st {};
  if (::lstat(folder.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(what, " ", folder, " does not exist"));
    return Refuse(what, folder, absl::StrCat("cannot be inspected: ", std::strerror(errno)), remedy);
  }
  if (S_ISLNK(st.st_mode)) {
    // The target, when readable, tells the reader whose folder it leads to.
    char target[4096];
    const ssize_t n = ::readlink(folder.c_str(), target, sizeof(target) - 1);
    return Refuse(what, folder,
                  n > 0 ? absl::StrCat("is a symbolic link (to ", std::string(target, n), ")")
                        : std::string("is a symbolic link"),
                  remedy);
  }
  if (!S_ISDIR(st.st_mode)) return Refuse(what, folder, "is not a folder", remedy);

  const std::string parent = ParentOf(folder);
  struct stat parent_st {};
  if (::stat(parent.c_str(), &parent_st) != 0) {
    return Refuse(
        what, folder,
        absl::StrCat("cannot be judged: its parent ", parent, " cannot be inspected (", std::strerror(errno), ")"),
        remedy);
  }
  // In a folder anyone may write to (/tmp), anyone may have made this one first, so only this user's own, closed
  // folder is trusted there. Elsewhere only root or this user could have made it.
  const bool shared_parent = (parent_st.st_mode & S_IWOTH) != 0;
  const uid_t me = ::geteuid();
  if (st.st_uid != me && (shared_parent || st.st_uid != 0)) {
    return Refuse(what, folder, absl::StrCat("belongs to another user (uid ", st.st_uid, ")"), remedy);
  }
  // Writable by others is what lets them swap the socket; reading the folder only shows its name. In /tmp the group
  // counts too (anyone may have made the folder); anywhere, a folder every user may write to without the sticky bit
  // (which keeps others from renaming or removing what is not theirs) lets any user who reaches it replace the socket.
  const bool open_to_all = (st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0;
  if ((shared_parent && (st.st_mode & 022) != 0) || open_to_all) {
    return Refuse(
        what, folder,
        absl::StrFormat("is open to other users (mode %04o), who could replace the socket in it", st.st_mode & 07777),
        remedy);
  }
  return absl::OkStatus();
}

absl::Status CheckSocketFile(std::string_view socket_path_arg, std::string_view remedy) {
  const std::string socket_path(socket_path_arg);
  struct stat st {};
  if (::lstat(socket_path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(socket_path, " does not exist"));
    return Refuse("the socket", socket_path, absl::StrCat("cannot be inspected: ", std::strerror(errno)), remedy);
  }
  if (S_ISSOCK(st.st_mode)) return absl::OkStatus();
  const std::string instead = S_ISLNK(st.st_mode)   ? "a symbolic link"
                              : S_ISDIR(st.st_mode) ? "a folder"
                              : S_ISREG(st.st_mode) ? "a regular file"
                                                    : "another kind of file";
  return Refuse("the socket", socket_path, absl::StrCat("is ", instead, ", not a unix socket"), remedy);
}

}  // namespace cake
