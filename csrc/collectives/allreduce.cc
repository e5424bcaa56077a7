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
// options().oneRoundAllreduce take a one-round exchange instead (latency path);
// groups spanning several hosts with the same number of ranks on each take a
// two-level variant of the ring (hierarchicalAllreduce); groups of one rank per host whose
// links are long exchange directly with every peer (directAllreduce, by the route model).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/ring.h"
#include "csrc/common/cpu.h"
#include "csrc/common/error.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {

namespace {

// Two ranks (the latency path for two, and the pair route across two hosts: route_model.h):
// each sends its buffer behind the op header and reduces the peer's straight out of the link
// (Channel::postRecvReduce), the lower rank's data first as in oneShotAllreduce, so both
// compute the same bits. Two passes over the buffer (copy in, reduce out) instead of five, one
// one-way trip, and nothing forwarded. A peer on another host over long links has several
// connections (lanes): the buffer goes in as many even parts, one on each, so a lost packet
// holds back only its part. The output is written only once the peer's header matched ours,
// and in place only once our own sends have read it (else through scratch). `group`: the two
// ranks (every rank, or a two-level allreduce's cross ring); the result is divided by
// `divisor` (> 0).
void pairAllreduce(Communicator& comm, const SubRing& group, void* data, size_t count,
                   DataType dtype, ReduceOp op, const OpHeader& header, int divisor) {
  const int peer = group.members[static_cast<size_t>(1 - group.pos)];
  const size_t elem = elementSize(dtype);
  const size_t bytes = count * elem;
  const int lanes = static_cast<int>(std::min<size_t>(comm.laneCount(peer), std::max<size_t>(count, 1)));
  const ChunkLayout parts(count, lanes, comm.segmentBytes(), elem);  // lane k's part: chunk k
  auto part = [&](int k) {  // (offset, bytes)
    const size_t i = static_cast<size_t>(k);
    return std::pair<size_t, size_t>(parts.chunkOffset(i) * elem, parts.chunkLength(i) * elem);
  };
  Channel& link = comm.channel(peer);
  OpHeader theirs;
  link.postSend(&header, sizeof(OpHeader));
  std::array<uint64_t, kMaxTcpLanes> sent{};  // no allocation on the two-rank latency path
  for (int k = 0; k < lanes; ++k) {
    sent[k] = comm.lane(peer, k).postSend(static_cast<char*>(data) + part(k).first, part(k).second);
  }
  auto allSent = [&] {
    for (int k = 0; k < lanes; ++k) {
      if (!comm.lane(peer, k).sendDone(sent[k])) return false;
    }
    return true;
  };
  const uint64_t heard = link.postRecv(&theirs, sizeof(OpHeader));
  comm.waitUntil([&] { return link.recvDone(heard); });
  comm.checkHeader(header, theirs, peer);
  const bool inPlace = allSent();
  char* target = inPlace ? static_cast<char*>(data) : comm.scratch(bytes);
  const ReduceFn reduceFn = reduceFunction(dtype, op);
  std::array<uint64_t, kMaxTcpLanes> reduced{};
  for (int k = 0; k < lanes; ++k) {
    const auto [offset, length] = part(k);
    reduced[k] = comm.lane(peer, k).postRecvReduce(target + offset, static_cast<char*>(data) + offset,
                                                   length, elem, reduceFn,
                                                   /*incomingFirst=*/peer < comm.rank());
  }
  comm.waitUntil([&] {
    for (int k = 0; k < lanes; ++k) {
      if (!comm.lane(peer, k).recvDone(reduced[k])) return false;
    }
    return allSent();
  });
  if (!inPlace) {
    copyBytes(data, target, bytes);
  }
  if (divisor > 0) {
    divideInPlace(data, count, dtype, divisor);
  }
}

// Smallest buffers (kBoardDataBytes at most) when every rank is on this host
// over shared memory: every rank publishes its header and data on the board
// (Communicator::publish) and, once every peer's header matched ours,
// combines the N contributions straight from the ranks' board areas in rank
// order, as the one-round paths do (so the same bits). One hand-off each way
// per call and nothing through the channels.
void boardAllreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op) {
  const int n = comm.size();
  const OpHeader header =
      comm.makeHeader(OpType::kAllreduce, count, dtype, op, -1, /*publish=*/false);
  // By rank; on the stack for a few ranks (no allocation on the latency path).
  const char* few[8];
  std::vector<const char*> many(n > 8 ? static_cast<size_t>(n) : 0);
  const char** from = n > 8 ? many.data() : few;
  from[comm.rank()] = comm.publish(header, data, count * elementSize(dtype));
  for (int peer = 0; peer < n; ++peer) {
    // Every peer's header checked before the output is written.
    if (peer != comm.rank()) from[peer] = comm.published(peer, header);
  }
  reduceInRankOrder(data, n, count, dtype, op, [&](int r) { return from[r]; });
}

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
  const ScratchSlots slot(comm, n, bytes);
  comm.exchangeWithAll(
      &header, [&](int) { return Communicator::Span(data, bytes); },
      [&](int from) { return Communicator::Landing(slot[from], bytes); });
  std::memcpy(slot[rank], data, bytes);  // the output is written from the first step on
  reduceInRankOrder(data, n, count, dtype, op, [&](int r) { return slot[r]; });
}

