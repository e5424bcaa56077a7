#include "csrc/collectives/rooted.h"

#include <cstring>
#include <vector>

#include "csrc/common/cpu.h"

namespace ringdist {

void rootedTransfers(Communicator& comm, OpType type, size_t count, DataType dtype, int root,
                     bool toRoot, void* const* rootBlocks, void* own) {
  const int rank = comm.rank();
  const size_t bytes = count * elementSize(dtype);
  OpHeader header = comm.makeHeader(type, count, dtype, ReduceOp::kSum, root);
  std::vector<int> peers = rank == root ? comm.others() : std::vector<int>{root};
  comm.exchangeHeaders(header, peers, peers);
  Communicator::Transfers sends, recvs;
  auto post = [&](int peer, void* block, bool send) {
    Channel& ch = comm.channel(peer);
    if (send) {
      sends.emplace_back(&ch, ch.postSend(block, bytes));
    } else {
      recvs.emplace_back(&ch, ch.postRecv(block, bytes));
    }
  };
  if (rank != root) {
    post(root, own, toRoot);
  } else {
    void* mine = rootBlocks[rank];
    if (bytes > 0 && mine != own) {
      copyBytes(toRoot ? mine : own, toRoot ? own : mine, bytes);
    }
    for (int peer : peers) {
      post(peer, rootBlocks[peer], !toRoot);
    }
  }
  comm.waitAll(sends, recvs);
}

}  // namespace ringdist
