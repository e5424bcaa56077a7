#pragma once

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "csrc/common/shared_memory.h"
#include "csrc/transport/board.h"

namespace ringdist {
namespace shm {

// One shared-memory segment per host per process group, shared by the L
// ranks of the group on that host ("local ranks", numbered 0..L-1 in rank
// order). Layout:
//   SegmentHeader
//   Bell[L]              one futex doorbell per local rank
//   RingControl[L * L]   (from, to) -> head/tail of the byte ring from -> to
//   board[L]             Board::kAreaBytes each, written by its owner only
//   data[L * L]          ringBytes each; the diagonal is never touched, and
//                        tmpfs only backs pages that are written
// The creator (lowest local rank) unlinks the name as soon as every local
// rank has mapped it, so nothing stays in /dev/shm even if a rank crashes
// later.

struct alignas(64) Bell {
  std::atomic<uint32_t> seq;       // bumped by every ring; the futex word
  std::atomic<uint32_t> sleeping;  // set while the owner may sleep
  int32_t pid;                     // owner's pid and its start time (clock
  uint64_t startTime;              // ticks since boot), for liveness checks
  // The CPU the owner last began an op or a wait on, -1 before; on a line of
  // its own, which the owner writes often, away from the words wakers read.
  alignas(64) std::atomic<int32_t> cpu;
  // The CPUs the owner may run on (its affinity at connect time); the host's
  // ranks together may use the union of their sets.
  cpu_set_t cpus;
  // Single copy (peers read each other's memory): the owner publishes where
  // a known value sits in its memory, each peer tries to read it
  // (connect.cc), and the host uses single copy only if every rank could.
  uint64_t probeAddress;
  uint64_t probeValue;
  std::atomic<uint32_t> singleCopy;  // SingleCopyState
  // Whether single copy pays on this host (RINGDIST_SINGLE_COPY=auto): the
  // owner's SingleCopyMode, published with its probe value; then the copy
  // probe's barrier step, the buffer peers read, and the owner's best times.
  uint32_t copyMode;
  std::atomic<uint32_t> probeStep;
  uint64_t probeBuffer;
  uint64_t kernelCopyNs;  // process_vm_readv of kCopyProbeBytes from its left neighbour
  uint64_t ringCopyNs;    // memcpy into its ring plus memcpy out of the neighbour's
};

enum SingleCopyState : uint32_t {
  kProbeUnpublished = 0,
  kProbePublished,    // probeAddress/probeValue are valid
  kReadsEveryPeer,    // this rank read every peer's probe value
  kNoPeerReads,       // it could not (or single copy is off here)
};

// Start time of a process from /proc/<pid>/stat, 0 if it is gone, a zombie
// (a killed rank not yet reaped by its parent is dead to us) or exiting
// (PF_EXITING: a killed rank tearing down its memory, which it has already
// let go of, is not yet a zombie).
uint64_t processStartTime(int pid);

struct alignas(64) RingControl {
  alignas(64) std::atomic<uint64_t> head;  // bytes written (writer only)
  alignas(64) std::atomic<uint64_t> tail;  // bytes read (reader only)
  alignas(64) std::atomic<uint32_t> closed;
  // Set by `from` while it writes into `to`'s memory (single copy): `to`
  // closing the link waits for it to clear, so no write lands after `to`
  // left its operation.
  std::atomic<uint32_t> writing;
};

struct SegmentHeader {
  uint64_t magic;
  uint32_t localRanks;
  uint32_t reserved;
  uint64_t ringBytes;
};

class Segment {
 public:
  // Creates a new segment with a random, unguessable name (mode 0600).
  static Segment create(int localRanks, size_t ringBytes);
  // Maps an existing segment by name.
  static Segment open(const std::string& name);

  const std::string& name() const { return mapping_.name(); }
  void unlinkName() { mapping_.unlinkName(); }  // idempotent; the mapping stays valid

  int localRanks() const { return static_cast<int>(header()->localRanks); }
  size_t ringBytes() const { return header()->ringBytes; }
  Bell* bell(int local) const;
  RingControl* control(int from, int to) const;
  char* board(int local) const;
  char* data(int from, int to) const;

 private:
  static size_t totalBytes(int localRanks, size_t ringBytes);
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(mapping_.base()); }
  char* base() const { return static_cast<char*>(mapping_.base()); }

  SharedMapping mapping_;  // the creator's unlinks the name at the latest when it ends
};

}  // namespace shm
}  // namespace ringdist
