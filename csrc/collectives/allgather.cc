// Ring allgather and pipelined chain broadcast. Terms as in ring.h, with
// "block" for one rank's whole contribution.
//
// Allgather: N-1 steps; in step s position p sends block (p - s) and
// receives block (p - s - 1), each cut into segments so a segment is
// forwarded as soon as it arrived. Received bytes land directly in the
// caller's output blocks.
//
// Broadcast: a chain along the ring starting at the root; every rank but
// the last forwards each segment to its right as soon as it arrived. The
// last rank then sends one byte on to the root (its right neighbour), so the
// root completes only when the whole chain did: a rank that failed anywhere
// in the chain fails the root's broadcast too, not just its next operation.
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
  const size_t bytes = count * elem;
  if (bytes > 0 && outputs[rank] != input) {
    std::memmove(outputs[rank], input, bytes);
  }
  if (n == 1 || bytes == 0) {
    return;
  }
  const size_t segBytes = std::max<size_t>(elem, comm.segmentBytes() / elem * elem);
  const size_t perStep = (bytes + segBytes - 1) / segBytes;
  const size_t total = static_cast<size_t>(n - 1) * perStep;
  const long pos = comm.ringPos();
  Channel& left = comm.channel(comm.left());
  Channel& right = comm.channel(comm.right());
  auto piece = [&](size_t transfer, bool sending, size_t* length) {
    long step = static_cast<long>(transfer / perStep);
    int owner = comm.ringRank(static_cast<int>(modPos(pos - step - (sending ? 0 : 1), n)));
    size_t offset = (transfer % perStep) * segBytes;
    *length = std::min(segBytes, bytes - offset);
    return static_cast<char*>(outputs[owner]) + offset;
  };

  // Every receive goes straight to its final place, so all can be posted now.
  std::vector<uint64_t> recvTicket(total);
  for (size_t t = 0; t < total; ++t) {
    size_t length;
    char* dst = piece(t, false, &length);
    recvTicket[t] = left.postRecv(dst, length);
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
      size_t length;
      char* src = piece(sent, true, &length);
      lastSend = right.postSend(src, length);
      ++sent;
    }
    if (sent < total && !comm.progress()) {
      comm.waitForActivity();
    }
  }
  comm.waitUntil([&] { return left.recvDone(recvTicket[total - 1]) && right.sendDone(lastSend); });
}

namespace {

void broadcastChain(Communicator& comm, void* data, size_t count, DataType dtype, int root) {
  const int n = comm.size();
  comm.exchangeRingHeaders(comm.makeHeader(OpType::kBroadcast, count, dtype, ReduceOp::kSum, root));
  const size_t bytes = count * elementSize(dtype);
  if (n == 1 || bytes == 0) {
    return;
  }
  // Position of this rank in the chain that starts at root.
  int rootPos = 0;
  for (int p = 0; p < n; ++p) {
    if (comm.ringRank(p) == root) {
      rootPos = p;
    }
  }
  const int chainPos = static_cast<int>(modPos(comm.ringPos() - rootPos, n));
  const size_t segBytes = std::max<size_t>(elementSize(dtype),
                                           comm.segmentBytes() / elementSize(dtype) * elementSize(dtype));
  const size_t segments = (bytes + segBytes - 1) / segBytes;
  char* base = static_cast<char*>(data);
  const bool forwards = chainPos < n - 1;
  Channel* right = &comm.channel(comm.right());
  uint64_t lastSend = 0;
  static const uint8_t kAckSent = 1;
  uint8_t ackReceived = 0;
  if (chainPos == 0) {
    for (size_t j = 0; j < segments; ++j) {
      lastSend = right->postSend(base + j * segBytes, std::min(segBytes, bytes - j * segBytes));
    }
    Channel& tail = comm.channel(comm.left());
    uint64_t ack = tail.postRecv(&ackReceived, 1);
    comm.waitUntil([&] { return right->sendDone(lastSend) && tail.recvDone(ack); });
    return;
  }
  Channel& left = comm.channel(comm.left());
  std::vector<uint64_t> recvTicket(segments);
  for (size_t j = 0; j < segments; ++j) {
    recvTicket[j] = left.postRecv(base + j * segBytes, std::min(segBytes, bytes - j * segBytes));
  }
  size_t forwarded = 0;
  comm.waitUntil([&] {
    while (forwarded < segments && left.recvDone(recvTicket[forwarded])) {
      if (forwards) {
        size_t offset = forwarded * segBytes;
        lastSend = right->postSend(base + offset, std::min(segBytes, bytes - offset));
      }
      ++forwarded;
    }
    return forwarded == segments && (!forwards || right->sendDone(lastSend));
  });
  if (!forwards) {
    Channel& root = comm.channel(comm.right());
    uint64_t ack = root.postSend(&kAckSent, 1);
    comm.waitUntil([&] { return root.sendDone(ack); });
  }
}

}  // namespace

void broadcast(Communicator& comm, void* data, size_t count, DataType dtype, int root) {
  broadcastChain(comm, data, count, dtype, root);
  if (comm.checkResults()) {
    checkIdenticalResults(comm, data, count * elementSize(dtype), "broadcast");
  }
}

}  // namespace ringdist
