// The host shared-memory Region backend and SharedMemory: bounds, naming, permissions, sharing and lifetime.
#include "cuda/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "testing/child_process.h"

namespace cake {
namespace {

std::vector<std::byte> Pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed + i * 7);
  return v;
}

bool IsLowerHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("region: CheckRange accepts exactly the ranges inside the region", "[region]") {
  CHECK(CheckRange(100, 0, 100).ok());
  CHECK(CheckRange(100, 100, 0).ok());
  CHECK(CheckRange(100, 40, 60).ok());
  CHECK(CheckRange(0, 0, 0).ok());
  CHECK(CheckRange(100, 0, 101).code() == absl::StatusCode::kOutOfRange);
  CHECK(CheckRange(100, 41, 60).code() == absl::StatusCode::kOutOfRange);
  CHECK(CheckRange(100, 101, 0).code() == absl::StatusCode::kOutOfRange);
  // offset + bytes wraps past 2^64 to a small number: it must still be refused.
  CHECK(CheckRange(100, UINT64_MAX, 2).code() == absl::StatusCode::kOutOfRange);
  CHECK(CheckRange(100, UINT64_MAX - 10, 20).code() == absl::StatusCode::kOutOfRange);
  CHECK(CheckRange(100, 50, UINT64_MAX).code() == absl::StatusCode::kOutOfRange);
  CHECK(CheckRange(UINT64_MAX, UINT64_MAX - 1, 1).ok());
}

TEST_CASE("region: a host region copies in and out", "[region]") {
  constexpr uint64_t kSize = 64 << 10;
  auto region = CreateHostRegion(kSize);
  REQUIRE(region.ok());
  Region& r = **region;
  CHECK(r.backend() == RegionBackend::kHostShm);
  CHECK(r.size() == kSize);
  REQUIRE(r.host_data() != nullptr);

  const auto in = Pattern(5000, 3);
  REQUIRE(r.CopyIn(1234, in).ok());
  std::vector<std::byte> out(in.size());
  REQUIRE(r.CopyOut(1234, out).ok());
  CHECK(out == in);
  // host_data is the same memory CopyIn wrote: tiers read straight into it.
  CHECK(std::memcmp(r.host_data() + 1234, in.data(), in.size()) == 0);

  // The last byte is reachable; one past it is not.
  REQUIRE(r.CopyIn(kSize - 1, std::span(in).first(1)).ok());
  CHECK(r.CopyIn(kSize - 1, std::span(in).first(2)).code() == absl::StatusCode::kOutOfRange);
  CHECK(r.CopyOut(kSize - 1, std::span(out).first(2)).code() == absl::StatusCode::kOutOfRange);
  CHECK(r.CopyIn(kSize + 1, {}).code() == absl::StatusCode::kOutOfRange);
  CHECK(r.CopyIn(UINT64_MAX, std::span(in).first(2)).code() == absl::StatusCode::kOutOfRange);
  CHECK(r.CopyOut(UINT64_MAX - 1, std::span(out).first(4)).code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("region: a host region exports its shm name, which an engine can open", "[region]") {
  auto region = CreateHostRegion(8192);
  REQUIRE(region.ok());
  const std::string name = (*region)->export_handle();
  auto engine = SharedMemory::Open(name, 8192);
  REQUIRE(engine.ok());
  const auto in = Pattern(100, 9);
  REQUIRE((*region)->CopyIn(4000, in).ok());
  CHECK(std::memcmp(engine->data() + 4000, in.data(), in.size()) == 0);
}

TEST_CASE("region: shared memory names are random and unguessable", "[region]") {
  auto a = SharedMemory::Create(4096);
  auto b = SharedMemory::Create(4096);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const std::string prefix = "/cake-" + std::to_string(getpid()) + "-";
  for (const SharedMemory* shm : {&*a, &*b}) {
    const std::string& name = shm->name();
    REQUIRE(name.size() == prefix.size() + 32);
    CHECK(name.substr(0, prefix.size()) == prefix);  // the creator's pid, for the sweep of a dead one's
    CHECK(IsLowerHex(name.substr(prefix.size())));
  }
  CHECK(a->name() != b->name());
}

TEST_CASE("region: the sweep removes a dead creator's segments only", "[region]") {
  // A pid that is surely gone: a child that has exited and been reaped.
  ChildProcess::Options options;
  options.argv = {"/bin/true"};
  options.output_path = "/dev/null";
  auto started = ChildProcess::Start(options);
  REQUIRE(started.ok());
  const pid_t child = started->pid();
  REQUIRE(started->Wait() == 0);
  auto make = [](const std::string& name) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 8192) == 0);
    close(fd);
  };
  const std::string hex(32, 'a');
  const std::string dead = "/cake-" + std::to_string(child) + "-" + hex;
  const std::string alive = "/cake-1-" + hex;     // pid 1 is always there
  const std::string other_form = "/cake-" + hex;  // an older daemon's name: no pid to judge by
  for (const auto& n : {dead, alive, other_form}) make(n);
  auto mine = SharedMemory::Create(4096);  // this process is alive
  REQUIRE(mine.ok());

  const SweptSharedMemory swept = SweepOrphanedSharedMemory();
  CHECK(swept.segments >= 1);  // ours, and maybe leftovers of earlier test runs
  CHECK(swept.bytes >= 8192);
  auto exists = [](const std::string& n) { return access(("/dev/shm" + n).c_str(), F_OK) == 0; };
  CHECK_FALSE(exists(dead));
  CHECK(exists(alive));
  CHECK(exists(other_form));
  CHECK(exists(mine->name()));
  for (const auto& n : {alive, other_form}) shm_unlink(n.c_str());
}

