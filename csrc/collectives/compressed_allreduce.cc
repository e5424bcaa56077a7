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
//   round    phase 1 step k = 1..N-1: the rank at ring position p sends its
//            encoding of chunk rankAt(p+k) to that chunk's owner and receives
//            rankAt(p-k)'s encoding of its own chunk.
//   slot     room for one chunk's encoding in scratch.
//
// Phase 1 (reduce-scatter): every rank encodes every chunk and sends chunk c
// straight to its owner c, one round after the other. When the group spans
// hosts the rounds are paced (pacer.h) so each host link carries one
// transfer at a time. The owner decodes all N contributions to its chunk
// (its own from its own encoding, so every contribution goes through the
// same quantisation), sums them in float32 in rank order 0..N-1, then
// divides for AVG.
// Phase 2 (allgather): the owner encodes its reduced chunk once and the
// encoded bytes travel around the ring, forwarded segment by segment; every
// rank, the owner included, decodes each chunk from those same bytes as its
// segments arrive.
//
// So each element is quantised twice in total, for any N (a ring that
// requantises per hop would compound N-1 times), and all ranks end with
// bitwise identical results. Wire bytes per rank: (N-1)/N of the encoded
// buffer in each phase, like an uncompressed ring with a narrower element.
//
// The encoded form (compressedAllreduceEncoded) starts from the whole
// buffer's encoding and ends with the result's, skipping the encodes of
// phase 1 and the decodes of phase 2; only the owner's chunk is decoded and
// summed here, in scratch.
#include <algorithm>
#include <memory>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/pacer.h"
#include "csrc/collectives/ring.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {

size_t roundUp64(size_t bytes) { return (bytes + 63) / 64 * 64; }

class CompressedAllreduce {
 public:
  // Plain form: data is encoded and decoded here. Encoded form: data is null,
  // encodedIn is the whole buffer's encoding and encodedOut gets the result's.
  CompressedAllreduce(Communicator& comm, float* data, const char* encodedIn, char* encodedOut,
                      size_t count, Codec codec, bool average);

  void run() {
    postReceives();
    phase1();
    reduceOwnChunk();
    phase2();
    waitForSends();
  }

 private:
  using Tickets = std::vector<std::vector<uint64_t>>;  // [peer or step][segment]

  void postReceives();
  void phase1();
  void reduceOwnChunk();
  void phase2();
  void waitForSends();

  // Encodes chunk c into the send area (plain form; the encoded form has it
  // already); sendNow: each segment leaves for its owner as soon as it is
  // encoded.
  void encodeChunk(size_t c, bool sendNow);
  // Receiver side of pacing: all but the tail of `peer`'s contribution arrived.
  bool contributionArrived(int peer);
  void send(int peer, const char* encoded, size_t elements);

  // Segment j of chunk c as an element range [*begin, *begin + *length).
  void segment(size_t c, size_t j, size_t* begin, size_t* length) const {
    size_t firstBlock, blocks;
    layout_.segment(c, j, &firstBlock, &blocks);
    *begin = elemOf(firstBlock);
    *length = elemOf(firstBlock + blocks) - *begin;
  }
  // Calls fn(j, begin, length) for each non-empty segment j of chunk c.
  template <typename Fn>
  void forSegments(size_t c, Fn&& fn) const {
    for (size_t j = 0; j < layout_.segmentsPerChunk; ++j) {
      size_t begin, length;
      segment(c, j, &begin, &length);
      if (length > 0) fn(j, begin, length);
    }
  }
  // Element ranges are clipped to count: only the buffer's last block can be short.
  size_t elemOf(size_t block) const { return std::min(count_, block * kCodecBlock); }
  size_t chunkBegin(size_t c) const { return elemOf(layout_.chunkOffset(c)); }
  size_t chunkElems(size_t c) const {
    return elemOf(layout_.chunkOffset(c) + layout_.chunkLength(c)) - chunkBegin(c);
  }
  size_t encoded(size_t elements) const { return encodedBytes(codec_, elements); }
  // Where segment j of chunk c sits inside a slot (encoded bytes from the chunk's start).
  size_t slotOffset(size_t c, size_t j) const {
    size_t begin, length;
    segment(c, j, &begin, &length);
    return encoded(begin - chunkBegin(c));
  }
  // The rank `offset` ring positions after us (negative: before us).
  int rankAt(int offset) const { return comm_.ringRank(comm_.ringPos() + offset); }

