// Reduce-scatter. On one host, from Communicator::singleCopy's size (of one
// rank's block): each rank reads its block of every peer's input straight
// from the peer's memory, piece by piece, and reduces it in the order the
// ring would (so the bits are the ring's); then ranks tell each other they
// are done, and a rank returns only when every peer is done with its input.
//
// One rank per host on long links: a direct exchange, every peer at once
// (reduceScatterDirect).
//
// Otherwise an out-of-place ring. Terms are defined in ring.h.
//
// Inputs are never written. A segment is reduced with our own input as it
// arrives (Channel::postRecvReduce) into one of two chunk-sized
// accumulators, alternating by step; the next step sends it from there.
// Before the receive of step s+2 may write an accumulator segment, the send
// of step s+1 that reads it must be done; that wait only ever points at
// earlier transfers, so the pipeline cannot deadlock whatever the buffer
// sizes. A StageGate is asked for each input segment before the send or
// receive that first reads it, and told of each final segment.
#include <algorithm>
#include <cstring>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/ring.h"
#include "csrc/common/cpu.h"
#include "csrc/common/error.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {

namespace {

// The RingGate of the ring reduce-scatter: every transfer reads input (of
// chunk c, at byte gateAt[c] of the gate's input); the last step's finish
// the segments of the output.
auto reduceScatterGate(StageGate* gate, const std::vector<size_t>& gateAt,
                       const ChunkLayout& layout, long pos, size_t elem) {
  const size_t perStep = layout.segmentsPerChunk;
  auto within = [&layout, elem](size_t t) {  // t's byte offset within its chunk
    return t % layout.segmentsPerChunk * layout.segmentElems * elem;
  };
  auto bytes = [&layout, pos, elem](size_t t, bool sending) {
    return layout.transferSegment(pos, t, sending).second * elem;
  };
  return RingGate(
      gate, gate, perStep, (layout.chunks - 1) * perStep,
      [&gateAt, &layout, pos, within, bytes](size_t t, bool sending) {
        const size_t chunk = layout.chunkOf(pos, t, sending);
        return std::make_pair(gateAt[chunk] + within(t), bytes(t, sending));
      },
      [within, bytes](size_t t) { return std::make_pair(within(t), bytes(t, false)); });
}

}  // namespace

// The fully reduced chunk is left in an accumulator when out is null.
char* ringReduceScatter(Communicator& comm, const std::vector<const char*>& chunks,
                        const ChunkLayout& layout, DataType dtype, ReduceOp op, char* out,
                        StageGate* gate, const std::vector<size_t>& gateAt) {
  const int n = comm.size();
  const size_t elem = elementSize(dtype);
  const size_t segBytes = layout.segmentElems * elem;
  const size_t perStep = layout.segmentsPerChunk;
  const size_t total = static_cast<size_t>(n - 1) * perStep;
  const size_t lastStep = static_cast<size_t>(n - 2);
  const long pos = comm.ringPos();
  ReduceFn reduceFn = reduceFunction(dtype, op);
  const size_t accBytes = perStep * segBytes;
  char* scratch = comm.scratch(2 * accBytes);
  char* acc[2] = {scratch, scratch + accBytes};
  char* result = out != nullptr ? out : acc[lastStep % 2];
  Channel& left = comm.channel(comm.left());
  Channel& right = comm.channel(comm.right());
  // Transfer t's segment: its elements, and its byte offset within its chunk.
  auto lengthOf = [&](size_t t, bool sending) {
    return layout.transferSegment(pos, t, sending).second;
  };
  auto within = [&](size_t t) { return t % perStep * segBytes; };
  const auto gated = reduceScatterGate(gate, gateAt, layout, pos, elem);
  gated.planSendsFirst(total);  // one input piece per round: step 0's sends go first
  std::vector<uint64_t> sendTicket(total, 0);
  std::vector<uint64_t> recvTicket(total, 0);
  size_t sent = 0, posted = 0, processed = 0;
  while (processed < total || sent < total) {
    bool waited = false;  // a gate waits for one input piece per round, so arrivals go on
    while (sent < total && (sent < perStep || processed > sent - perStep) && !waited) {
      waited = gated.need(sent, true);
      const char* src = sent < perStep ? chunks[layout.chunkOf(pos, sent, true)]
                                       : acc[(sent / perStep - 1) % 2];
      sendTicket[sent] = right.postSend(src + within(sent), lengthOf(sent, true) * elem);
      ++sent;
    }
    while (posted < total && posted - processed < kRecvWindow && !waited) {
      const size_t step = posted / perStep;
      char* dst = step == lastStep ? result : acc[step % 2];
      bool intoAccumulator = dst == acc[0] || dst == acc[1];
      // This accumulator segment was last read by the send of transfer
      // (posted - perStep); it must have left before we overwrite it.
      if (intoAccumulator && step >= 2 &&
          (posted - perStep >= sent || !right.sendDone(sendTicket[posted - perStep]))) {
        break;
      }
      waited = gated.need(posted, false);
      recvTicket[posted] = left.postRecvReduce(
          dst + within(posted), chunks[layout.chunkOf(pos, posted, false)] + within(posted),
          lengthOf(posted, false) * elem, elem, reduceFn);
      ++posted;
    }
    bool moved = comm.progress();
    if (processed < posted && left.recvDone(recvTicket[processed])) {
      if (processed / perStep == lastStep && op == ReduceOp::kAvg) {
        divideInPlace(result + within(processed), lengthOf(processed, false), dtype, n);
      }
      gated.produced(processed);
      ++processed;
      continue;
    }
    if (!moved && !waited) comm.waitForActivity();
  }
  comm.waitUntil([&] { return total == 0 || right.sendDone(sendTicket[total - 1]); });
  return result;
}

