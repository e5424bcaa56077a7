// Compressed allreduce: a quantised reduce-scatter in pairwise rounds, then a
// ring allgather of the encoded results. Codec terms (block, aligned piece)
// are in csrc/codec/codec.h.
//
//   chunk    one of N parts of the buffer made of whole codec blocks (block
//            counts differ by at most one); chunk c is owned by rank c.
//            Chunks start on block boundaries, so the encoding of the whole
//            buffer is the concatenation of the chunks' encodings.
//   segment  up to segmentBytes worth of float32 elements of a chunk, rounded
//            to whole blocks; the unit that is encoded, sent, received and
//            decoded, so encoding, transfer and decoding overlap.
//
// Phase 1 (reduce-scatter): every rank encodes every chunk and sends chunk c
// straight to its owner c, in N-1 rounds: in round k the rank at ring
// position p sends to position p+k and receives from p-k. When the group
// spans hosts, it starts round k+1 only once round k has left and arrived. Every rank then sends to
// one peer and receives from one at a time: all pairs at once made three or
// more TCP streams converge on each host's link and lost thousands of
// segments per step to the switch queue (measured on 4 emulated hosts).
// The owner decodes all N contributions to its chunk (its own from its own
// encoding, so every contribution goes through the same quantisation), sums
// them in float32 in rank order 0..N-1, then divides for AVG.
// Phase 2 (allgather): the owner encodes its reduced chunk once and the
// encoded bytes travel around the ring, forwarded segment by segment; every
// rank, the owner included, decodes each chunk from those same bytes as its
// segments arrive.
//
// So each element is quantised twice in total, for any N (a ring that
// requantises per hop would compound N-1 times), and all ranks end with
// bitwise identical results. Wire bytes per rank: (N-1)/N of the encoded
// buffer in each phase, like an uncompressed ring with a narrower element.
#include "csrc/collectives/compressed.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "csrc/collectives/ring.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {

size_t roundUp64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// A round starts once the previous round's bytes have (nearly) reached their
// receiver: "sent" only means the kernel took them, and a TCP send queue can
// hold megabytes, tens of ms of a slow link. Two rounds in flight put two
// streams on one host's downlink, which a shallow switch queue drops.
constexpr size_t kRoundOverlapBytes = 64 * 1024;
constexpr std::chrono::microseconds kDrainPoll{200};
// A receiver says "go" for the next round once all but this much of the
// current round has arrived: the go crosses the reverse link's queue (up to
// ~2 ms behind data), so the next stream then starts about when this one
// ends. 4 emulated hosts at 1 Gbit/s, DDP step / wire-bound floor: go on
// full arrival 1.31, 64 KiB early 1.27, 128 KiB 1.18-1.29, 256 KiB
// 1.24-1.26; 512 KiB overlapped the streams and lost 372 segments per step.
constexpr size_t kEarlyGoBytes = 128 * 1024;

}  // namespace