  Communicator& comm_;
  float* const data_;  // null in the encoded form
  const size_t count_;
  const Codec codec_;
  const bool average_;
  const int n_;
  const size_t me_;
  const ChunkLayout layout_;  // over codec blocks
  // Scratch: [N contribution slots for our chunk | plain form: our
  // encoding of the whole buffer, the reduced chunks' encodings (both in
  // whole-buffer layout); encoded form: our chunk in float32].
  size_t slotBytes_ = 0;
  char* recvArea_ = nullptr;
  char* encodeArea_ = nullptr;    // plain form: where phase 1 encodes
  const char* sendArea_ = nullptr;
  char* gatherArea_ = nullptr;
  float* own_ = nullptr;          // our chunk's sum
  std::vector<int> peers_;
  std::vector<uint64_t> lastSend_;  // by peer: ticket of our latest send
  Tickets contribTicket_;           // [peer][segment of our chunk]
  Tickets gatherTicket_;            // [allgather step][segment]
  std::unique_ptr<Pacer> pacer_;    // only when paced
  bool allgatherGoSent_ = false;
};

CompressedAllreduce::CompressedAllreduce(Communicator& comm, float* data, const char* encodedIn,
                                         char* encodedOut, size_t count, Codec codec, bool average)
    : comm_(comm),
      data_(data),
      count_(count),
      codec_(codec),
      average_(average),
      n_(comm.size()),
      me_(static_cast<size_t>(comm.rank())),
      layout_((count + kCodecBlock - 1) / kCodecBlock, comm.size(), comm.segmentBytes(),
              sizeof(float) * kCodecBlock),
      peers_(comm.others()),
      lastSend_(static_cast<size_t>(comm.size()), 0),
      contribTicket_(static_cast<size_t>(comm.size()),
                     std::vector<uint64_t>(layout_.segmentsPerChunk, 0)),
      gatherTicket_(contribTicket_) {
  size_t maxChunkEncoded = 1;
  for (size_t c = 0; c < static_cast<size_t>(n_); ++c) {
    maxChunkEncoded = std::max(maxChunkEncoded, encoded(chunkElems(c)));
  }
  slotBytes_ = roundUp64(maxChunkEncoded);
  const size_t slotsBytes = static_cast<size_t>(n_) * slotBytes_;
  if (data_ != nullptr) {
    const size_t wholeBytes = roundUp64(encoded(count_));
    recvArea_ = comm_.scratch(slotsBytes + 2 * wholeBytes);
    encodeArea_ = recvArea_ + slotsBytes;
    sendArea_ = encodeArea_;
    gatherArea_ = encodeArea_ + wholeBytes;
    own_ = data_ + chunkBegin(me_);
  } else {
    recvArea_ = comm_.scratch(slotsBytes + roundUp64(chunkElems(me_) * sizeof(float)));
    sendArea_ = encodedIn;
    gatherArea_ = encodedOut;
    own_ = reinterpret_cast<float*>(recvArea_ + slotsBytes);
  }
  // With two ranks there is one peer and nothing to pace; on one host there
  // is no shared link, and the hand-offs would only add latency.
  if (n_ > 2 && comm_.hostCount() > 1) {
    pacer_ = std::make_unique<Pacer>(comm_, n_, encoded(chunkElems(me_)), lastSend_);
  }
}

void CompressedAllreduce::send(int peer, const char* encodedSegment, size_t elements) {
  lastSend_[static_cast<size_t>(peer)] =
      comm_.channel(peer).postSend(encodedSegment, encoded(elements));
}

