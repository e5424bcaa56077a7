// Allgather. On one host, from Communicator::singleCopy's size: every rank
// reads each peer's input straight into its output block (one copy of each
// byte, not two through a ring), then ranks tell each other they are done;
// a rank returns only when every peer is done with its input.
//
// Otherwise a ring. Terms as in ring.h, with "block" for one rank's whole
// contribution: the layout has one chunk (the block) cut into segments.
//
// N-1 steps; in step s position p sends block (p - s) and receives block
// (p - s - 1), segment by segment, so a segment is forwarded as soon as it
// arrived. Received bytes land directly in the caller's output blocks.
// Step 0 sends from the input itself; the copy of the input into this rank's
// own output block is done segment by segment while waiting for the peers,
// so it does not delay the ring's start. A StageGate (in place only) is asked
// for each input segment before its step-0 send and told of each segment
// that arrived.
#include <cstring>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/ring.h"
#include "csrc/common/cpu.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {

void allgatherSingleCopy(Communicator& comm, const void* input, void* const* outputs,
                         size_t count, DataType dtype) {
  const int rank = comm.rank();
  const size_t bytes = count * elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kAllgather, count, dtype, ReduceOp::kSum, -1);
  header.variant = kSingleCopy;
  const std::vector<int> peers = comm.others();  // each rank starts with a different peer
  std::vector<uint64_t> address;
  comm.exchangeHeadersAndAddresses(header, peers, input, &address);
  if (outputs[rank] != input) {
    copyBytes(outputs[rank], input, bytes);
  }
  for (int peer : peers) {
    comm.readPeer(peer, address[static_cast<size_t>(peer)], outputs[peer], bytes);
  }
  comm.exchangeDone(peers, peers);
}

void allgatherRing(Communicator& comm, const void* input, void* const* outputs, size_t count,
                   DataType dtype, StageGate* gate) {
  const int n = comm.size();
  const int rank = comm.rank();
  comm.exchangeRingHeaders(comm.makeHeader(OpType::kAllgather, count, dtype, ReduceOp::kSum, -1));
  const size_t elem = elementSize(dtype);
  const bool copyOwn = count > 0 && outputs[rank] != input;
  if (n == 1 || count == 0) {
    if (copyOwn) {
      copyBytes(outputs[rank], input, count * elem);
    }
    return;
  }
  const ChunkLayout block(count, 1, comm.segmentBytes(), elem);
  const size_t perStep = block.segmentsPerChunk;
  const size_t total = static_cast<size_t>(n - 1) * perStep;
  const long pos = comm.ringPos();
  Channel& left = comm.channel(comm.left());
  Channel& right = comm.channel(comm.right());
  // Transfer t's block owner, byte offset in that block and length.
  auto piece = [&](size_t transfer, bool sending, int* owner, size_t* bytes) {
    long step = static_cast<long>(transfer / perStep);
    *owner = comm.ringRank(static_cast<int>(modPos(pos - step - (sending ? 0 : 1), n)));
    size_t offset, length;
    block.segment(0, transfer % perStep, &offset, &length);
    *bytes = length * elem;
    return offset * elem;
  };
  // Own block: input -> outputs[rank], one segment per idle moment.
  size_t ownCopied = copyOwn ? 0 : perStep;
  auto copyOwnSegment = [&] {
    size_t offset, length;
    block.segment(0, ownCopied++, &offset, &length);
    copyBytes(static_cast<char*>(outputs[rank]) + offset * elem,
              static_cast<const char*>(input) + offset * elem, length * elem);
  };

  if (gate != nullptr) {
    std::vector<std::pair<size_t, size_t>> ranges;
    for (size_t t = 0; t < perStep; ++t) {
      int owner;
      size_t bytes;
      size_t at = piece(t, true, &owner, &bytes);
      ranges.emplace_back(at, bytes);
    }
    gate->plan(ranges);
  }
  // Every receive goes straight to its final place, so all can be posted now.
  std::vector<uint64_t> recvTicket(total);
  for (size_t t = 0; t < total; ++t) {
    int owner;
    size_t bytes;
    size_t at = piece(t, false, &owner, &bytes);
    recvTicket[t] = left.postRecv(static_cast<char*>(outputs[owner]) + at, bytes);
  }
  uint64_t lastSend = 0;
  size_t sent = 0;
  size_t arrived = 0;
  auto countArrivals = [&] {
    while (arrived < total && left.recvDone(recvTicket[arrived])) {
      if (gate != nullptr) {
        int owner;
        size_t bytes;
        size_t at = piece(arrived, false, &owner, &bytes);
        gate->produced(static_cast<size_t>(owner) * count * elem + at, bytes);
      }
      ++arrived;
    }
  };
  auto finished = [&] {
    countArrivals();
    return sent == total && ownCopied == perStep && arrived == total && right.sendDone(lastSend);
  };
  for (;;) {
    countArrivals();
    // Step 0 sends our input; step s forwards transfer - perStep.
    bool waited = false;
    while (sent < total && (sent < perStep || arrived > sent - perStep)) {
      int owner;
      size_t bytes;
      size_t at = piece(sent, true, &owner, &bytes);
      if (gate != nullptr && sent < perStep) gate->need(at, bytes);
      const void* from = sent < perStep ? input : outputs[owner];
      lastSend = right.postSend(static_cast<const char*>(from) + at, bytes);
      ++sent;
      waited = gate != nullptr && sent <= perStep;
      if (waited) break;  // between input pieces, forward arrivals
    }
    bool moved = comm.progress();
    if (finished()) {
      return;
    }
    if (!moved && !waited) {
      if (ownCopied < perStep) {
        copyOwnSegment();
      } else {
        comm.waitForActivity();
      }
    }
  }
}

}  // namespace

void allgather(Communicator& comm, const void* input, void* const* outputs, size_t count,
               DataType dtype, StageGate* gate) {
  const size_t bytes = count * elementSize(dtype);
  RINGDIST_CHECK(gate == nullptr || input == outputs[comm.rank()],
                 "allgather: a staged input must be the rank's own output block");
  if (!comm.singleCopy(bytes)) {
    allgatherRing(comm, input, outputs, count, dtype, gate);
    return;
  }
  needWhole(gate, bytes);
  allgatherSingleCopy(comm, input, outputs, count, dtype);
  for (int r = 0; gate != nullptr && r < comm.size(); ++r) {
    if (r != comm.rank()) gate->produced(static_cast<size_t>(r) * bytes, bytes);
  }
}

}  // namespace ringdist