void sumPeersInRingOrder(Communicator& comm, const std::vector<uint64_t>& address,
                         uint64_t offset, size_t len, size_t elem, ReduceFn reduceFn, char* sum,
                         char* theirs) {
  const int n = comm.size();
  for (int k = 1; k < n; ++k) {
    const int peer = comm.ringRank(static_cast<int>(modPos(comm.ringPos() + k, n)));
    comm.readPeer(peer, address[static_cast<size_t>(peer)] + offset, k == 1 ? sum : theirs,
                  len * elem);
    if (k > 1) {
      reduceFn(sum, sum, theirs, len);
    }
  }
}

namespace {

// The ring's order for our block: combine(...combine(x[pos+1], x[pos+2])...,
// x[pos]) by ring position, the incoming operand first. The sum is built in
// a scratch piece, so an output that aliases our input block is fine.
void reduceScatterSingleCopy(Communicator& comm, const void* const* inputs, void* output,
                             size_t count, DataType dtype, ReduceOp op) {
  const int n = comm.size();
  const size_t elem = elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kReduceScatter, count, dtype, op, -1);
  header.variant = kSingleCopy;
  const std::vector<int> peers = comm.others();
  std::vector<uint64_t> address;
  comm.exchangeHeadersAndAddresses(
      header, peers, std::vector<const void*>(inputs, inputs + n), &address);
  ReduceFn reduceFn = reduceFunction(dtype, op);
  const size_t pieceElems = std::max<size_t>(1, kSingleCopyReducePieceBytes / elem);
  char* sum = comm.scratch(2 * pieceElems * elem);
  char* theirs = sum + pieceElems * elem;
  const char* own = static_cast<const char*>(inputs[comm.rank()]);
  char* out = static_cast<char*>(output);
  for (size_t at = 0; at < count; at += pieceElems) {
    const size_t len = std::min(pieceElems, count - at);
    sumPeersInRingOrder(comm, address, at * elem, len, elem, reduceFn, sum, theirs);
    reduceFn(out + at * elem, sum, own + at * elem, len);
    if (op == ReduceOp::kAvg) {
      divideInPlace(out + at * elem, len, dtype, n);
    }
  }
  comm.exchangeDone(peers, peers);
}

// Direct exchange (one rank per host on long links, by the route model): every rank sends
// each peer that peer's block of its input, behind the op header, all at once, and receives
// its own block of every peer's input into scratch; then reduces the N blocks in rank order.
// One one-way trip where the ring takes N-1.
void reduceScatterDirect(Communicator& comm, const void* const* inputs, void* output,
                         size_t count, DataType dtype, ReduceOp op) {
  const int n = comm.size();
  const int rank = comm.rank();
  const size_t bytes = count * elementSize(dtype);
  OpHeader header = comm.makeHeader(OpType::kReduceScatter, count, dtype, op, -1);
  header.variant = kDirectCopy;
  const ScratchSlots slot(comm, n, bytes);
  std::memcpy(slot[rank], inputs[rank], bytes);
  comm.exchangeWithAll(
      &header, [&](int to) { return Communicator::Span(inputs[to], bytes); },
      [&](int from) { return Communicator::Landing(slot[from], bytes); });
  reduceInRankOrder(output, n, count, dtype, op, [&](int r) { return slot[r]; });
}

}  // namespace

void reduceScatter(Communicator& comm, const void* const* inputs, void* output, size_t count,
                   DataType dtype, ReduceOp op, StageGate* gate) {
  const int n = comm.size();
  const size_t elem = elementSize(dtype);
  const size_t bytes = count * elem;
  // Paths other than the ring read every input from the start and finish at the end.
  auto whole = [&](auto run) {
    needWhole(gate, bytes * static_cast<size_t>(n));
    run();
    if (gate != nullptr && bytes > 0) gate->produced(0, bytes);
  };
  if (count > 0 && comm.singleCopy(bytes)) {
    whole([&] { reduceScatterSingleCopy(comm, inputs, output, count, dtype, op); });
    return;
  }
  if (count > 0 && comm.route(ModelledOp::kReduceScatter, bytes) == Route::kDirect) {
    reduceFunction(dtype, op);  // reject unsupported pairs before anything is sent
    whole([&] { reduceScatterDirect(comm, inputs, output, count, dtype, op); });
    return;
  }
  comm.exchangeRingHeaders(comm.makeHeader(OpType::kReduceScatter, count, dtype, op, -1));
  reduceFunction(dtype, op);  // reject unsupported pairs on every rank alike
  if (n == 1) {
    if (count > 0) {
      whole([&] { if (output != inputs[0]) copyBytes(output, inputs[0], bytes); });
    }
    return;
  }
  if (count == 0) {
    return;
  }
  // Chunks are whole per-rank blocks; position c owns rank ringRank(c)'s.
  const ChunkLayout layout(count * static_cast<size_t>(n), n, comm.segmentBytes(), elem);
  std::vector<const char*> chunks(static_cast<size_t>(n));
  std::vector<size_t> gateAt(static_cast<size_t>(n));
  for (int c = 0; c < n; ++c) {
    chunks[static_cast<size_t>(c)] = static_cast<const char*>(inputs[comm.ringRank(c)]);
    gateAt[static_cast<size_t>(c)] = static_cast<size_t>(comm.ringRank(c)) * bytes;
  }
  ringReduceScatter(comm, chunks, layout, dtype, op, static_cast<char*>(output), gate, gateAt);
}

}  // namespace ringdist
