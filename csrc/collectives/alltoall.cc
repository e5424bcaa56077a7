// All-to-all with per-peer sizes: every rank posts all its sends and
// receives at once over the full mesh and lets the progress loop move them
// concurrently. The op headers carry each pair's count, so a rank that
// expects another size from a peer than the peer sends fails naming both.
#include <cstring>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/common/cpu.h"
#include "csrc/common/error.h"

namespace ringdist {

void alltoall(Communicator& comm, const void* const* inputs, const std::vector<uint64_t>& sendCounts,
              void* const* outputs, const std::vector<uint64_t>& recvCounts, DataType dtype) {
  const int rank = comm.rank();
  const size_t me = static_cast<size_t>(rank);
  const size_t elem = elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kAlltoall, 0, dtype, ReduceOp::kSum, -1);
  const std::vector<int> peers = comm.others();
  comm.exchangeHeaders(header, peers, peers, &sendCounts, &recvCounts);
  RINGDIST_CHECK(sendCounts[me] == recvCounts[me], "ringdist alltoall: rank ", rank, " sends ",
                 sendCounts[me], " elements to itself but expects ", recvCounts[me]);
  if (recvCounts[me] > 0 && outputs[rank] != inputs[rank]) {
    copyBytes(outputs[rank], inputs[rank], recvCounts[me] * elem);
  }
  // others() starts with the peer after us, so not every rank hits rank 0 first.
  Communicator::Transfers sends, recvs;
  for (int peer : peers) {
    const size_t p = static_cast<size_t>(peer);
    Channel& ch = comm.channel(peer);
    sends.emplace_back(&ch, ch.postSend(inputs[peer], sendCounts[p] * elem));
    recvs.emplace_back(&ch, ch.postRecv(outputs[peer], recvCounts[p] * elem));
  }
  comm.waitAll(sends, recvs);
}

}  // namespace ringdist