// Direct exchange, for groups whose links are long (the route model, route_model.h): a
// reduce-scatter and an allgather of one round each, every rank talking to every peer at once.
// Rank r owns chunk r: it receives chunk r of every peer into scratch (never the output, so a
// header mismatch found afterwards leaves it untouched), reduces the N contributions in rank
// order as the one-round path does, and sends the result to every peer, receiving theirs
// straight into the output. So every rank ends with the same bits. Two one-way trips where
// the ring takes 2(N-1), and the same bytes on each rank's link. Among the members of `group`
// (every rank, or a two-level allreduce's cross ring), numbered by their position in it; the
// owner of a chunk divides it by `divisor` (> 0) after reducing.
void directAllreduce(Communicator& comm, const SubRing& group, void* data, size_t count,
                     DataType dtype, ReduceOp op, const OpHeader& header, int divisor) {
  const int n = group.size();
  const int mine = group.pos;
  const size_t elem = elementSize(dtype);
  const ChunkLayout layout(count, n, comm.segmentBytes(), elem);
  auto posOf = [&](int rank) {
    return static_cast<int>(std::find(group.members.begin(), group.members.end(), rank) -
                            group.members.begin());
  };
  auto chunk = [&](int p) { return static_cast<char*>(data) + layout.chunkOffset(p) * elem; };
  auto chunkBytes = [&](int p) { return layout.chunkLength(static_cast<size_t>(p)) * elem; };
  const size_t own = chunkBytes(mine);
  const ScratchSlots slot(comm, n, own);
  // Reduce-scatter: each peer's share of our chunk, into scratch by position.
  comm.exchangeWithAll(
      &header, [&](int to) { return Communicator::Span(chunk(posOf(to)), chunkBytes(posOf(to))); },
      [&](int from) { return Communicator::Landing(slot[posOf(from)], own); }, &group);
  if (own > 0) {
    std::memcpy(slot[mine], chunk(mine), own);
    reduceInRankOrder(chunk(mine), n, own / elem, dtype, op == ReduceOp::kAvg ? ReduceOp::kSum : op,
                      [&](int p) { return slot[p]; });
    if (divisor > 0) divideInPlace(chunk(mine), own / elem, dtype, divisor);
  }
  // Allgather: our reduced chunk to every peer, theirs straight into the output.
  comm.exchangeWithAll(
      nullptr, [&](int) { return Communicator::Span(chunk(mine), own); },
      [&](int from) { return Communicator::Landing(chunk(posOf(from)), chunkBytes(posOf(from))); },
      &group);
}

