// Ring allgather. Terms as in ring.h, with "block" for one rank's whole
// contribution: the layout has one chunk (the block) cut into segments.
//
// N-1 steps; in step s position p sends block (p - s) and receives block
// (p - s - 1), segment by segment, so a segment is forwarded as soon as it
// arrived. Received bytes land directly in the caller's output blocks.
#include <cstring>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/ring.h"
#include "csrc/common/error.h"

namespace ringdist {

void allgather(Communicator& comm, const void* input, void* const* outputs, size_t count,
               DataType dtype) {
  const int n = comm.size();
  const int rank = comm.rank();
  comm.exchangeRingHeaders(comm.makeHeader(OpType::kAllgather, count, dtype, ReduceOp::kSum, -1));
  const size_t elem = elementSize(dtype);
  if (count > 0 && outputs[rank] != input) {
    std::memmove(outputs[rank], input, count * elem);
  }
  if (n == 1 || count == 0) {
    return;
  }
  const ChunkLayout block(count, 1, comm.segmentBytes(), elem);
  const size_t perStep = block.segmentsPerChunk;
  const size_t total = static_cast<size_t>(n - 1) * perStep;
  const long pos = comm.ringPos();
  Channel& left = comm.channel(comm.left());
  Channel& right = comm.channel(comm.right());
  auto piece = [&](size_t transfer, bool sending, size_t* bytes) {
    long step = static_cast<long>(transfer / perStep);
    int owner = comm.ringRank(static_cast<int>(modPos(pos - step - (sending ? 0 : 1), n)));
    size_t offset, length;
    block.segment(0, transfer % perStep, &offset, &length);
    *bytes = length * elem;
    return static_cast<char*>(outputs[owner]) + offset * elem;
  };

  // Every receive goes straight to its final place, so all can be posted now.
  std::vector<uint64_t> recvTicket(total);
  for (size_t t = 0; t < total; ++t) {
    size_t bytes;
    char* dst = piece(t, false, &bytes);
    recvTicket[t] = left.postRecv(dst, bytes);
  }
  uint64_t lastSend = 0;
  size_t sent = 0;
  size_t arrived = 0;
  while (sent < total) {
    while (arrived < total && left.recvDone(recvTicket[arrived])) {
      ++arrived;
    }
    // Step 0 sends our own block; step s forwards transfer - perStep.
    while (sent < total && (sent < perStep || arrived > sent - perStep)) {
      size_t bytes;
      char* src = piece(sent, true, &bytes);
      lastSend = right.postSend(src, bytes);
      ++sent;
    }
    if (sent < total && !comm.progress()) {
      comm.waitForActivity();
    }
  }
  comm.waitUntil([&] { return left.recvDone(recvTicket[total - 1]) && right.sendDone(lastSend); });
}

}  // namespace ringdist
