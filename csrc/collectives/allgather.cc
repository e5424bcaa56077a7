// Allgather. On one host, from Communicator::singleCopy's size: every rank
// reads each peer's input straight into its output block (one copy of each
// byte, not two through a ring), then ranks tell each other they are done;
// a rank returns only when every peer is done with its input.
//
// One rank per host on long links: a direct exchange, every peer at once (allgatherDirect).
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

// Direct exchange (one rank per host on long links, by the route model): every rank sends its
// block, behind the op header, to every peer at once and receives each peer's straight into
// its output block: one one-way trip where the ring takes N-1. A header that differs fails the
// operation (and so the group) before it returns.
void allgatherDirect(Communicator& comm, const void* input, void* const* outputs, size_t count,
                     DataType dtype) {
  const int rank = comm.rank();
  const size_t bytes = count * elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kAllgather, count, dtype, ReduceOp::kSum, -1);
  header.variant = kDirectCopy;
  if (outputs[rank] != input) copyBytes(outputs[rank], input, bytes);
  comm.exchangeWithAll(
      &header, [&](int) { return Communicator::Span(input, bytes); },
      [&](int from) { return Communicator::Landing(outputs[from], bytes); });
}

// Transfer t of the ring allgather: whose block it carries, and its byte
// offset and length in that block (`block` cuts one block into segments).
struct BlockPiece {
  int owner;
  size_t at;
  size_t bytes;
};

BlockPiece blockPiece(Communicator& comm, const ChunkLayout& block, size_t elem, size_t transfer,
                      bool sending) {
  const long step = static_cast<long>(transfer / block.segmentsPerChunk);
  const size_t sender = modPos(comm.ringPos() - step - (sending ? 0 : 1), comm.size());
  size_t offset, length;
  block.segment(0, transfer % block.segmentsPerChunk, &offset, &length);
  return BlockPiece{comm.ringRank(static_cast<int>(sender)), offset * elem, length * elem};
}

// The RingGate of the ring allgather: step 0's sends read the input (our
// own output block, one block of the gate's bytes); every arrival is final
// where it lands, in its owner's block.
auto allgatherGate(StageGate* gate, Communicator& comm, const ChunkLayout& block, size_t elem) {
  auto need = [&comm, &block, elem](size_t t, bool sending) {
    const BlockPiece p = blockPiece(comm, block, elem, t, sending);
    return std::make_pair(p.at, p.bytes);
  };
  auto produced = [&comm, &block, elem](size_t t) {
    const BlockPiece p = blockPiece(comm, block, elem, t, false);
    return std::make_pair(static_cast<size_t>(p.owner) * block.count * elem + p.at, p.bytes);
  };
  return RingGate(gate, gate, block.segmentsPerChunk, 0, need, produced);
}

void allgatherRing(Communicator& comm, const void* input, void* const* outputs, size_t count,
                   DataType dtype, StageGate* gate) {
  const int n = comm.size();
  const int rank = comm.rank();
  comm.exchangeRingHeaders(comm.makeHeader(OpType::kAllgather, count, dtype, ReduceOp::kSum, -1));
  const size_t elem = elementSize(dtype);
  const bool copyOwn = count > 0 && outputs[rank] != input;
  if (n == 1 || count == 0) {
    if (copyOwn) copyBytes(outputs[rank], input, count * elem);
    return;
  }
  const ChunkLayout block(count, 1, comm.segmentBytes(), elem);
  const size_t perStep = block.segmentsPerChunk;
  const size_t total = static_cast<size_t>(n - 1) * perStep;
  Channel& left = comm.channel(comm.left());
  Channel& right = comm.channel(comm.right());
  auto piece = [&](size_t t, bool sending) { return blockPiece(comm, block, elem, t, sending); };
  const auto gated = allgatherGate(gate, comm, block, elem);
  gated.planSendsFirst(perStep);
  // Own block: input -> outputs[rank], one segment per idle moment.
  size_t ownCopied = copyOwn ? 0 : perStep;
  auto copyOwnSegment = [&] {
    const BlockPiece p = piece(ownCopied++, true);
    copyBytes(static_cast<char*>(outputs[rank]) + p.at, static_cast<const char*>(input) + p.at,
              p.bytes);
  };
  // Every receive goes straight to its final place, so all can be posted now.
  std::vector<uint64_t> recvTicket(total);
  for (size_t t = 0; t < total; ++t) {
    const BlockPiece p = piece(t, false);
    recvTicket[t] = left.postRecv(static_cast<char*>(outputs[p.owner]) + p.at, p.bytes);
  }
  uint64_t lastSend = 0;
  size_t sent = 0;
  size_t arrived = 0;
  auto countArrivals = [&] {
    for (; arrived < total && left.recvDone(recvTicket[arrived]); ++arrived) {
      gated.produced(arrived);
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
      const BlockPiece p = piece(sent, true);
      waited = gated.need(sent, true);
      const void* from = sent < perStep ? input : outputs[p.owner];
      lastSend = right.postSend(static_cast<const char*>(from) + p.at, p.bytes);
      ++sent;
      if (waited) break;  // between input pieces, forward arrivals
    }
    bool moved = comm.progress();
    if (finished()) return;
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
  const bool direct = count > 0 && comm.route(ModelledOp::kAllgather, bytes) == Route::kDirect;
  if (!direct && !comm.singleCopy(bytes)) {
    allgatherRing(comm, input, outputs, count, dtype, gate);
    return;
  }
  needWhole(gate, bytes);
  if (direct) {
    allgatherDirect(comm, input, outputs, count, dtype);
  } else {
    allgatherSingleCopy(comm, input, outputs, count, dtype);
  }
  for (int r = 0; gate != nullptr && r < comm.size(); ++r) {
    if (r != comm.rank()) gate->produced(static_cast<size_t>(r) * bytes, bytes);
  }
}

}  // namespace ringdist
