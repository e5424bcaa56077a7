// Ring allreduce: reduce-scatter then allgather, pipelined by segment.
// Terms (chunk, segment, step, transfer) are defined in ring.h.
//
// Data path: a reduce-scatter segment is reduced into the user's buffer as
// it arrives (Channel::postRecvReduce: shared memory reduces straight out
// of its ring, TCP through a small staging buffer), and the next step sends
// it from there; allgather segments are received directly into the user's
// buffer. No full-size temporary exists. Each chunk is
// reduced once, along the ring, by a fixed order, and then copied, so every
// rank ends with bitwise identical results. Buffers up to
// options().smallAllreduceBytes take a one-round exchange instead (latency path);
// groups spanning several hosts with the same number of ranks on each take a
// two-level variant of the ring (hierarchicalAllreduce).
#include <cstring>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/ring.h"
#include "csrc/common/error.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {

namespace {

// Latency path for small buffers: one round. Every rank sends its whole
// buffer, behind the op header, to every peer and receives theirs into
// scratch (never into the output, so a header mismatch found afterwards
// leaves the output untouched). Each rank then reduces the N contributions
// in rank order 0..N-1, so all ranks compute bitwise identical results.
void oneShotAllreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op,
                      const OpHeader& header) {
  const int n = comm.size();
  const int rank = comm.rank();
  const size_t bytes = count * elementSize(dtype);
  const size_t stride = (bytes + 63) / 64 * 64;
  char* scratch = comm.scratch(stride * static_cast<size_t>(n));
  std::vector<OpHeader> theirs(static_cast<size_t>(n));
  Communicator::Transfers sends, recvs;
  for (int k = 1; k < n; ++k) {
    Channel& out = comm.channel((rank + k) % n);
    out.postSend(&header, sizeof(OpHeader));
    sends.emplace_back(&out, out.postSend(data, bytes));
    int from = (rank - k + n) % n;
    Channel& in = comm.channel(from);
    in.postRecv(&theirs[static_cast<size_t>(from)], sizeof(OpHeader));
    recvs.emplace_back(&in, in.postRecv(scratch + static_cast<size_t>(from) * stride, bytes));
  }
  comm.waitAll(sends, recvs);
  for (int peer = 0; peer < n; ++peer) {
    if (peer != rank) {
      comm.checkHeader(header, theirs[static_cast<size_t>(peer)], peer);
    }
  }
  std::memcpy(scratch + static_cast<size_t>(rank) * stride, data, bytes);
  ReduceFn reduceFn = reduceFunction(dtype, op);
  for (int peer = 1; peer < n; ++peer) {
    reduceFn(scratch, scratch, scratch + static_cast<size_t>(peer) * stride, count);
  }
  if (op == ReduceOp::kAvg) {
    divideInPlace(scratch, count, dtype, n);
  }
  std::memcpy(data, scratch, bytes);
}

// Steps [firstStep, endStep) of a pipelined ring allreduce over `ring` on
// `count` elements at `data`: steps 0..n-2 reduce-scatter (position p ends
// owning chunk p, fully reduced), steps n-1..2n-3 allgather. A partial range
// starts from data that is final for its first step. divisor > 0: the owner
// divides its chunk by it after the last reduce step (AVG).
void ringSteps(Communicator& comm, const SubRing& ring, void* data, size_t count, DataType dtype,
               ReduceFn reduceFn, long firstStep, long endStep, int divisor) {
  const int n = ring.size();
  const size_t elem = elementSize(dtype);
  const ChunkLayout layout(count, n, comm.segmentBytes(), elem);
  const size_t perStep = layout.segmentsPerChunk;
  const size_t first = static_cast<size_t>(firstStep) * perStep;  // transfers [first, end)
  const size_t end = static_cast<size_t>(endStep) * perStep;
  const size_t reduceScatterTransfers = static_cast<size_t>(n - 1) * perStep;
  const long pos = ring.pos;
  char* base = static_cast<char*>(data);
  Channel& left = comm.channel(ring.left());
  Channel& right = comm.channel(ring.right());

  auto segmentOf = [&](size_t transfer, bool sending, size_t* offset, size_t* length) {
    long step = static_cast<long>(transfer / perStep);
    size_t chunk = modPos(pos - step - (sending ? 1 : 2), n);
    layout.segment(chunk, transfer % perStep, offset, length);
  };

  std::vector<uint64_t> sendTicket(end - first, 0);  // indexed by transfer - first
  std::vector<uint64_t> recvTicket(end - first, 0);
  size_t sent = first;       // transfers whose send is posted
  size_t posted = first;     // transfers whose receive is posted
  size_t processed = first;  // transfers received and reduced/accepted
  while (processed < end) {
    // Send every transfer whose data is final here: the first step sends
    // what we hold; step s forwards what step s-1 received (transfer - perStep).
    while (sent < end && (sent < first + perStep || processed > sent - perStep)) {
      size_t offset, length;
      segmentOf(sent, true, &offset, &length);
      sendTicket[sent - first] = right.postSend(base + offset * elem, length * elem);
      ++sent;
    }
    // Keep up to kRecvWindow receives posted. An allgather receive writes
    // into a region our reduce-scatter sent earlier; that send must be done
    // (sends of an earlier call were waited for before it returned).
    while (posted < end && posted - processed < kRecvWindow) {
      size_t offset, length;
      segmentOf(posted, false, &offset, &length);
      if (posted < reduceScatterTransfers) {
        char* target = base + offset * elem;
        recvTicket[posted - first] =
            left.postRecvReduce(target, target, length * elem, elem, reduceFn);
      } else {
        size_t earlier = posted - reduceScatterTransfers;
        if (earlier >= first &&
            (earlier >= sent || !right.sendDone(sendTicket[earlier - first]))) {
          break;
        }
        recvTicket[posted - first] = left.postRecv(base + offset * elem, length * elem);
      }
      ++posted;
    }
    bool moved = comm.progress();
    if (processed < posted && left.recvDone(recvTicket[processed - first])) {
      bool lastReduceStep = processed / perStep == static_cast<size_t>(n - 2);
      if (lastReduceStep && divisor > 0) {
        size_t offset, length;
        segmentOf(processed, false, &offset, &length);
        divideInPlace(base + offset * elem, length, dtype, divisor);  // the owner finalises its chunk
      }
      ++processed;
      continue;
    }
    if (!moved) {
      comm.waitForActivity();
    }
  }
  if (sent > first) {
    comm.waitUntil([&] { return right.sendDone(sendTicket[sent - 1 - first]); });
  }
}

