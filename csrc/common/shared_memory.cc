#include "csrc/common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "csrc/common/error.h"

namespace ringdist {

namespace {
std::string randomName() {
  unsigned char bytes[12];
  RINGDIST_CHECK(::getrandom(bytes, sizeof(bytes), 0) == static_cast<ssize_t>(sizeof(bytes)),
                 "ringdist: getrandom() failed: ", std::strerror(errno));
  static const char* hex = "0123456789abcdef";
  std::string name = "/ringdist-";
  for (unsigned char b : bytes) {
    name += hex[b >> 4];
    name += hex[b & 15];
  }
  return name;
}
// The names this process created and has not unlinked yet, removed at its exit: a connect
// still waiting for its same-host peers to map a segment when the process ends (a group that
// was connecting ahead, abandoned on a daemon thread) would otherwise leave it in /dev/shm.
// Never destroyed: such a thread may still use it while the process exits. Each name with
// its creator's pid: a forked child that exits through exit() inherits the set, not the names.
struct OwnedNames {
  std::mutex mutex;
  std::map<std::string, pid_t> names;
};

OwnedNames& ownedNames() {
  static OwnedNames* owned = [] {
    auto* names = new OwnedNames;
    std::atexit([] {
      OwnedNames& all = ownedNames();
      std::lock_guard<std::mutex> lock(all.mutex);
      for (const auto& [name, creator] : all.names) {
        if (creator == ::getpid()) ::shm_unlink(name.c_str());
      }
      all.names.clear();
    });
    return names;
  }();
  return *owned;
}
}  // namespace

SharedMapping SharedMapping::create(size_t bytes) {
  SharedMapping mapping;
  std::string name = randomName();
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  RINGDIST_CHECK(fd >= 0, "ringdist: shm_open(", name, ") failed: ", std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    RINGDIST_FAIL("ringdist: cannot size shared memory segment to ", bytes, " bytes: ",
                  std::strerror(err));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    RINGDIST_FAIL("ringdist: mmap of shared memory failed: ", std::strerror(err));
  }
  {
    OwnedNames& owned = ownedNames();
    std::lock_guard<std::mutex> lock(owned.mutex);
    owned.names.emplace(name, ::getpid());
  }
  mapping.name_ = std::move(name);
  mapping.base_ = base;
  mapping.bytes_ = bytes;
  mapping.linked_ = true;
  return mapping;
}

SharedMapping SharedMapping::open(const std::string& name, size_t minBytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  RINGDIST_CHECK(fd >= 0, "ringdist: shm_open(", name, ") failed: ", std::strerror(errno),
                 " (is /dev/shm shared between these ranks?)");
  SharedMapping mapping;
  mapping.base_ = mapShared(fd, minBytes, &mapping.bytes_, name);
  mapping.name_ = name;
  return mapping;
}

SharedMapping::SharedMapping(SharedMapping&& other) noexcept { *this = std::move(other); }

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
  if (this != &other) {
    this->~SharedMapping();
    name_ = std::move(other.name_);
    base_ = other.base_;
    bytes_ = other.bytes_;
    linked_ = other.linked_;
    other.base_ = nullptr;
    other.bytes_ = 0;
    other.linked_ = false;
  }
  return *this;
}

SharedMapping::~SharedMapping() {
  unlinkName();
  if (base_ != nullptr) {
    ::munmap(base_, bytes_);
    base_ = nullptr;
  }
}

void SharedMapping::unlinkName() {
  if (linked_) {
    OwnedNames& owned = ownedNames();
    std::lock_guard<std::mutex> lock(owned.mutex);
    owned.names.erase(name_);
    removeSharedName(name_);
    linked_ = false;
  }
}

void removeSharedName(const std::string& name) { ::shm_unlink(name.c_str()); }

void* mapShared(int fd, size_t minBytes, size_t* bytes, const std::string& name) {
  struct stat st{};
  ::fstat(fd, &st);
  *bytes = static_cast<size_t>(st.st_size);
  void* base = *bytes >= minBytes
      ? ::mmap(nullptr, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
      : MAP_FAILED;
  int err = *bytes >= minBytes ? errno : EINVAL;
  ::close(fd);
  RINGDIST_CHECK(base != MAP_FAILED, "ringdist: mmap of shared memory ", name, " failed: ",
                 std::strerror(err));
  return base;
}

}  // namespace ringdist