// Recursive halving-doubling (Rabenseifner's allreduce), for groups of one rank per host whose
// links are long and too many for the direct exchange (the route model, route_model.h). With P
// the largest power of two <= N and R = N - P, the ranks below 2R first fold in pairs: each even
// one sends its buffer to the odd one above it, which reduces it (lower rank first), and waits
// for the result. The P ranks left, numbered v, then halve: in the round of distance d = P/2,
// ..., 1 each keeps half of its range of the P blocks and exchanges the other half with v ^ d,
// reducing what arrives into the half it keeps, until it holds block v reduced over all N ranks.
// They double back in the opposite order, each sending its range and receiving its partner's
// straight into the output, and the folded ranks get the whole result. Every block is reduced
// once, by its owner, so every rank ends with the same bits. 2 log2(P) one-way trips (2 more
// when R > 0) where the ring takes 2(N-1), and the same bytes on each link when R = 0. A
// partner's header is checked before its bytes reach the output. Ranks are numbered by their
// position in `group`, as directAllreduce's; a block's owner divides it by `divisor` (> 0).
void halvingDoublingAllreduce(Communicator& comm, const SubRing& group, void* data, size_t count,
                              DataType dtype, ReduceOp op, const OpHeader& header, int divisor) {
  const int n = group.size();
  const int rank = group.pos;
  const int p = powerOfTwoBelow(n);
  const int folded = n - p;
  const bool inPair = rank < 2 * folded;
  const int v = inPair ? rank / 2 : rank - folded;
  auto rankOf = [folded](int virt) { return virt < folded ? 2 * virt + 1 : virt + folded; };
  const size_t elem = elementSize(dtype);
  const ReduceFn combine = reduceFunction(dtype, op);
  const ChunkLayout blocks(count, p, comm.segmentBytes(), elem);
  char* base = static_cast<char*>(data);
  auto at = [&](int block) { return base + blocks.chunkOffset(static_cast<size_t>(block)) * elem; };
  auto span = [&](int lo, int hi) { return static_cast<size_t>(at(hi) - at(lo)); };
  // One round with `peer`: our bytes [out, out + outBytes) to it and its into `in` (reduced
  // into what `in` holds, or copied); with `headers`, each side's header first.
  auto round = [&](int peer, const char* out, size_t outBytes, char* in, size_t inBytes,
                   bool headers, bool reduce) {
    Channel& link = comm.channel(group.members[static_cast<size_t>(peer)]);
    OpHeader theirs;
    if (headers) link.postSend(&header, sizeof(OpHeader));
    const uint64_t sent = link.postSend(out, outBytes);
    if (headers) {
      const uint64_t heard = link.postRecv(&theirs, sizeof(OpHeader));
      comm.waitUntil([&] { return link.recvDone(heard); });
      comm.checkHeader(header, theirs, group.members[static_cast<size_t>(peer)]);
    }
    const uint64_t got = reduce ? link.postRecvReduce(in, in, inBytes, elem, combine, peer < rank)
                                : link.postRecv(in, inBytes);
    comm.waitUntil([&] { return link.recvDone(got) && link.sendDone(sent); });
  };
  const size_t bytes = count * elem;
  if (inPair && rank % 2 == 0) {  // folded: hand the buffer over, then take the result
    round(rank + 1, base, bytes, base, 0, true, false);
    round(rank + 1, base, 0, base, bytes, false, false);
    return;
  }
  if (inPair) round(rank - 1, base, 0, base, bytes, true, true);
  int lo = 0;
  int hi = p;
  for (int d = p / 2; d >= 1; d /= 2) {  // halving
    const int half = (hi - lo) / 2;
    const bool lower = (v & d) == 0;
    const int keep = lower ? lo : lo + half;
    const int give = lower ? lo + half : lo;
    round(rankOf(v ^ d), at(give), span(give, give + half), at(keep), span(keep, keep + half),
          true, true);
    lo = keep;
    hi = keep + half;
  }
  if (divisor > 0) divideInPlace(at(v), blocks.chunkLength(static_cast<size_t>(v)), dtype, divisor);
  for (int d = 1; d < p; d *= 2) {  // doubling
    const int width = hi - lo;
    const int other = (v & d) == 0 ? hi : lo - width;
    round(rankOf(v ^ d), at(lo), span(lo, hi), at(other), span(other, other + width), false, false);
    lo = std::min(lo, other);
    hi = lo + 2 * width;
  }
  if (inPair) round(rank - 1, base, bytes, base, 0, false, false);
}

