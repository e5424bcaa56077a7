// Dissemination barrier: in round k every rank signals rank + 2^k and waits
// for rank - 2^k; after ceil(log2 N) rounds everyone has heard from everyone.
// The signal is the op header itself, so ranks out of step fail clearly.
#include "csrc/collectives/collectives.h"

namespace ringdist {

void barrier(Communicator& comm) {
  const int n = comm.size();
  const int rank = comm.rank();
  OpHeader header = comm.makeHeader(OpType::kBarrier, 0, DataType::kUInt8, ReduceOp::kSum, -1);
  for (int distance = 1; distance < n; distance *= 2) {
    comm.exchangeHeaders(header, {(rank + distance) % n}, {(rank - distance + n) % n});
  }
}

}  // namespace ringdist
