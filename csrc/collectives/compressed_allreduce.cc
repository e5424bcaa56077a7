// Compressed allreduce: a quantised reduce-scatter over the mesh, then every
// owner sends its encoded result straight to every peer. Codec terms (block,
// aligned piece) are in csrc/codec/codec.h.
//
//   chunk    one of N parts of the buffer made of whole codec blocks (block
//            counts differ by at most one); chunk c is owned by rank c.
//            Chunks start on block boundaries, so the encoding of the whole
//            buffer is the concatenation of the chunks' encodings.
//   segment  up to segmentBytes worth of float32 elements of a chunk, rounded
//            to whole blocks; the unit that is encoded, sent, received and
//            decoded, so encoding, transfer and decoding overlap.
//
// Phase 1 (reduce-scatter): every rank encodes every chunk, segment by
// segment, and sends chunk c straight to its owner c (all pairs at once over
// the mesh, like alltoall). The owner decodes all N contributions to its
// chunk (its own from its own encoding, so every rank's contribution goes
// through the same quantisation) and sums them in float32 in rank order
// 0..N-1, then divides for AVG.
// Phase 2 (gather): as soon as a segment of its chunk is reduced, the owner
// encodes it once and sends those bytes to every peer; every rank, the owner
// included, decodes the chunk from those same bytes, segment by segment as
// they arrive. Phase 2 of early segments overlaps phase 1 of later ones, and
// no decoding waits for the end of the transfer.
//
// So each element is quantised twice in total, for any N (a ring that
// requantises per hop would compound N-1 times), and all ranks end with
// bitwise identical results. Wire bytes per rank: (N-1)/N of the encoded
// buffer in each phase, like an uncompressed ring with a narrower element.
#include "csrc/collectives/compressed.h"

#include <algorithm>
#include <vector>

#include "csrc/collectives/ring.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {

size_t roundUp64(size_t bytes) { return (bytes + 63) / 64 * 64; }

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

  // Every receive is posted first, in the order each peer sends: its phase 1
  // segments of our chunk, then its phase 2 segments of its own chunk.
  using Tickets = std::vector<std::vector<uint64_t>>;  // [peer][segment]
  Tickets contribTicket(static_cast<size_t>(n), std::vector<uint64_t>(segments, 0));
  Tickets gatherTicket(static_cast<size_t>(n), std::vector<uint64_t>(segments, 0));
  for (int p : peers) {
    const size_t pu = static_cast<size_t>(p);
    Channel& ch = comm.channel(p);
    for (size_t j = 0; j < segments; ++j) {
      size_t begin, length;
      segment(me, j, &begin, &length);
      if (length == 0) continue;
      contribTicket[pu][j] = ch.postRecv(recvArea + pu * slotBytes + slotOffset(me, j),
                                         encodedBytes(codec, length));
    }
    for (size_t j = 0; j < segments; ++j) {
      size_t begin, length;
      segment(pu, j, &begin, &length);
      if (length == 0) continue;
      gatherTicket[pu][j] = ch.postRecv(gatherArea + pu * slotBytes + slotOffset(pu, j),
                                        encodedBytes(codec, length));
    }
  }

  // Phase 1: encode segment j of every chunk (ours first), send each to its owner.
  std::vector<uint64_t> lastSend(static_cast<size_t>(n), 0);
  for (size_t j = 0; j < segments; ++j) {
    for (int k = 0; k < n; ++k) {
      size_t c = static_cast<size_t>((rank + k) % n);
      size_t begin, length;
      segment(c, j, &begin, &length);
      if (length == 0) continue;
      char* enc = sendArea + encodedBytes(codec, begin);
      encode(codec, data + begin, length, enc);
      if (c != me) {
        lastSend[c] = comm.channel(static_cast<int>(c)).postSend(enc, encodedBytes(codec, length));
      }
    }
    comm.progress();  // start moving this segment while the next one is encoded
  }

  // Reduce our chunk segment by segment as contributions arrive; each reduced
  // segment is encoded, sent to every peer and decoded back in place at once.
  char* ownGathered = gatherArea + me * slotBytes;
  for (size_t j = 0; j < segments; ++j) {
    size_t begin, length;
    segment(me, j, &begin, &length);
    if (length == 0) continue;
    comm.waitUntil([&] {
      for (int p : peers) {
        if (!comm.channel(p).recvDone(contribTicket[static_cast<size_t>(p)][j])) return false;
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
    char* enc = ownGathered + encOffset;
    encode(codec, out, length, enc);
    for (int p : peers) {
      lastSend[static_cast<size_t>(p)] = comm.channel(p).postSend(enc, encodedBytes(codec, length));
    }
    comm.progress();
    decode(codec, enc, length, out);
  }

  // Phase 2 arrivals: decode every peer's reduced chunk segment by segment.
  for (size_t j = 0; j < segments; ++j) {
    for (int p : peers) {
      const size_t pu = static_cast<size_t>(p);
      size_t begin, length;
      segment(pu, j, &begin, &length);
      if (length == 0) continue;
      comm.waitUntil([&] { return comm.channel(p).recvDone(gatherTicket[pu][j]); });
      decode(codec, gatherArea + pu * slotBytes + slotOffset(pu, j), length, data + begin);
    }
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