// The RingGate of steps over `layout` at ring position `pos`: a transfer's
// segment is read and finished in place, `gated.offset` into the buffer.
auto ringGateOf(const StepsGate& gated, const ChunkLayout& layout, long pos, size_t elem) {
  auto bytes = [&layout, pos, elem, at = gated.offset](size_t transfer, bool sending) {
    const auto [offset, length] = layout.transferSegment(pos, transfer, sending);
    return std::make_pair(at + offset * elem, length * elem);
  };
  const size_t perStep = layout.segmentsPerChunk;
  return RingGate(gated.needs, gated.produces, perStep, (layout.chunks - 1) * perStep, bytes,
                  [bytes](size_t transfer) { return bytes(transfer, false); });
}

// The order in which a rank sends (and its right neighbour receives) the
// transfers of steps [first, end): segment j of step s goes out at key
// j + (s - first) * lag, ties by step. With kForwardLag a segment is
// forwarded two segments after it arrived, while it is still in cache, rather
// than behind the whole chunk of the step before (which re-read it from
// memory: an N=2 allreduce then moved 5S of memory instead of 4S). On a long
// link the lag is longer (forwardLag): the sends queued ahead of a forward
// keep the link full while the segment to forward is on its way.
struct StreamOrder {
  StreamOrder(size_t first, size_t end, size_t perStep, size_t lag)
      : order(end - first), positionOf(end - first) {
    for (size_t i = 0; i < order.size(); ++i) order[i] = first + i;
    auto key = [&](size_t t) {
      const size_t step = (t - first) / perStep;
      return std::make_pair(t % perStep + step * lag, step);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return key(a) < key(b); });
    for (size_t k = 0; k < order.size(); ++k) positionOf[order[k] - first] = k;
  }
  std::vector<size_t> order;       // transfers by stream position
  std::vector<size_t> positionOf;  // stream positions by transfer - first
};

}  // namespace

