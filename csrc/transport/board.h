#pragma once

#include <cstddef>

namespace ringdist {

// An area per rank, in memory every rank of the group maps, that only its
// owner writes: where the collectives exchange small operations without
// going through the channels (csrc/collectives/board.h). Exists when every
// rank of the group is on this host and reached over shared memory.
class Board {
 public:
  static constexpr size_t kAreaBytes = 16 << 10;

  virtual ~Board() = default;
  // Rank's area: kAreaBytes, 64-byte aligned, zero at first.
  virtual char* area(int rank) const = 0;
  // Wakes `rank` if it may be sleeping on its doorbell (Doorbell::arm):
  // what we wrote before the call is visible to its last look before it
  // sleeps. Costs no write while it spins.
  virtual void wake(int rank) = 0;
};

}  // namespace ringdist