void compressedAllreduce(Communicator& comm, float* data, size_t count, Codec codec,
                         bool average) {
  const int n = comm.size();
  const int rank = comm.rank();
  RINGDIST_CHECK(isKnownCodec(static_cast<uint8_t>(codec)), "ringdist ", comm.opName(), ": rank ",
                 rank, ": unknown codec id ", static_cast<int>(codec));
  OpHeader header = comm.makeHeader(OpType::kCompressedAllreduce, count, DataType::kFloat32,
                                    average ? ReduceOp::kAvg : ReduceOp::kSum, -1);
  header.reserved = static_cast<uint8_t>(codec);
  std::vector<int> peers;
  for (int k = 1; k < n; ++k) {
    peers.push_back((rank + k) % n);  // start after us so not every rank hits rank 0 first
  }
  comm.exchangeHeaders(header, peers, peers);
  if (count == 0) {
    return;
  }

  // Layout in blocks; element ranges are clipped to count (only the very
  // last block of the buffer can be short).
  const size_t blocks = (count + kCodecBlock - 1) / kCodecBlock;
  const size_t segBlocks = std::max<size_t>(1, comm.segmentBytes() / (sizeof(float) * kCodecBlock));
  const ChunkLayout layout(blocks, n, segBlocks);
  auto elemOf = [&](size_t block) { return std::min(count, block * kCodecBlock); };
  // Segment j of chunk c as an element range [*begin, *begin + *length).
  auto segment = [&](size_t c, size_t j, size_t* begin, size_t* length) {
    size_t firstBlock, nBlocks;
    layout.segment(c, j, &firstBlock, &nBlocks);
    *begin = elemOf(firstBlock);
    *length = elemOf(firstBlock + nBlocks) - *begin;
  };
  auto chunkBegin = [&](size_t c) { return elemOf(layout.chunkOffset(c)); };
  auto chunkElems = [&](size_t c) {
    return elemOf(layout.chunkOffset(c) + layout.chunkLength(c)) - chunkBegin(c);
  };
  const size_t segments = layout.segmentsPerChunk;
  const size_t me = static_cast<size_t>(rank);
  // Calls fn(j, begin, length) for each non-empty segment j of chunk c.
  auto forSegments = [&](size_t c, auto&& fn) {
    for (size_t j = 0; j < segments; ++j) {
      size_t begin, length;
      segment(c, j, &begin, &length);
      if (length > 0) fn(j, begin, length);
    }
  };

  // Scratch: [whole-buffer encoding | N slots for contributions to our chunk
  // | N slots of reduced chunks]; slot sizes are the largest chunk's encoding.
  size_t maxChunkEnc = 0;
  for (size_t c = 0; c < static_cast<size_t>(n); ++c) {
    maxChunkEnc = std::max(maxChunkEnc, encodedBytes(codec, chunkElems(c)));
  }
  const size_t sendBytes = roundUp64(encodedBytes(codec, count));
  const size_t slotBytes = roundUp64(std::max<size_t>(maxChunkEnc, 1));
  char* scratch = comm.scratch(sendBytes + 2 * static_cast<size_t>(n) * slotBytes);
  char* sendArea = scratch;
  char* recvArea = scratch + sendBytes;
  char* gatherArea = recvArea + static_cast<size_t>(n) * slotBytes;
  // Where segment j of chunk c sits inside a slot (encoded bytes from the chunk's start).
  auto slotOffset = [&](size_t c, size_t j) {
    size_t begin, length;
    segment(c, j, &begin, &length);
    return encodedBytes(codec, begin - chunkBegin(c));
  };
  // The rank `offset` ring positions after us (negative: before us).
  auto rankAt = [&](int offset) { return comm.ringRank(comm.ringPos() + offset); };
  const int right = comm.right();
  const int left = comm.left();

  // Pacing (N > 2): a rank sends its round-k chunk only after the receiver
  // said "go" (it has all of round k-1 but its last kEarlyGoBytes) and our
  // own previous round has drained, and it starts the allgather only after
  // its right neighbour said "go" (the same for phase 1). So each host link carries one transfer at
  // a time. With two ranks there is only one peer and nothing to pace; on
  // one host there is no shared link, and the hand-offs would only add latency.
  const bool paced = n > 2 && comm.hostCount() > 1;
  std::vector<uint64_t> goOut(static_cast<size_t>(n) + 1), goIn(static_cast<size_t>(n) + 1);
  std::vector<uint64_t> goTicket(static_cast<size_t>(n) + 1, 0);  // by round; round N: allgather
  for (int k = 0; k <= n; ++k) goOut[static_cast<size_t>(k)] = static_cast<uint64_t>(k);
  auto postGo = [&](int peer, int round) {
    goTicket[static_cast<size_t>(round)] = comm.channel(peer).postRecv(
        &goIn[static_cast<size_t>(round)], sizeof(uint64_t));
  };
  auto goArrived = [&](int peer, int round) {
    if (!comm.channel(peer).recvDone(goTicket[static_cast<size_t>(round)])) return false;
    RINGDIST_CHECK(goIn[static_cast<size_t>(round)] == static_cast<uint64_t>(round), "ringdist ",
                   comm.opName(), ": rank ", rank, ": rank ", peer, " sent go for round ",
                   goIn[static_cast<size_t>(round)], " where round ", round, " was due");
    return true;
  };
  std::vector<uint64_t> lastSend(static_cast<size_t>(n), 0);
  auto sendGo = [&](int peer, int round) {
    lastSend[static_cast<size_t>(peer)] =
        comm.channel(peer).postSend(&goOut[static_cast<size_t>(round)], sizeof(uint64_t));
    comm.progress();
  };

  // Every receive is posted first, in the order each peer sends. The rank k
  // positions after us sends us its go for round k (in its step k) and its
  // round N-k contribution to our chunk (in its step N-k), so the go comes
  // first when k <= N-k; our right neighbour (k = 1) then sends the go for
  // the allgather, and our left neighbour (k = N-1) the allgather itself:
  // the chunk of the rank s positions before us, s = 1..N-1.
  using Tickets = std::vector<std::vector<uint64_t>>;  // [peer or step][segment]
  Tickets contribTicket(static_cast<size_t>(n), std::vector<uint64_t>(segments, 0));
  Tickets gatherTicket(static_cast<size_t>(n), std::vector<uint64_t>(segments, 0));
  for (int k = 1; k < n; ++k) {
    const int q = rankAt(k);
    if (paced && k <= n - k) postGo(q, k);
    forSegments(me, [&](size_t j, size_t begin, size_t length) {
      contribTicket[static_cast<size_t>(q)][j] = comm.channel(q).postRecv(
          recvArea + static_cast<size_t>(q) * slotBytes + slotOffset(me, j),
          encodedBytes(codec, length));
    });
    if (paced && k > n - k) postGo(q, k);
    if (paced && k == 1) postGo(q, n);
  }
  for (int s = 1; s < n; ++s) {
    const size_t owner = static_cast<size_t>(rankAt(-s));
    forSegments(owner, [&](size_t j, size_t begin, size_t length) {
      gatherTicket[static_cast<size_t>(s)][j] = comm.channel(left).postRecv(
          gatherArea + owner * slotBytes + slotOffset(owner, j), encodedBytes(codec, length));
    });
  }
  // Gos need only what precedes the last kEarlyGoBytes of our chunk's encoding.
  const size_t ownEncBytes = encodedBytes(codec, chunkElems(me));
  auto inTail = [&](size_t encOffset) { return encOffset + kEarlyGoBytes > ownEncBytes; };
  auto segmentsArrived = [&](int peer) {
    bool done = true;
    forSegments(me, [&](size_t j, size_t begin, size_t length) {
      const uint64_t t = contribTicket[static_cast<size_t>(peer)][j];
      if (!inTail(slotOffset(me, j)) && !comm.channel(peer).recvDone(t)) done = false;
    });
    return done;
  };
  auto drained = [&](int peer) {
    const uint64_t t = lastSend[static_cast<size_t>(peer)];
    Channel& ch = comm.channel(peer);
    return (t == 0 || ch.sendDone(t)) && ch.unacknowledgedBytes() <= kRoundOverlapBytes;
  };

  // Phase 1, step k: send our encoding of chunk rankAt(k) to its owner and
  // receive rankAt(-k)'s encoding of ours. A round's chunk is encoded while
  // the previous round is on the wire (unpaced: segment by segment as it is
  // sent); our own chunk is encoded first, for the reduction.
  auto encodeChunk = [&](size_t c, bool sendNow) {
    forSegments(c, [&](size_t j, size_t begin, size_t length) {
      char* enc = sendArea + encodedBytes(codec, begin);
      encode(codec, data + begin, length, enc);
      if (sendNow) {
        lastSend[c] = comm.channel(static_cast<int>(c)).postSend(enc, encodedBytes(codec, length));
        comm.progress();
      }
    });
  };
  encodeChunk(me, false);
  for (int k = 1; k < n; ++k) {
    const int to = rankAt(k);
    const size_t c = static_cast<size_t>(to);
    if (!paced) {
      encodeChunk(c, true);
      continue;
    }
    encodeChunk(c, false);
    const int from = rankAt(-k);
    if (k > 1) {
      const int prevFrom = rankAt(-(k - 1));
      comm.waitUntil([&] { return segmentsArrived(prevFrom); });
    }
    sendGo(from, k);
    const int prevTo = rankAt(k - 1);
    comm.waitUntil([&] { return goArrived(to, k) && (k == 1 || drained(prevTo)); }, kDrainPoll);
    forSegments(c, [&](size_t j, size_t begin, size_t length) {
      lastSend[c] = comm.channel(to).postSend(sendArea + encodedBytes(codec, begin),
                                              encodedBytes(codec, length));
    });
    comm.progress();
  }

  // Reduce our chunk segment by segment as the last round's contributions
  // arrive; encode each reduced segment once and decode it back in place.
  // Unpaced, each reduced segment leaves for the allgather at once.
  char* ownGathered = gatherArea + me * slotBytes;
  bool allgatherGoSent = false;
  forSegments(me, [&](size_t j, size_t begin, size_t length) {
    comm.waitUntil([&] {
      for (int p : peers) {
        uint64_t t = contribTicket[static_cast<size_t>(p)][j];
        if (t != 0 && !comm.channel(p).recvDone(t)) return false;
      }
      return true;
    });
    const size_t encOffset = slotOffset(me, j);
    float* out = data + begin;
    for (int p = 0; p < n; ++p) {
      const char* src = p == rank ? sendArea + encodedBytes(codec, begin)
                                  : recvArea + static_cast<size_t>(p) * slotBytes + encOffset;
      if (p == 0) {
        decode(codec, src, length, out);
      } else {
        decodeAdd(codec, src, length, out);
      }
    }
    if (average && n > 1) {
      const float divisor = static_cast<float>(n);
      for (size_t i = 0; i < length; ++i) out[i] /= divisor;
    }
    if (paced && !allgatherGoSent && inTail(encOffset + encodedBytes(codec, length))) {
      sendGo(left, n);  // (nearly) all of phase 1 is here: our left neighbour may start
      allgatherGoSent = true;
    }
    char* enc = ownGathered + encOffset;
    encode(codec, out, length, enc);
    if (!paced && n > 1) {
      lastSend[static_cast<size_t>(right)] =
          comm.channel(right).postSend(enc, encodedBytes(codec, length));
      comm.progress();
    }
    decode(codec, enc, length, out);
  });

  // Phase 2: step s forwards to the right the chunk received at step s-1
  // (step 0: our own), segment by segment; each arrival is decoded.
  if (paced) {
    if (!allgatherGoSent) sendGo(left, n);  // an empty chunk has no segments
    const int lastTo = rankAt(n - 1);
    comm.waitUntil([&] { return goArrived(right, n) && drained(lastTo); }, kDrainPoll);
    forSegments(me, [&](size_t j, size_t begin, size_t length) {
      lastSend[static_cast<size_t>(right)] = comm.channel(right).postSend(
          ownGathered + slotOffset(me, j), encodedBytes(codec, length));
    });
    comm.progress();
  }
  for (int s = 1; s < n; ++s) {
    const size_t owner = static_cast<size_t>(rankAt(-s));
    forSegments(owner, [&](size_t j, size_t begin, size_t length) {
      comm.waitUntil([&] { return comm.channel(left).recvDone(gatherTicket[static_cast<size_t>(s)][j]); });
      const char* enc = gatherArea + owner * slotBytes + slotOffset(owner, j);
      if (s < n - 1) {
        lastSend[static_cast<size_t>(right)] =
            comm.channel(right).postSend(enc, encodedBytes(codec, length));
      }
      decode(codec, enc, length, data + begin);
    });
  }
  // The encodings we sent must stay untouched until the peers have them.
  comm.waitUntil([&] {
    for (int p : peers) {
      uint64_t t = lastSend[static_cast<size_t>(p)];
      if (t != 0 && !comm.channel(p).sendDone(t)) return false;
    }
    return true;
  });
}

}  // namespace ringdist