void ringSteps(Communicator& comm, const SubRing& ring, void* data, size_t count, DataType dtype,
               ReduceFn reduceFn, long firstStep, long endStep, int divisor,
               const StepsGate& gated) {
  const int n = ring.size();
  const size_t elem = elementSize(dtype);
  const ChunkLayout layout(count, n, comm.segmentBytes(), elem);
  const size_t perStep = layout.segmentsPerChunk;
  // Transfers [first, first + total).
  const size_t first = static_cast<size_t>(firstStep) * perStep;
  const size_t total = static_cast<size_t>(endStep - firstStep) * perStep;
  const size_t reduceScatterTransfers = static_cast<size_t>(n - 1) * perStep;
  char* base = static_cast<char*>(data);
  Channel& left = comm.channel(ring.left());
  Channel& right = comm.channel(ring.right());
  const auto gate = ringGateOf(gated, layout, ring.pos, elem);
  // Both directions' order; every rank of the ring computes the same lag.
  const size_t lag = forwardLag(comm.linkRoundTripUs(), layout.segmentElems * elem);
  const StreamOrder stream(first, first + total, perStep, lag);
  gate.plan(stream.order);
  std::vector<uint64_t> sendTicket(total, 0);  // indexed by transfer - first
  std::vector<uint64_t> recvTicket(total, 0);
  size_t sent = 0;       // stream positions whose send is posted
  size_t posted = 0;     // stream positions whose receive is posted
  size_t processed = 0;  // stream positions received and reduced/accepted
  uint64_t lastSend = 0;
  while (processed < total) {
    // Send, in stream order, every transfer whose data is final here: the
    // first step sends what we hold; step s forwards what step s-1 received.
    while (sent < total) {
      const size_t t = stream.order[sent];
      if (t >= first + perStep && stream.positionOf[t - perStep - first] >= processed) break;
      gate.need(t, true);
      const auto [offset, length] = layout.transferSegment(ring.pos, t, true);
      lastSend = sendTicket[t - first] = right.postSend(base + offset * elem, length * elem);
      ++sent;
    }
    // Keep up to kRecvWindow receives posted. An allgather receive writes
    // into a region our reduce-scatter sent earlier; that send must be done
    // (sends of an earlier call were waited for before it returned).
    while (posted < total && posted - processed < kRecvWindow) {
      const size_t t = stream.order[posted];
      const auto [offset, length] = layout.transferSegment(ring.pos, t, false);
      char* target = base + offset * elem;
      if (t < reduceScatterTransfers) {
        gate.need(t, false);
        recvTicket[t - first] = left.postRecvReduce(target, target, length * elem, elem, reduceFn);
      } else {
        const size_t earlier = t - reduceScatterTransfers;
        if (earlier >= first && (stream.positionOf[earlier - first] >= sent ||
                                 !right.sendDone(sendTicket[earlier - first]))) {
          break;
        }
        recvTicket[t - first] = left.postRecv(target, length * elem);
      }
      ++posted;
    }
    bool moved = comm.progress();
    const size_t t = processed < posted ? stream.order[processed] : 0;
    if (processed < posted && left.recvDone(recvTicket[t - first])) {
      if (divisor > 0 && t / perStep == static_cast<size_t>(n - 2)) {  // the owner's last reduce
        const auto [offset, length] = layout.transferSegment(ring.pos, t, false);
        divideInPlace(base + offset * elem, length, dtype, divisor);
      }
      gate.produced(t);
      ++processed;
      continue;
    }
    if (!moved) comm.waitForActivity();
  }
  // A channel completes its sends in the order they were posted.
  if (sent > 0) comm.waitUntil([&] { return right.sendDone(lastSend); });
}

namespace {

// One host (Communicator::singleCopy; two ranks from
// kMinSingleCopyAllreduceBytes, more above the one-round limit): each rank
// owns the chunk the ring would give it and, piece by piece, reads every
// peer's part of it into scratch (cache), combines them into its own buffer
// and writes the result straight into every peer's buffer. Per rank: (N-1)/N
// of the buffer read and written once, with no copy through a ring. The
// operands go in the order of the path this replaces (two ranks up to
// oneRoundAllreduce: the one-round path's rank order; otherwise the ring's
// chain, combine(...combine(x[pos+1], x[pos+2])..., x[pos]) by ring
// position), so the bits are the same as there and as on the GPU path. No
// rank touches a region of a peer's buffer that another rank reads or
// writes; each returns once every peer is done with its buffer both ways.
void singleCopyAllreduce(Communicator& comm, void* data, size_t count, DataType dtype,
                         ReduceOp op, const OpHeader& header) {
  const int n = comm.size();
  const size_t elem = elementSize(dtype);
  const std::vector<int> peers = comm.others();
  std::vector<uint64_t> address;
  comm.exchangeHeadersAndAddresses(header, peers, data, &address);
  const ChunkLayout layout(count, n, comm.segmentBytes(), elem);
  const size_t own = static_cast<size_t>(comm.ringPos());
  const size_t end = layout.chunkOffset(own) + layout.chunkLength(own);
  const size_t pieceElems = std::max<size_t>(1, kSingleCopyReducePieceBytes / elem);
  char* sum = comm.scratch(2 * pieceElems * elem);
  char* theirs = sum + pieceElems * elem;
  char* base = static_cast<char*>(data);
  ReduceFn reduceFn = reduceFunction(dtype, op);
  // Two ranks, one-round order: the lower rank's operand first.
  const bool ownFirst = n == 2 && comm.options().oneRoundAllreduce(count * elem, 2) &&
                        comm.rank() < peers[0];
  for (size_t at = layout.chunkOffset(own); at < end; at += pieceElems) {
    const size_t len = std::min(pieceElems, end - at);
    char* mine = base + at * elem;
    sumPeersInRingOrder(comm, address, at * elem, len, elem, reduceFn, sum, theirs);
    if (ownFirst) {
      reduceFn(mine, mine, sum, len);
    } else {
      reduceFn(mine, sum, mine, len);
    }
    if (op == ReduceOp::kAvg) {
      divideInPlace(mine, len, dtype, n);
    }
    for (int peer : peers) {
      comm.writePeer(peer, address[static_cast<size_t>(peer)] + at * elem, mine, len * elem);
    }
  }
  comm.exchangeDone(peers, peers);
}

// Flat ring over every rank (its order visits each host's ranks together).
void ringAllreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op,
                   StageGate* gate) {
  const int n = comm.size();
  ringSteps(comm, comm.ring(), data, count, dtype, reduceFunction(dtype, op), 0, 2 * (n - 1),
            op == ReduceOp::kAvg ? n : 0, {gate, gate, 0});
}