// Every receive is posted first, in the order each peer sends (a channel has
// no framing). The rank k positions after us sends us its go for round k (in
// its step k) and its round N-k contribution to our chunk (in its step N-k),
// so the go comes first when k <= N-k; our right neighbour (k = 1) then sends
// the go for the allgather, and our left neighbour (k = N-1) the allgather
// itself: the chunk of the rank s positions before us, s = 1..N-1.
void CompressedAllreduce::postReceives() {
  for (int k = 1; k < n_; ++k) {
    const int q = rankAt(k);
    if (pacer_ && k <= n_ - k) pacer_->expectGo(q, k);
    forSegments(me_, [&](size_t j, size_t, size_t length) {
      contribTicket_[static_cast<size_t>(q)][j] = comm_.channel(q).postRecv(
          recvArea_ + static_cast<size_t>(q) * slotBytes_ + slotOffset(me_, j), encoded(length));
    });
    if (pacer_ && k > n_ - k) pacer_->expectGo(q, k);
    if (pacer_ && k == 1) pacer_->expectGo(q, n_);
  }
  if (n_ == 1) {
    return;  // no allgather: one rank has no left neighbour
  }
  Channel& left = comm_.channel(comm_.left());
  for (int s = 1; s < n_; ++s) {
    const size_t owner = static_cast<size_t>(rankAt(-s));
    forSegments(owner, [&](size_t j, size_t begin, size_t length) {
      gatherTicket_[static_cast<size_t>(s)][j] =
          left.postRecv(gatherArea_ + encoded(begin), encoded(length));
    });
  }
}

void CompressedAllreduce::encodeChunk(size_t c, bool sendNow) {
  forSegments(c, [&](size_t, size_t begin, size_t length) {
    const char* enc = sendArea_ + encoded(begin);
    if (data_ != nullptr) {
      encode(codec_, data_ + begin, length, encodeArea_ + encoded(begin));
    }
    if (sendNow) {
      send(static_cast<int>(c), enc, length);
      comm_.progress();
    }
  });
}

bool CompressedAllreduce::contributionArrived(int peer) {
  bool done = true;
  forSegments(me_, [&](size_t j, size_t, size_t) {
    const uint64_t t = contribTicket_[static_cast<size_t>(peer)][j];
    if (!pacer_->inTail(slotOffset(me_, j)) && !comm_.channel(peer).recvDone(t)) done = false;
  });
  return done;
}

// Round k: send our encoding of chunk rankAt(k) to its owner. A round's chunk
// is encoded while the previous round is on the wire (unpaced: segment by
// segment as it is sent); our own chunk is encoded first, for the reduction.
void CompressedAllreduce::phase1() {
  encodeChunk(me_, false);
  for (int k = 1; k < n_; ++k) {
    const int to = rankAt(k);
    const size_t c = static_cast<size_t>(to);
    if (!pacer_) {
      encodeChunk(c, true);
      continue;
    }
    encodeChunk(c, false);
    if (k > 1) {
      const int prevFrom = rankAt(-(k - 1));
      comm_.waitUntil([&] { return contributionArrived(prevFrom); });
    }
    pacer_->sendGo(rankAt(-k), k);
    pacer_->waitForTurn(to, k, k == 1 ? -1 : rankAt(k - 1));
    forSegments(c, [&](size_t, size_t begin, size_t length) {
      send(to, sendArea_ + encoded(begin), length);
    });
    comm_.progress();
  }
}

