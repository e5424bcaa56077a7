// Reduce-scatter. On one host, from Communicator::singleCopy's size (of one
// rank's block): each rank reads its block of every peer's input straight
// from the peer's memory, piece by piece, and reduces it in the order the
// ring would (so the bits are the ring's); then ranks tell each other they
// are done, and a rank returns only when every peer is done with its input.
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

// The fully reduced chunk is left in an accumulator when out is null.
char* ringReduceScatter(Communicator& comm, const std::vector<const char*>& chunks,
                        const ChunkLayout& layout, DataType dtype, ReduceOp op, char* out,
                        StageGate* gate, const std::vector<size_t>& gateAt) {
  const int n = comm.size();
  const size_t elem = elementSize(dtype);
  const size_t segElems = layout.segmentElems;
  const size_t perStep = layout.segmentsPerChunk;
  const size_t total = static_cast<size_t>(n - 1) * perStep;
  const size_t lastStep = static_cast<size_t>(n - 2);
  const long pos = comm.ringPos();
  ReduceFn reduceFn = reduceFunction(dtype, op);

  const size_t accBytes = perStep * segElems * elem;
  char* scratch = comm.scratch(2 * accBytes);
  char* acc[2] = {scratch, scratch + accBytes};
  char* result = out != nullptr ? out : acc[lastStep % 2];
  Channel& left = comm.channel(comm.left());
  Channel& right = comm.channel(comm.right());

  auto chunkOf = [&](size_t transfer, bool sending) {
    long step = static_cast<long>(transfer / perStep);
    return modPos(pos - step - (sending ? 1 : 2), n);
  };
  auto lengthOf = [&](size_t chunk, size_t segment) {
    size_t offset, length;
    layout.segment(chunk, segment, &offset, &length);
    return length;
  };

  // Input segment `seg` of `chunk` in the gate's bytes.
  auto gated = [&](size_t chunk, size_t seg) {
    return std::make_pair(gateAt[chunk] + seg * segElems * elem, lengthOf(chunk, seg) * elem);
  };
  if (gate != nullptr) {  // step 0's sends all go out first, then the receives
    std::vector<std::pair<size_t, size_t>> ranges;
    auto add = [&](size_t chunk, size_t seg) {
      if (lengthOf(chunk, seg) > 0) ranges.push_back(gated(chunk, seg));
    };
    for (size_t t = 0; t < perStep; ++t) add(chunkOf(t, true), t);
    for (size_t t = 0; t < total; ++t) add(chunkOf(t, false), t % perStep);
    gate->plan(ranges);
  }
  auto need = [&](size_t chunk, size_t seg) {
    if (gate == nullptr) return false;
    const auto [offset, bytes] = gated(chunk, seg);
    if (bytes > 0) gate->need(offset, bytes);
    return true;
  };

  std::vector<uint64_t> sendTicket(total, 0);
  std::vector<uint64_t> recvTicket(total, 0);
  size_t sent = 0, posted = 0, processed = 0;
  while (processed < total || sent < total) {
    bool waited = false;  // a gate waits for one input piece per round, so arrivals go on
    while (sent < total && (sent < perStep || processed > sent - perStep) && !waited) {
      size_t step = sent / perStep, seg = sent % perStep;
      size_t chunk = chunkOf(sent, true);
      if (step == 0) waited = need(chunk, seg);
      const char* src = step == 0 ? chunks[chunk] + seg * segElems * elem
                                  : acc[(step - 1) % 2] + seg * segElems * elem;
      sendTicket[sent] = right.postSend(src, lengthOf(chunk, seg) * elem);
      ++sent;
    }
    while (posted < total && posted - processed < kRecvWindow && !waited) {
      size_t step = posted / perStep, seg = posted % perStep;
      char* dst = step == lastStep ? result : acc[step % 2];
      bool intoAccumulator = dst == acc[0] || dst == acc[1];
      // This accumulator segment was last read by the send of transfer
      // (posted - perStep); it must have left before we overwrite it.
      if (intoAccumulator && step >= 2 &&
          (posted - perStep >= sent || !right.sendDone(sendTicket[posted - perStep]))) {
        break;
      }
      size_t chunk = chunkOf(posted, false);
      waited = need(chunk, seg);
      recvTicket[posted] = left.postRecvReduce(
          dst + seg * segElems * elem, chunks[chunk] + seg * segElems * elem,
          lengthOf(chunk, seg) * elem, elem, reduceFn);
      ++posted;
    }
    bool moved = comm.progress();
    if (processed < posted && left.recvDone(recvTicket[processed])) {
      size_t step = processed / perStep, seg = processed % perStep;
      const size_t length = lengthOf(chunkOf(processed, false), seg);
      if (step == lastStep && op == ReduceOp::kAvg) {
        divideInPlace(result + seg * segElems * elem, length, dtype, n);
      }
      if (step == lastStep && gate != nullptr && length > 0) {
        gate->produced(seg * segElems * elem, length * elem);
      }
      ++processed;
      continue;
    }
    if (!moved && !waited) {
      comm.waitForActivity();
    }
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