// The route of a two-level allreduce's cross stage: its chunk of `bytes` among the hosts, one
// rank of each (the route model, as a group of one rank per host would take it); an empty
// chunk, the same on every rank at this position, is left to the ring (which skips it).
Route crossRoute(const Communicator& comm, size_t bytes) {
  return bytes == 0 ? Route::kRing
                    : comm.routeAmongHosts(ModelledOp::kAllreduce, comm.crossRing().size(), bytes);
}

// The allreduce of a group of ranks on different hosts by `route`: the direct exchange,
// halving-doubling or the pair exchange.
using AcrossHosts = void (*)(Communicator&, const SubRing&, void*, size_t, DataType, ReduceOp,
                             const OpHeader&, int);
AcrossHosts allreduceAcrossHosts(Route route) {
  switch (route) {
    case Route::kDirect: return directAllreduce;
    case Route::kPair: return pairAllreduce;
    default: return halvingDoublingAllreduce;
  }
}

// Two levels, for H hosts of L ranks each: reduce-scatter inside the host
// (local position p ends owning chunk p of L), allreduce of chunk p across
// hosts among the ranks at position p (L such groups run side by side: a ring,
// or the direct exchange or halving-doubling where the route model says so), then
// allgather inside the host. Each host's link carries 2(H-1)/H of the buffer
// per direction instead of the flat ring's 2(N-1)/N, which is what makes
// multi-host runs with several ranks per host faster. Every chunk is still
// reduced in one fixed order and then copied, so results stay bitwise
// identical on all ranks.
void hierarchicalAllreduce(Communicator& comm, void* data, size_t count, DataType dtype,
                           ReduceOp op, const OpHeader& header, StageGate* gate) {
  const SubRing& host = comm.hostRing();
  const SubRing& cross = comm.crossRing();
  const long l = host.size();
  const long h = cross.size();
  ReduceFn reduceFn = reduceFunction(dtype, op);
  // A gate: the host's reduce-scatter first reads the input; the cross stage
  // finishes this rank's chunk and the host's allgather brings the others.
  ringSteps(comm, host, data, count, dtype, reduceFn, 0, l - 1, 0, {gate, nullptr, 0});
  const size_t elem = elementSize(dtype);
  const ChunkLayout layout(count, host.size(), comm.segmentBytes(), elem);
  const size_t own = static_cast<size_t>(host.pos);
  const size_t offset = layout.chunkOffset(own) * elem;
  const size_t length = layout.chunkLength(own);
  const int divisor = op == ReduceOp::kAvg ? comm.size() : 0;
  char* chunk = static_cast<char*>(data) + offset;
  // The same on every rank at this position, so all of a cross ring skip alike and take the
  // same route across the hosts.
  const Route route = crossRoute(comm, length * elem);
  if (route != Route::kRing) {
    allreduceAcrossHosts(route)(comm, cross, chunk, length, dtype, op, header, divisor);
    if (gate != nullptr) gate->produced(offset, length * elem);
  } else if (length > 0) {
    ringSteps(comm, cross, chunk, length, dtype, reduceFn, 0, 2 * (h - 1), divisor,
              {nullptr, gate, offset});
  }
  ringSteps(comm, host, data, count, dtype, reduceFn, l - 1, 2 * (l - 1), 0,
            {nullptr, gate, 0});
}

