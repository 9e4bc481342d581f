// Host shared-memory regions: the default backend where there is no GPU, and what every CI test exercises.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/random_id.h"
#include "base/status_macros.h"
#include "cuda/region.h"

namespace cake {
namespace {

// Maps every page now, so the first load into a region does not pay a page fault per 4 KiB (on some VMs that
// costs seconds per GiB: docs/benchmarks.md). A read is enough: the pages already exist in the shm object.
void TouchPages(const std::byte* data, uint64_t bytes) {
  const long page = sysconf(_SC_PAGESIZE);
  uint8_t sink = 0;
  for (uint64_t off = 0; off < bytes; off += static_cast<uint64_t>(page)) {
    sink ^= static_cast<uint8_t>(*reinterpret_cast<const volatile std::byte*>(data + off));
  }
  asm volatile("" : : "r"(sink));
}

absl::Status ErrnoStatus(const std::string& what, int err) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOMEM || err == ENOSPC) return absl::ResourceExhaustedError(msg);
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

class HostRegion final : public Region {
 public:
  explicit HostRegion(SharedMemory shm) : shm_(std::move(shm)) {}

  RegionBackend backend() const override { return RegionBackend::kHostShm; }
  uint64_t size() const override { return shm_.size(); }
  std::byte* host_data() override { return shm_.data(); }
  absl::Status CopyIn(uint64_t offset, std::span<const std::byte> src) override {
    CAKE_RETURN_IF_ERROR(CheckRange(size(), offset, src.size()));
    std::memcpy(shm_.data() + offset, src.data(), src.size());
    return absl::OkStatus();
  }
  absl::Status CopyOut(uint64_t offset, std::span<std::byte> dst) const override {
    CAKE_RETURN_IF_ERROR(CheckRange(size(), offset, dst.size()));
    std::memcpy(dst.data(), shm_.data() + offset, dst.size());
    return absl::OkStatus();
  }
  std::string export_handle() const override { return shm_.name(); }

 private:
  SharedMemory shm_;
};

}  // namespace

