#include "csrc/transport/shm/segment.h"

#include <exception>
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

}  // namespace

size_t Segment::totalBytes(int localRanks, size_t ringBytes) {
  return dataOffset(localRanks) + ringBytes * static_cast<size_t>(localRanks) * static_cast<size_t>(localRanks);
}

uint64_t processStartTime(int pid) {
  std::ifstream in(strCat("/proc/", pid, "/stat"));
  std::string stat;
  try {
    stat.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception&) {
    return 0;  // the process exited between the open and the read (ESRCH): gone
  }
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
  seg.mapping_ = SharedMapping::create(totalBytes(localRanks, ringBytes));
  // ftruncate zero-fills; construct the atomics in place.
  auto* header = new (seg.base()) SegmentHeader{};
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
  seg.mapping_ = SharedMapping::open(name, sizeof(SegmentHeader));
  std::atomic_thread_fence(std::memory_order_acquire);
  RINGDIST_CHECK(seg.header()->magic == kSegmentMagic &&
                     seg.mapping_.bytes() >= totalBytes(seg.localRanks(), seg.ringBytes()),
                 "ringdist: shared memory segment ", name, " is not a ringdist segment");
  return seg;
}

Bell* Segment::bell(int local) const {
  return reinterpret_cast<Bell*>(base() + bellsOffset()) + local;
}

RingControl* Segment::control(int from, int to) const {
  int l = localRanks();
  return reinterpret_cast<RingControl*>(base() + controlsOffset(l)) + (from * l + to);
}

char* Segment::board(int local) const {
  return base() + boardsOffset(localRanks()) + static_cast<size_t>(local) * Board::kAreaBytes;
}

char* Segment::data(int from, int to) const {
  int l = localRanks();
  return base() + dataOffset(l) + static_cast<size_t>(from * l + to) * ringBytes();
}

}  // namespace shm
}  // namespace ringdist