// Which of the paths through the links an allreduce of `bytes` per rank takes.
AllreduceVariant linkVariant(const Communicator& comm, size_t bytes) {
  const int n = comm.size();
  const bool small = comm.options().oneRoundAllreduce(bytes, n);
  if (comm.singleCopy(bytes) && (n == 2 ? bytes >= kMinSingleCopyAllreduceBytes : !small)) {
    return kSingleCopyAllreduce;
  }
  if (small) return kOneShotAllreduce;
  if (comm.hierarchical()) return kHierarchicalAllreduce;
  // The route model weighs the ring's 2(N-1) trips against the direct exchange's two,
  // halving-doubling's 2 log2(N) and, for two hosts, the pair exchange's one.
  switch (comm.route(ModelledOp::kAllreduce, bytes)) {
    case Route::kDirect: return kDirectAllreduce;
    case Route::kHalvingDoubling: return kHalvingDoublingAllreduce;
    case Route::kPair: return kOneShotAllreduce;
    default: return kRingAllreduce;
  }
}

bool onBoard(const Communicator& comm, size_t bytes) {
  return comm.hasBoard() && comm.size() > 1 && bytes > 0 && bytes <= kBoardDataBytes;
}

// The route model's route for a variant that has one, among n ranks.
bool modelledRoute(uint8_t variant, int n, Route* route) {
  switch (variant) {
    case kOneShotAllreduce:
      *route = Route::kPair;
      return n == 2;
    case kRingAllreduce: *route = Route::kRing; return true;
    case kDirectAllreduce: *route = Route::kDirect; return true;
    case kHalvingDoublingAllreduce: *route = Route::kHalvingDoubling; return true;
    default: return false;
  }
}

void linkAllreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op,
                   StageGate* gate);

// The group agrees on its link rate and round trip (route_model.h): the slowest rank's best rate
// sample since the last agreement (a rank without one gives +inf; all +inf keeps the rate agreed
// before) and the longest link's round trip now, by one allreduce of two values (MIN of the
// rate and of the negated round trip).
void agreeOnLinks(Communicator& comm) {
  double links[2] = {comm.takeRateSample(), -static_cast<double>(comm.localRoundTripUs())};
  linkAllreduce(comm, links, 2, DataType::kFloat64, ReduceOp::kMin, nullptr);
  if (std::isfinite(links[0])) comm.setLinkBitsPerSecond(links[0]);
  if (links[1] < 0) comm.setLinkRoundTrip(static_cast<uint32_t>(-links[1]));
}