// Flat ring over every rank (its order visits each host's ranks together).
void ringAllreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op) {
  const int n = comm.size();
  ringSteps(comm, comm.ring(), data, count, dtype, reduceFunction(dtype, op), 0, 2 * (n - 1),
            op == ReduceOp::kAvg ? n : 0);
}

// Two levels, for H hosts of L ranks each: reduce-scatter inside the host
// (local position p ends owning chunk p of L), allreduce of chunk p across
// hosts among the ranks at position p (L such rings run side by side), then
// allgather inside the host. Each host's link carries 2(H-1)/H of the buffer
// per direction instead of the flat ring's 2(N-1)/N, which is what makes
// multi-host runs with several ranks per host faster. Every chunk is still
// reduced in one fixed order and then copied, so results stay bitwise
// identical on all ranks.
void hierarchicalAllreduce(Communicator& comm, void* data, size_t count, DataType dtype,
                           ReduceOp op) {
  const SubRing& host = comm.hostRing();
  const SubRing& cross = comm.crossRing();
  const long l = host.size();
  const long h = cross.size();
  ReduceFn reduceFn = reduceFunction(dtype, op);
  ringSteps(comm, host, data, count, dtype, reduceFn, 0, l - 1, 0);
  const size_t elem = elementSize(dtype);
  const ChunkLayout layout(count, host.size(), comm.segmentBytes(), elem);
  const size_t own = static_cast<size_t>(host.pos);
  // The same on every rank at this position, so all of a cross ring skip alike.
  if (layout.chunkLength(own) > 0) {
    ringSteps(comm, cross, static_cast<char*>(data) + layout.chunkOffset(own) * elem,
              layout.chunkLength(own), dtype, reduceFn, 0, 2 * (h - 1),
              op == ReduceOp::kAvg ? comm.size() : 0);
  }
  ringSteps(comm, host, data, count, dtype, reduceFn, l - 1, 2 * (l - 1), 0);
}

}  // namespace

void allreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op) {
  const int n = comm.size();
  reduceFunction(dtype, op);  // rejects unsupported pairs on every rank alike
  const bool small = count * elementSize(dtype) <= comm.options().smallAllreduceBytes;
  OpHeader header = comm.makeHeader(OpType::kAllreduce, count, dtype, op, -1);
  header.variant = small                ? kOneShotAllreduce
                   : comm.hierarchical() ? kHierarchicalAllreduce
                                         : kRingAllreduce;
  if (n > 1 && count > 0 && small) {
    oneShotAllreduce(comm, data, count, dtype, op, header);
  } else {
    comm.exchangeRingHeaders(header);
    if (n > 1 && count > 0) {  // AVG over one rank divides by one
      if (header.variant == kHierarchicalAllreduce) {
        hierarchicalAllreduce(comm, data, count, dtype, op);
      } else {
        ringAllreduce(comm, data, count, dtype, op);
      }
    }
  }
  if (comm.options().checkResults) {
    checkIdenticalResults(comm, data, count * elementSize(dtype), "allreduce");
  }
}

}  // namespace ringdist