namespace {

// When this process started, in the realtime clock's seconds (/proc/self/stat's start time after boot plus
// /proc/stat's boot time); 0 when unknown.
double ProcessStartRealtime() {
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Field 22 (starttime, clock ticks after boot); the fields after the command's closing parenthesis.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  double boot = 0;
  std::ifstream proc_stat("/proc/stat");
  for (std::string key; proc_stat >> key;) {
    if (key == "btime") {
      proc_stat >> boot;
      break;
    }
  }
  uint64_t ticks = 0;
  if (boot == 0 || !absl::SimpleAtoi(field, &ticks)) return 0;
  return boot + static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

SweptSharedMemory SweepOrphanedSharedMemory(const std::string& shm_dir) {
  SweptSharedMemory swept;
  // In a container caked is pid 1 after every restart: an object named with this pid but last changed before this
  // process started is a predecessor's. (btime has a second's resolution: one second of margin.)
  const double started = ProcessStartRealtime();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(shm_dir, ec)) {
    const std::string name = entry.path().filename().string();
    // cake-<pid>-<32 hex>
    if (name.rfind("cake-", 0) != 0) continue;
    const size_t dash = name.find('-', 5);
    int pid = 0;
    if (dash == std::string::npos || name.size() - dash - 1 != 32 ||
        !absl::SimpleAtoi(absl::string_view(name.data() + 5, dash - 5), &pid) || pid <= 0) {
      continue;
    }
    struct stat st {};
    if (lstat(entry.path().c_str(), &st) != 0 || st.st_uid != geteuid() || !S_ISREG(st.st_mode)) continue;
    if (pid == getpid()) {
      if (started == 0 || static_cast<double>(st.st_mtim.tv_sec) >= started - 1) continue;  // this process's own
    } else if (kill(pid, 0) == 0 || errno != ESRCH) {
      continue;  // alive (or not ours to ask about): not an orphan
    }
    if (shm_unlink(("/" + name).c_str()) == 0) {
      ++swept.segments;
      swept.bytes += static_cast<uint64_t>(st.st_size);
    }
  }
  return swept;
}

namespace {

// Lets exactly one other user read and write the object, beside its owner: a POSIX access ACL written as the
// kernel's xattr (no libacl needed): owner rw, that user rw, group and others nothing.
absl::Status ShareWithUser(int fd, uid_t uid) {
  struct Entry {
    uint16_t tag, perm;
    uint32_t id;
  };
  constexpr uint16_t kUserObj = 0x01, kUser = 0x02, kGroupObj = 0x04, kMask = 0x10, kOther = 0x20;
  constexpr uint16_t kReadWrite = 06;
  constexpr uint32_t kUndefinedId = 0xffffffff;
  struct {
    uint32_t version = 2;  // POSIX_ACL_XATTR_VERSION
    Entry entries[5];
  } acl;
  static_assert(sizeof(acl) == 4 + 5 * 8);
  acl.entries[0] = {kUserObj, kReadWrite, kUndefinedId};
  acl.entries[1] = {kUser, kReadWrite, static_cast<uint32_t>(uid)};
  acl.entries[2] = {kGroupObj, 0, kUndefinedId};
  acl.entries[3] = {kMask, kReadWrite, kUndefinedId};
  acl.entries[4] = {kOther, 0, kUndefinedId};
  if (fsetxattr(fd, "system.posix_acl_access", &acl, sizeof(acl), 0) != 0) {
    const int err = errno;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot let uid ", uid, " map a host region: this /dev/shm refused a POSIX ACL (",
                     std::strerror(err), "); use inline loads (no region), or run the engine as the daemon's user"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SharedMemory> SharedMemory::Create(uint64_t bytes, std::optional<uid_t> shared_with_uid) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared-memory region needs at least one byte");
  SharedMemory shm;
  int fd = -1;
  for (int attempt = 0; attempt < 4 && fd < 0; ++attempt) {
    shm.name_ = absl::StrCat("/cake-", getpid(), "-", RandomHex128());
    fd = shm_open(shm.name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) return ErrnoStatus(absl::StrCat("shm_open ", shm.name_), errno);
  }
  if (fd < 0) return absl::InternalError("could not find a free shared-memory name");
  shm.owner_ = true;  // from here on the destructor unlinks the name
  if (shared_with_uid.has_value() && *shared_with_uid != geteuid()) {
    if (absl::Status shared = ShareWithUser(fd, *shared_with_uid); !shared.ok()) {
      close(fd);
      return shared;
    }
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(absl::StrCat("sizing shared memory ", shm.name_, " to ", bytes, " bytes"), err);
  }
  // Reserve the pages now: a tmpfs that runs out later would kill the daemon with SIGBUS mid-copy.
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    close(fd);
    return ErrnoStatus(absl::StrCat("reserving ", bytes, " bytes of shared memory (is /dev/shm big enough?)"), err);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return ErrnoStatus(absl::StrCat("mapping shared memory ", shm.name_), err);
  shm.data_ = static_cast<std::byte*>(p);
  shm.size_ = bytes;
  TouchPages(shm.data_, bytes);
  return shm;
}

absl::StatusOr<SharedMemory> SharedMemory::Open(const std::string& name, uint64_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(absl::StrCat("opening shared memory ", name), errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory ", name, " holds ", st.st_size, " bytes, fewer than the ", bytes, " expected"));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return ErrnoStatus(absl::StrCat("mapping shared memory ", name), err);
  SharedMemory shm;
  shm.name_ = name;
  shm.data_ = static_cast<std::byte*>(p);
  shm.size_ = bytes;
  TouchPages(shm.data_, bytes);
  return shm;
}

SharedMemory::SharedMemory(SharedMemory&& other) noexcept { *this = std::move(other); }

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

SharedMemory::~SharedMemory() { Reset(); }

void SharedMemory::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (owner_) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
}

absl::StatusOr<std::unique_ptr<Region>> CreateHostRegion(uint64_t bytes, std::optional<uid_t> shared_with_uid) {
  CAKE_ASSIGN_OR_RETURN(auto shm, SharedMemory::Create(bytes, shared_with_uid));
  return std::make_unique<HostRegion>(std::move(shm));
}

}  // namespace cake