// Sums our chunk segment by segment as the last round's contributions
// arrive; encodes each reduced segment once and decodes it back in place.
// Unpaced, each reduced segment leaves for the allgather at once.
void CompressedAllreduce::reduceOwnChunk() {
  const int rank = comm_.rank();
  forSegments(me_, [&](size_t j, size_t begin, size_t length) {
    comm_.waitUntil([&] {
      for (int p : peers_) {
        uint64_t t = contribTicket_[static_cast<size_t>(p)][j];
        if (t != 0 && !comm_.channel(p).recvDone(t)) return false;
      }
      return true;
    });
    const size_t encOffset = slotOffset(me_, j);
    float* out = own_ + (begin - chunkBegin(me_));
    for (int p = 0; p < n_; ++p) {
      const char* src = p == rank ? sendArea_ + encoded(begin)
                                  : recvArea_ + static_cast<size_t>(p) * slotBytes_ + encOffset;
      if (p == 0) {
        decode(codec_, src, length, out);
      } else {
        decodeAdd(codec_, src, length, out);
      }
    }
    if (average_ && n_ > 1) {
      const float divisor = static_cast<float>(n_);
      for (size_t i = 0; i < length; ++i) out[i] /= divisor;
    }
    if (pacer_ && !allgatherGoSent_ && pacer_->inTail(encOffset + encoded(length))) {
      pacer_->sendGo(comm_.left(), n_);  // (nearly) all of phase 1 is here
      allgatherGoSent_ = true;
    }
    char* enc = gatherArea_ + encoded(begin);
    encode(codec_, out, length, enc);
    if (!pacer_ && n_ > 1) {
      send(comm_.right(), enc, length);
      comm_.progress();
    }
    if (data_ != nullptr) {
      decode(codec_, enc, length, out);
    }
  });
}

// Step s forwards to the right the chunk received at step s-1 (step 0: our
// own), segment by segment; each arrival is decoded.
void CompressedAllreduce::phase2() {
  if (n_ == 1) {
    return;  // our chunk is the whole buffer, already reduced
  }
  const int right = comm_.right();
  Channel& left = comm_.channel(comm_.left());
  if (pacer_) {
    if (!allgatherGoSent_) pacer_->sendGo(comm_.left(), n_);  // an empty chunk has no segments
    pacer_->waitForTurn(right, n_, rankAt(n_ - 1));
    forSegments(me_, [&](size_t, size_t begin, size_t length) {
      send(right, gatherArea_ + encoded(begin), length);
    });
    comm_.progress();
  }
  for (int s = 1; s < n_; ++s) {
    const size_t owner = static_cast<size_t>(rankAt(-s));
    forSegments(owner, [&](size_t j, size_t begin, size_t length) {
      comm_.waitUntil([&] { return left.recvDone(gatherTicket_[static_cast<size_t>(s)][j]); });
      const char* enc = gatherArea_ + encoded(begin);
      if (s < n_ - 1) {
        send(right, enc, length);
      }
      if (data_ != nullptr) {
        decode(codec_, enc, length, data_ + begin);
      }
    });
  }
}

// The encodings we sent must stay untouched until the peers have them.
void CompressedAllreduce::waitForSends() {
  comm_.waitUntil([&] {
    for (int p : peers_) {
      uint64_t t = lastSend_[static_cast<size_t>(p)];
      if (t != 0 && !comm_.channel(p).sendDone(t)) return false;
    }
    return true;
  });
}

// Both forms send the same header: the wire is the same.
void exchangeHeaders(Communicator& comm, size_t count, Codec codec, bool average) {
  RINGDIST_CHECK(isKnownCodec(static_cast<uint8_t>(codec)), "ringdist ", comm.opName(), ": rank ",
                 comm.rank(), ": unknown codec id ", static_cast<int>(codec));
  OpHeader header = comm.makeHeader(OpType::kCompressedAllreduce, count, DataType::kFloat32,
                                    average ? ReduceOp::kAvg : ReduceOp::kSum, -1);
  header.variant = static_cast<uint8_t>(codec);
  const std::vector<int> peers = comm.others();
  comm.exchangeHeaders(header, peers, peers);
}

}  // namespace

void compressedAllreduce(Communicator& comm, float* data, size_t count, Codec codec,
                         bool average) {
  exchangeHeaders(comm, count, codec, average);
  if (count > 0) {
    CompressedAllreduce(comm, data, nullptr, nullptr, count, codec, average).run();
  }
}

void compressedAllreduceEncoded(Communicator& comm, const void* encodedIn, void* encodedOut,
                                size_t count, Codec codec, bool average) {
  exchangeHeaders(comm, count, codec, average);
  if (count > 0) {
    CompressedAllreduce(comm, nullptr, static_cast<const char*>(encodedIn),
                        static_cast<char*>(encodedOut), count, codec, average)
        .run();
  }
}

}  // namespace ringdist