TEST_CASE("region: the sweep removes a predecessor's segments that carry this process's pid", "[region]") {
  // In a container the daemon is pid 1 after every restart: its predecessor's leftovers carry its own pid, and
  // only their age tells them from its own.
  const std::string hex(32, 'b');
  const std::string predecessor = "/cake-" + std::to_string(getpid()) + "-" + hex;
  const int fd = shm_open(predecessor.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 4096) == 0);
  const timespec an_hour_ago[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
  REQUIRE(futimens(fd, an_hour_ago) == 0);
  close(fd);
  auto mine = SharedMemory::Create(4096);  // made after this process started: its own
  REQUIRE(mine.ok());

  SweepOrphanedSharedMemory();
  CHECK(access(("/dev/shm" + predecessor).c_str(), F_OK) != 0);
  CHECK(access(("/dev/shm" + mine->name()).c_str(), F_OK) == 0);
  shm_unlink(predecessor.c_str());
}

TEST_CASE("region: the shm object is owner-only", "[region]") {
  auto shm = SharedMemory::Create(4096);
  REQUIRE(shm.ok());
  struct stat st {};
  REQUIRE(stat(("/dev/shm" + shm->name()).c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK(st.st_uid == geteuid());
  CHECK(static_cast<uint64_t>(st.st_size) == 4096);
}

TEST_CASE("region: an opener sees the creator's bytes, and the creator sees the opener's", "[region]") {
  auto owner = SharedMemory::Create(1 << 16);
  REQUIRE(owner.ok());
  CHECK(owner->size() == 1 << 16);
  const auto in = Pattern(1 << 16, 1);
  std::memcpy(owner->data(), in.data(), in.size());

  auto opener = SharedMemory::Open(owner->name(), 1 << 16);
  REQUIRE(opener.ok());
  CHECK(opener->name() == owner->name());
  CHECK(opener->size() == 1 << 16);
  CHECK(opener->data() != owner->data());  // two mappings of one object
  CHECK(std::memcmp(opener->data(), in.data(), in.size()) == 0);

  opener->data()[100] = std::byte{0xAB};
  CHECK(owner->data()[100] == std::byte{0xAB});

  // Mapping less than the whole object is allowed: an engine may use a prefix.
  auto prefix = SharedMemory::Open(owner->name(), 4096);
  REQUIRE(prefix.ok());
  CHECK(prefix->size() == 4096);
  CHECK(prefix->data()[100] == std::byte{0xAB});
}

TEST_CASE("region: the owner unlinks the name, existing openers keep their mapping", "[region]") {
  auto owner = SharedMemory::Create(4096);
  REQUIRE(owner.ok());
  const std::string name = owner->name();
  std::memset(owner->data(), 0x5A, 4096);
  auto opener = SharedMemory::Open(name, 4096);
  REQUIRE(opener.ok());

  { SharedMemory gone = std::move(*owner); }

  auto late = SharedMemory::Open(name, 4096);
  CHECK(late.status().code() == absl::StatusCode::kNotFound);
  struct stat st {};
  CHECK(stat(("/dev/shm" + name).c_str(), &st) != 0);
  CHECK(opener->data()[0] == std::byte{0x5A});
  CHECK(opener->data()[4095] == std::byte{0x5A});

  // An opener going away never unlinks: only the owner's name is its to remove.
  auto owner2 = SharedMemory::Create(4096);
  REQUIRE(owner2.ok());
  {
    auto reader = SharedMemory::Open(owner2->name(), 4096);
    REQUIRE(reader.ok());
  }
  CHECK(SharedMemory::Open(owner2->name(), 4096).ok());
}

TEST_CASE("region: opening errors", "[region]") {
  auto owner = SharedMemory::Create(4096);
  REQUIRE(owner.ok());
  CHECK(SharedMemory::Open(owner->name(), 4097).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(SharedMemory::Open("/cake-00000000000000000000000000000000", 4096).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(SharedMemory::Create(0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CreateHostRegion(0).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("region: SharedMemory moves ownership", "[region]") {
  auto created = SharedMemory::Create(4096);
  REQUIRE(created.ok());
  const std::string name = created->name();
  std::byte* data = created->data();

  SharedMemory a = std::move(*created);
  CHECK(a.data() == data);
  CHECK(a.size() == 4096);
  CHECK(a.name() == name);
  CHECK(created->data() == nullptr);
  CHECK(created->size() == 0);

  // Destroying the moved-from object must not unlink what it no longer owns.
  { SharedMemory moved_from = std::move(*created); }
  CHECK(SharedMemory::Open(name, 4096).ok());

  auto other = SharedMemory::Create(4096);
  REQUIRE(other.ok());
  const std::string other_name = other->name();
  // Move assignment releases what the target held (unlinking its name) and takes the source's.
  SharedMemory b = std::move(*other);
  b = std::move(a);
  CHECK(b.name() == name);
  CHECK(b.data() == data);
  CHECK(SharedMemory::Open(other_name, 4096).status().code() == absl::StatusCode::kNotFound);
  CHECK(SharedMemory::Open(name, 4096).ok());

  SharedMemory& self = b;
  b = std::move(self);
  CHECK(b.data() == data);
  CHECK(SharedMemory::Open(name, 4096).ok());
}

}  // namespace cake
