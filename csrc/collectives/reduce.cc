// Reduce to a root: the ring reduce-scatter (ring.h, reduce_scatter.cc),
// then every rank sends its reduced chunk to the root. The root reduces its
// own chunk in place and receives the others straight into its buffer.
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/ring.h"
#include "csrc/common/error.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {

void reduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op, int root) {
  const int n = comm.size();
  const int rank = comm.rank();
  comm.exchangeRingHeaders(comm.makeHeader(OpType::kReduce, count, dtype, op, root));
  reduceFunction(dtype, op);
  if (n == 1 || count == 0) {
    return;
  }
  const size_t elem = elementSize(dtype);
  const ChunkLayout layout(count, n, comm.segmentBytes(), elem);
  char* base = static_cast<char*>(data);
  std::vector<const char*> chunks(static_cast<size_t>(n));
  for (size_t c = 0; c < static_cast<size_t>(n); ++c) {
    chunks[c] = base + layout.chunkOffset(c) * elem;
  }
  const size_t own = static_cast<size_t>(comm.ringPos());
  // The root reduces its own chunk in place; its other input chunks are
  // overwritten only after the reduce-scatter finished reading them.
  char* mine = ringReduceScatter(comm, chunks, layout, dtype, op,
                                 rank == root ? base + layout.chunkOffset(own) * elem : nullptr);
  if (rank != root) {
    Channel& toRoot = comm.channel(root);
    uint64_t ticket = toRoot.postSend(mine, layout.chunkLength(own) * elem);
    comm.waitUntil([&] { return toRoot.sendDone(ticket); });
    return;
  }
  Communicator::Transfers pending;
  for (int c = 0; c < n; ++c) {
    int peer = comm.ringRank(c);
    if (peer == rank) {
      continue;
    }
    Channel& ch = comm.channel(peer);
    size_t chunk = static_cast<size_t>(c);
    pending.emplace_back(&ch, ch.postRecv(base + layout.chunkOffset(chunk) * elem,
                                          layout.chunkLength(chunk) * elem));
  }
  comm.waitAll({}, pending);
}

}  // namespace ringdist