// Through the links: the one-round, single-copy, direct or ring paths by size.
void linkAllreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op,
                   StageGate* gate) {
  const int n = comm.size();
  const size_t bytes = count * elementSize(dtype);
  const bool sampled = comm.samplesRate(bytes);
  if (sampled && comm.rateAgreementDue()) agreeOnLinks(comm);
  // The clock only for a sample: small calls are the latency path.
  const auto start = sampled ? std::chrono::steady_clock::now()
                             : std::chrono::steady_clock::time_point{};
  const bool small = comm.options().oneRoundAllreduce(bytes, n);
  OpHeader header = comm.makeHeader(OpType::kAllreduce, count, dtype, op, -1);
  header.variant = linkVariant(comm, bytes);
  // A gate follows the rings segment by segment; every other path needs the
  // whole buffer before its first exchange (a peer may read it from then on)
  // and finishes it whole.
  const bool ring = header.variant == kRingAllreduce || header.variant == kHierarchicalAllreduce;
  StageGate* ringGate = ring && n > 1 && count > 0 ? gate : nullptr;
  StageGate* wholeGate = ringGate == nullptr && bytes > 0 ? gate : nullptr;
  needWhole(wholeGate, bytes);
  if (header.variant == kSingleCopyAllreduce) {
    singleCopyAllreduce(comm, data, count, dtype, op, header);
  } else if (n == 2 && count > 0 && header.variant == kOneShotAllreduce) {
    pairAllreduce(comm, comm.everyRank(), data, count, dtype, op, header,
                  op == ReduceOp::kAvg ? 2 : 0);
  } else if (n > 2 && count > 0 && small) {
    oneShotAllreduce(comm, data, count, dtype, op, header);
  } else if ((header.variant == kDirectAllreduce ||
              header.variant == kHalvingDoublingAllreduce) && count > 0) {
    const Route route =
        header.variant == kDirectAllreduce ? Route::kDirect : Route::kHalvingDoubling;
    allreduceAcrossHosts(route)(comm, comm.everyRank(), data, count, dtype, op, header,
                                op == ReduceOp::kAvg ? n : 0);
  } else {
    comm.exchangeRingHeaders(header);
    if (n > 1 && count > 0) {  // AVG over one rank divides by one
      if (header.variant == kHierarchicalAllreduce) {
        hierarchicalAllreduce(comm, data, count, dtype, op, header, ringGate);
      } else {
        ringAllreduce(comm, data, count, dtype, op, ringGate);
      }
    }
  }
  if (wholeGate != nullptr) wholeGate->produced(0, bytes);
  Route route;
  if (sampled && modelledRoute(header.variant, n, &route)) {
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    comm.sampleRate(route, ModelledOp::kAllreduce, bytes, took.count());
  }
}

}  // namespace

const char* allreduceRoute(const Communicator& comm, size_t bytes) {
  if (onBoard(comm, bytes)) return "board";
  switch (linkVariant(comm, bytes)) {
    case kSingleCopyAllreduce: return "single copy";
    case kOneShotAllreduce: return comm.size() == 2 ? "pair" : "one round";
    case kHierarchicalAllreduce: {
      // This rank's chunk across the hosts (counted in bytes: the route's thresholds are
      // continuous, so the element size moves them by less than one element).
      const SubRing& host = comm.hostRing();
      const size_t chunk = ChunkLayout(bytes, host.size(), comm.segmentBytes(), 1)
                               .chunkLength(static_cast<size_t>(host.pos));
      switch (crossRoute(comm, chunk)) {
        case Route::kDirect: return "two-level, direct across hosts";
        case Route::kHalvingDoubling: return "two-level, halving-doubling across hosts";
        case Route::kPair: return "two-level, pair across hosts";
        default: return "two-level";
      }
    }
    case kDirectAllreduce: return "direct";
    case kHalvingDoublingAllreduce: return "halving-doubling";
    default: return "ring";
  }
}

void allreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op,
               StageGate* gate) {
  reduceFunction(dtype, op);  // rejects unsupported pairs on every rank alike
  const size_t bytes = count * elementSize(dtype);
  if (onBoard(comm, bytes)) {
    needWhole(gate, bytes);
    boardAllreduce(comm, data, count, dtype, op);
    if (gate != nullptr) gate->produced(0, bytes);
  } else {
    linkAllreduce(comm, data, count, dtype, op, gate);
  }
  if (comm.options().checkResults) checkIdenticalResults(comm, data, bytes, "allreduce");
}

}  // namespace ringdist
