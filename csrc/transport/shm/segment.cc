#include "csrc/transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <sstream>

#include "csrc/common/error.h"

namespace ringdist {
namespace shm {

namespace {
constexpr uint64_t kSegmentMagic = 0x5244534847303033ull;  // "RDSHG003"

size_t align64(size_t n) { return (n + 63) / 64 * 64; }
size_t bellsOffset() { return align64(sizeof(SegmentHeader)); }
size_t controlsOffset(int l) { return bellsOffset() + align64(sizeof(Bell) * static_cast<size_t>(l)); }
size_t boardsOffset(int l) {
  return align64(controlsOffset(l) +
                 sizeof(RingControl) * static_cast<size_t>(l) * static_cast<size_t>(l));
}
size_t dataOffset(int l) {
  // Page-align the rings so each starts on its own pages.
  size_t end = boardsOffset(l) + Board::kAreaBytes * static_cast<size_t>(l);
  return (end + 4095) / 4096 * 4096;
}

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
}  // namespace

void* createShared(size_t bytes, std::string* name) {
  *name = randomName();
  int fd = ::shm_open(name->c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  RINGDIST_CHECK(fd >= 0, "ringdist: shm_open(", *name, ") failed: ", std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name->c_str());
    RINGDIST_FAIL("ringdist: cannot size shared memory segment to ", bytes, " bytes: ",
                  std::strerror(err));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name->c_str());
    RINGDIST_FAIL("ringdist: mmap of shared memory failed: ", std::strerror(err));
  }
  return base;
}

void* openShared(const std::string& name, size_t minBytes, size_t* bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  RINGDIST_CHECK(fd >= 0, "ringdist: shm_open(", name, ") failed: ", std::strerror(errno),
                 " (is /dev/shm shared between these ranks?)");
  return mapShared(fd, minBytes, bytes, name);
}

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

size_t Segment::totalBytes(int localRanks, size_t ringBytes) {
  return dataOffset(localRanks) + ringBytes * static_cast<size_t>(localRanks) * static_cast<size_t>(localRanks);
}

uint64_t processStartTime(int pid) {
  std::ifstream in(strCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may contain spaces) start past ')'.
  auto close = stat.rfind(')');
  if (close == std::string::npos) {
    return 0;
  }
  std::istringstream fields(stat.substr(close + 2));
  std::string state;
  fields >> state;
  if (state == "Z" || state == "X") {
    return 0;
  }
  constexpr unsigned long kExiting = 0x4;  // PF_EXITING in the kernel's task flags
  std::string skip;
  unsigned long flags = 0;
  for (int i = 4; i < 22; ++i) {
    if (i == 9) {
      fields >> flags;  // field 9: flags
    } else {
      fields >> skip;  // fields 4..21
    }
  }
  if ((flags & kExiting) != 0) {
    return 0;
  }
  uint64_t start = 0;
  fields >> start;  // field 22: starttime
  return start;
}

Segment Segment::create(int localRanks, size_t ringBytes) {
  Segment seg;
  seg.bytes_ = totalBytes(localRanks, ringBytes);
  seg.base_ = createShared(seg.bytes_, &seg.name_);
  seg.owner_ = true;
  seg.linked_ = true;
  // ftruncate zero-fills; construct the atomics in place.
  auto* header = new (seg.base_) SegmentHeader{};
  header->localRanks = static_cast<uint32_t>(localRanks);
  header->ringBytes = ringBytes;
  for (int i = 0; i < localRanks; ++i) {
    new (seg.bell(i)) Bell();
    for (int j = 0; j < localRanks; ++j) {
      new (seg.control(i, j)) RingControl();
    }
  }
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kSegmentMagic;
  return seg;
}

Segment Segment::open(const std::string& name) {
  Segment seg;
  seg.name_ = name;
  seg.base_ = openShared(name, sizeof(SegmentHeader), &seg.bytes_);
  std::atomic_thread_fence(std::memory_order_acquire);
  RINGDIST_CHECK(seg.header()->magic == kSegmentMagic &&
                     seg.bytes_ >= totalBytes(seg.localRanks(), seg.ringBytes()),
                 "ringdist: shared memory segment ", name, " is not a ringdist segment");
  return seg;
}

Segment::Segment(Segment&& other) noexcept { *this = std::move(other); }

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    this->~Segment();
    name_ = std::move(other.name_);
    base_ = other.base_;
    bytes_ = other.bytes_;
    owner_ = other.owner_;
    linked_ = other.linked_;
    other.base_ = nullptr;
    other.linked_ = false;
  }
  return *this;
}

Segment::~Segment() {
  if (owner_) {
    unlinkName();
  }
  if (base_ != nullptr) {
    ::munmap(base_, bytes_);
    base_ = nullptr;
  }
}

void Segment::unlinkName() {
  if (linked_) {
    ::shm_unlink(name_.c_str());
    linked_ = false;
  }
}

Bell* Segment::bell(int local) const {
  return reinterpret_cast<Bell*>(static_cast<char*>(base_) + bellsOffset()) + local;
}

RingControl* Segment::control(int from, int to) const {
  int l = localRanks();
  return reinterpret_cast<RingControl*>(static_cast<char*>(base_) + controlsOffset(l)) +
      (from * l + to);
}

char* Segment::board(int local) const {
  return static_cast<char*>(base_) + boardsOffset(localRanks()) +
         static_cast<size_t>(local) * Board::kAreaBytes;
}

char* Segment::data(int from, int to) const {
  int l = localRanks();
  return static_cast<char*>(base_) + dataOffset(l) +
      static_cast<size_t>(from * l + to) * ringBytes();
}

}  // namespace shm
}  // namespace ringdist
