// Gather: direct transfers over the full mesh. The root posts a receive from
// every peer at once, straight into its output blocks, and lets the progress
// loop move them concurrently; every other rank sends its input to the root.
#include <cstring>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/common/error.h"

namespace ringdist {

void gather(Communicator& comm, const void* input, void* const* outputs, size_t count,
            DataType dtype, int root) {
  const int rank = comm.rank();
  const size_t bytes = count * elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kGather, count, dtype, ReduceOp::kSum, root);
  std::vector<int> peers = rank == root ? comm.others() : std::vector<int>{root};
  comm.exchangeHeaders(header, peers, peers);
  Communicator::Transfers sends, recvs;
  if (rank != root) {
    Channel& ch = comm.channel(root);
    sends.emplace_back(&ch, ch.postSend(input, bytes));
  } else {
    if (bytes > 0 && outputs[rank] != input) {
      std::memmove(outputs[rank], input, bytes);
    }
    for (int peer : peers) {
      Channel& ch = comm.channel(peer);
      recvs.emplace_back(&ch, ch.postRecv(outputs[peer], bytes));
    }
  }
  comm.waitAll(sends, recvs);
}

}  // namespace ringdist
