// Scatter: direct transfers over the full mesh. The root posts a send to
// every peer at once and lets the progress loop move them concurrently;
// every other rank receives its block from the root.
#include <cstring>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/common/error.h"

namespace ringdist {

void scatter(Communicator& comm, const void* const* inputs, void* output, size_t count,
             DataType dtype, int root) {
  const int rank = comm.rank();
  const size_t bytes = count * elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kScatter, count, dtype, ReduceOp::kSum, root);
  std::vector<int> peers = rank == root ? comm.others() : std::vector<int>{root};
  comm.exchangeHeaders(header, peers, peers);
  Communicator::Transfers sends, recvs;
  if (rank != root) {
    Channel& ch = comm.channel(root);
    recvs.emplace_back(&ch, ch.postRecv(output, bytes));
  } else {
    if (bytes > 0 && inputs[rank] != output) {
      std::memmove(output, inputs[rank], bytes);
    }
    for (int peer : peers) {
      Channel& ch = comm.channel(peer);
      sends.emplace_back(&ch, ch.postSend(inputs[peer], bytes));
    }
  }
  comm.waitAll(sends, recvs);
}

}  // namespace ringdist
