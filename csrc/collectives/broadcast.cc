// Broadcast. On one host, from Communicator::singleCopy's size: each byte is
// copied once, straight from the root's buffer into a reader's (not twice
// through a ring): every reader reads most of the root's buffer while the
// root writes the rest into the readers' buffers, so with two ranks both
// copy at once. The root returns once every reader is done reading, a
// reader once the root is done writing to it.
//
// Groups of one rank per host on long links, where the route model says so: a scatter and an
// allgather, every rank talking to every peer at once (broadcastDirect).
//
// Otherwise a pipelined chain. Terms as in ring.h: the buffer is one chunk
// cut into segments.
//
// A chain along the ring starting at the root; every rank but the last
// forwards each segment to its right as soon as it arrived. The last rank
// then sends one byte on to the root (its right neighbour), so the root
// completes only when the whole chain did: a rank that failed anywhere in
// the chain fails the root's broadcast too, not just its next operation.
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/ring.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {

void broadcastChain(Communicator& comm, void* data, size_t count, DataType dtype, int root) {
  const int n = comm.size();
  comm.exchangeRingHeaders(comm.makeHeader(OpType::kBroadcast, count, dtype, ReduceOp::kSum, root));
  if (n == 1 || count == 0) {
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
  const size_t elem = elementSize(dtype);
  const ChunkLayout buffer(count, 1, comm.segmentBytes(), elem);
  const size_t segments = buffer.segmentsPerChunk;
  char* base = static_cast<char*>(data);
  auto post = [&](Channel& ch, bool send, size_t j) {
    size_t offset, length;
    buffer.segment(0, j, &offset, &length);
    return send ? ch.postSend(base + offset * elem, length * elem)
                : ch.postRecv(base + offset * elem, length * elem);
  };
  const bool forwards = chainPos < n - 1;
  Channel& right = comm.channel(comm.right());
  Channel& left = comm.channel(comm.left());
  uint64_t lastSend = 0;
  static const uint8_t kAckSent = 1;
  uint8_t ackReceived = 0;
  if (chainPos == 0) {
    for (size_t j = 0; j < segments; ++j) {
      lastSend = post(right, true, j);
    }
    uint64_t ack = left.postRecv(&ackReceived, 1);
    comm.waitUntil([&] { return right.sendDone(lastSend) && left.recvDone(ack); });
    return;
  }
  std::vector<uint64_t> recvTicket(segments);
  for (size_t j = 0; j < segments; ++j) {
    recvTicket[j] = post(left, false, j);
  }
  size_t forwarded = 0;
  comm.waitUntil([&] {
    while (forwarded < segments && left.recvDone(recvTicket[forwarded])) {
      if (forwards) {
        lastSend = post(right, true, forwarded);
      }
      ++forwarded;
    }
    return forwarded == segments && (!forwards || right.sendDone(lastSend));
  });
  if (!forwards) {  // the chain's end: tell the root (our right neighbour)
    uint64_t ack = right.postSend(&kAckSent, 1);
    comm.waitUntil([&] { return right.sendDone(ack); });
  }
}

// Part k of n parts of count elements: [*first, *first + *length).
void part(size_t count, size_t n, size_t k, size_t* first, size_t* length) {
  *first = count * k / n;
  *length = count * (k + 1) / n - *first;
}

void broadcastSingleCopy(Communicator& comm, void* data, size_t count, DataType dtype,
                         int root) {
  OpHeader header = comm.makeHeader(OpType::kBroadcast, count, dtype, ReduceOp::kSum, root);
  header.variant = kSingleCopy;
  const int n = comm.size();
  const size_t elem = elementSize(dtype);
  char* base = static_cast<char*>(data);
  // Headers with every peer, not just the root: a rank that disagrees is
  // then seen by all, before any output is written. Addresses only between
  // the root and each reader.
  const std::vector<int> peers = comm.others();
  std::vector<uint64_t> address;
  // Reader r's part k (its distance from the root) is written by the root;
  // r reads the rest. Each rank then copies (n-1)/n of the buffer, and with
  // two ranks both copy at once.
  auto partOf = [&](int rank) { return static_cast<size_t>((rank - root + n) % n); };
  if (comm.rank() == root) {
    comm.exchangeHeadersAndAddresses(header, peers, data, &address);
    for (int reader : peers) {
      size_t first, length;
      part(count, static_cast<size_t>(n), partOf(reader), &first, &length);
      comm.writePeer(reader, address[static_cast<size_t>(reader)] + first * elem,
                     base + first * elem, length * elem);
    }
    comm.exchangeDone(peers, peers);  // "written" to each, "done" from each
    return;
  }
  comm.exchangeHeadersAndAddresses(header, peers, data, &address, root);
  const uint64_t from = address[static_cast<size_t>(root)];
  size_t first, length;
  part(count, static_cast<size_t>(n), partOf(comm.rank()), &first, &length);
  comm.readPeer(root, from, base, first * elem);
  const size_t end = (first + length) * elem;
  comm.readPeer(root, from + end, base + end, count * elem - end);
  // Done to the root; return only once it wrote our part, so no write of
  // its lands after we returned.
  comm.exchangeDone({root}, {root});
}

// Direct exchange (route_model.h): the buffer cut into N blocks as the ring cuts it; the root
// sends block r to rank r, with the header to every peer from every rank (one round), then every
// rank sends its block to every peer, but to the root a byte (the second round), so the root
// returns only once every rank got its block. Two one-way trips where the chain takes N, and
// 2(N-1)/N of the buffer on each link where the chain moves it all (the root's: all of it).
void broadcastDirect(Communicator& comm, void* data, size_t count, DataType dtype, int root) {
  OpHeader header = comm.makeHeader(OpType::kBroadcast, count, dtype, ReduceOp::kSum, root);
  header.variant = kDirectCopy;
  const int rank = comm.rank();
  const size_t elem = elementSize(dtype);
  const ChunkLayout layout(count, comm.size(), comm.segmentBytes(), elem);
  char* base = static_cast<char*>(data);
  auto block = [&](int r) {
    return Communicator::Landing(base + layout.chunkOffset(static_cast<size_t>(r)) * elem,
                                 layout.chunkLength(static_cast<size_t>(r)) * elem);
  };
  const Communicator::Landing none(nullptr, 0);
  static const uint8_t kDone = 1;
  uint8_t done = 0;
  comm.exchangeWithAll(
      &header, [&](int to) { return rank == root ? block(to) : none; },
      [&](int from) { return from == root ? block(rank) : none; });
  comm.exchangeWithAll(
      nullptr,
      [&](int to) { return to == root ? Communicator::Span(&kDone, 1) : block(rank); },
      [&](int from) { return rank == root ? Communicator::Landing(&done, 1) : block(from); });
}

}  // namespace

void broadcast(Communicator& comm, void* data, size_t count, DataType dtype, int root) {
  if (comm.singleCopy(count * elementSize(dtype))) {
    broadcastSingleCopy(comm, data, count, dtype, root);
  } else if (count > 0 &&
             comm.route(ModelledOp::kBroadcast, count * elementSize(dtype)) == Route::kDirect) {
    broadcastDirect(comm, data, count, dtype, root);
  } else {
    broadcastChain(comm, data, count, dtype, root);
  }
  if (comm.options().checkResults) {
    checkIdenticalResults(comm, data, count * elementSize(dtype), "broadcast");
  }
}

}  // namespace ringdist
