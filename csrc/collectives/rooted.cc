// Gather, scatter and all-to-all: direct transfers over the full mesh.
// The root (or every rank, for all-to-all) posts all its receives and sends
// at once and lets the progress loop move them concurrently.
#include <cstring>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {

std::vector<int> othersThan(int rank, int size) {
  std::vector<int> peers;
  for (int r = 0; r < size; ++r) {
    if (r != rank) peers.push_back(r);
  }
  return peers;
}

}  // namespace

void gather(Communicator& comm, const void* input, void* const* outputs, size_t count,
            DataType dtype, int root) {
  const int rank = comm.rank();
  const size_t bytes = count * elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kGather, count, dtype, ReduceOp::kSum, root);
  std::vector<int> peers = rank == root ? othersThan(rank, comm.size()) : std::vector<int>{root};
  comm.exchangeHeaders(header, peers, peers);
  Communicator::Transfers sends, recvs;
  if (rank == root) {
    if (bytes > 0 && outputs[rank] != input) {
      std::memmove(outputs[rank], input, bytes);
    }
    for (int peer : peers) {
      Channel& ch = comm.channel(peer);
      recvs.emplace_back(&ch, ch.postRecv(outputs[peer], bytes));
    }
  } else {
    Channel& ch = comm.channel(root);
    sends.emplace_back(&ch, ch.postSend(input, bytes));
  }
  comm.waitAll(sends, recvs);
}

void scatter(Communicator& comm, const void* const* inputs, void* output, size_t count,
             DataType dtype, int root) {
  const int rank = comm.rank();
  const size_t bytes = count * elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kScatter, count, dtype, ReduceOp::kSum, root);
  std::vector<int> peers = rank == root ? othersThan(rank, comm.size()) : std::vector<int>{root};
  comm.exchangeHeaders(header, peers, peers);
  Communicator::Transfers sends, recvs;
  if (rank == root) {
    if (bytes > 0 && inputs[rank] != output) {
      std::memmove(output, inputs[rank], bytes);
    }
    for (int peer : peers) {
      Channel& ch = comm.channel(peer);
      sends.emplace_back(&ch, ch.postSend(inputs[peer], bytes));
    }
  } else {
    Channel& ch = comm.channel(root);
    recvs.emplace_back(&ch, ch.postRecv(output, bytes));
  }
  comm.waitAll(sends, recvs);
}

void alltoall(Communicator& comm, const void* const* inputs, const std::vector<uint64_t>& sendCounts,
              void* const* outputs, const std::vector<uint64_t>& recvCounts, DataType dtype) {
  const int rank = comm.rank();
  const int n = comm.size();
  const size_t elem = elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kAlltoall, 0, dtype, ReduceOp::kSum, -1);
  std::vector<int> peers = othersThan(rank, n);
  comm.exchangeHeaders(header, peers, peers, &sendCounts, &recvCounts);
  RINGDIST_CHECK(sendCounts[static_cast<size_t>(rank)] == recvCounts[static_cast<size_t>(rank)],
                 "ringdist alltoall: rank ", rank, " sends ", sendCounts[static_cast<size_t>(rank)],
                 " elements to itself but expects ", recvCounts[static_cast<size_t>(rank)]);
  size_t selfBytes = recvCounts[static_cast<size_t>(rank)] * elem;
  if (selfBytes > 0 && outputs[rank] != inputs[rank]) {
    std::memmove(outputs[rank], inputs[rank], selfBytes);
  }
  // Start with the peer after us so not every rank hits rank 0 first.
  Communicator::Transfers sends, recvs;
  for (int k = 1; k < n; ++k) {
    int to = (rank + k) % n;
    int from = (rank - k + n) % n;
    Channel& out = comm.channel(to);
    sends.emplace_back(&out, out.postSend(inputs[to], sendCounts[static_cast<size_t>(to)] * elem));
    Channel& in = comm.channel(from);
    recvs.emplace_back(&in, in.postRecv(outputs[from], recvCounts[static_cast<size_t>(from)] * elem));
  }
  comm.waitAll(sends, recvs);
}

// Dissemination barrier: in round k every rank signals rank + 2^k and waits
// for rank - 2^k; after ceil(log2 N) rounds everyone has heard from everyone.
void barrier(Communicator& comm) {
  const int n = comm.size();
  const int rank = comm.rank();
  OpHeader header = comm.makeHeader(OpType::kBarrier, 0, DataType::kUInt8, ReduceOp::kSum, -1);
  for (int distance = 1; distance < n; distance *= 2) {
    comm.exchangeHeaders(header, {(rank + distance) % n}, {(rank - distance + n) % n});
  }
}

}  // namespace ringdist
