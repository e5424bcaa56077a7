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
// smallAllreduceBytes() take a one-round exchange instead (latency path).
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

void ringAllreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op) {
  const int n = comm.size();
  ReduceFn reduceFn = reduceFunction(dtype, op);
  const size_t elem = elementSize(dtype);
  const size_t segElems = std::max<size_t>(1, comm.segmentBytes() / elem);
  const ChunkLayout layout(count, n, segElems);
  const size_t perStep = layout.segmentsPerChunk;
  const size_t total = static_cast<size_t>(2 * (n - 1)) * perStep;
  const size_t reduceScatterTransfers = static_cast<size_t>(n - 1) * perStep;
  const long pos = comm.ringPos();
  char* base = static_cast<char*>(data);
  Channel& left = comm.channel(comm.left());
  Channel& right = comm.channel(comm.right());

  auto segmentOf = [&](size_t transfer, bool sending, size_t* offset, size_t* length) {
    long step = static_cast<long>(transfer / perStep);
    size_t chunk = modPos(pos - step - (sending ? 1 : 2), n);
    layout.segment(chunk, transfer % perStep, offset, length);
  };

  std::vector<uint64_t> sendTicket(total, 0);
  std::vector<uint64_t> recvTicket(total, 0);
  size_t sent = 0;       // transfers whose send is posted
  size_t posted = 0;     // transfers whose receive is posted
  size_t processed = 0;  // transfers received and reduced/accepted
  while (processed < total) {
    // Send every transfer whose data is final here: step 0 sends our own
    // data; step s forwards what step s-1 received (transfer - perStep).
    while (sent < total && (sent < perStep || processed > sent - perStep)) {
      size_t offset, length;
      segmentOf(sent, true, &offset, &length);
      sendTicket[sent] = right.postSend(base + offset * elem, length * elem);
      ++sent;
    }
    // Keep up to kRecvWindow receives posted. An allgather receive writes
    // into a region our reduce-scatter sent earlier; that send must be done.
    while (posted < total && posted - processed < kRecvWindow) {
      size_t offset, length;
      segmentOf(posted, false, &offset, &length);
      if (posted < reduceScatterTransfers) {
        char* target = base + offset * elem;
        recvTicket[posted] = left.postRecvReduce(target, target, length * elem, elem, reduceFn);
      } else {
        size_t earlier = posted - reduceScatterTransfers;
        if (earlier >= sent || !right.sendDone(sendTicket[earlier])) {
          break;
        }
        recvTicket[posted] = left.postRecv(base + offset * elem, length * elem);
      }
      ++posted;
    }
    bool moved = comm.progress();
    if (processed < posted && left.recvDone(recvTicket[processed])) {
      bool lastReduceStep = processed / perStep == static_cast<size_t>(n - 2);
      if (lastReduceStep && op == ReduceOp::kAvg) {
        size_t offset, length;
        segmentOf(processed, false, &offset, &length);
        divideInPlace(base + offset * elem, length, dtype, n);  // the owner finalises its chunk
      }
      ++processed;
      continue;
    }
    if (!moved) {
      comm.waitForActivity();
    }
  }
  comm.waitUntil([&] { return right.sendDone(sendTicket[total - 1]); });
}

}  // namespace

void allreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op) {
  const int n = comm.size();
  reduceFunction(dtype, op);  // rejects unsupported pairs on every rank alike
  const bool small = count * elementSize(dtype) <= comm.smallAllreduceBytes();
  OpHeader header = comm.makeHeader(OpType::kAllreduce, count, dtype, op, -1);
  header.reserved = small ? 1 : 0;  // the algorithm: ranks must agree on it
  if (n > 1 && count > 0 && small) {
    oneShotAllreduce(comm, data, count, dtype, op, header);
  } else {
    comm.exchangeRingHeaders(header);
    if (n > 1 && count > 0) {  // AVG over one rank divides by one
      ringAllreduce(comm, data, count, dtype, op);
    }
  }
  if (comm.checkResults()) {
    checkIdenticalResults(comm, data, count * elementSize(dtype), "allreduce");
  }
}

}  // namespace ringdist
