// Compressed allreduce: a quantised reduce-scatter in pairwise rounds, then a
// ring allgather of the encoded results, among a group of N ranks (every rank, or one
// rank per host in the two-level form below). Codec terms (block, aligned piece)
// are in csrc/codec/codec.h.
//
//   chunk    one of N parts of the buffer made of whole codec blocks (block
//            counts differ by at most one); chunk p is owned by the rank at
//            ring position p.
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
// same quantisation), sums them in float32 in ring position order 0..N-1, then
// divides for AVG. With a residual (error feedback), each rank first adds it to its
// data, then keeps in it what its encoding lost of its contribution, for the next call.
// Phase 2 (allgather): the owner encodes its reduced chunk once and the
// encoded bytes travel around the ring, forwarded segment by segment; every
// rank, the owner included, decodes each chunk from those same bytes as its
// segments arrive.
//
// So each element is quantised twice in total, for any N (a ring that
// requantises per hop would compound N-1 times), and all ranks end with
// bitwise identical results. Wire bytes per rank: (N-1)/N of the encoded
// buffer in each phase, like an uncompressed ring with a narrower element.
// Two ranks on the plain form exchange their whole encodings instead
// (pairCompressedAllreduce): the same bytes, one one-way trip, one quantisation.
//
// The direct exchange (one rank per host, where the route model predicts it faster than the
// rounds: long links): phase 1 sends every chunk to its owner at once, unpaced, and phase 2
// sends each owner's encoded result straight to every rank instead of around the ring. The
// same bytes, the same quantisations and sums, so the same bits as the rounds; two one-way
// trips where the rounds take 2(N-1), and all N-1 connections fill at once (new connections,
// after a shrink, leave slow start together instead of one round after another).
//
// The encoded form (compressedAllreduceEncoded) starts from the whole
// buffer's encoding and ends with the result's, skipping the encodes of
// phase 1 and the decodes of phase 2; only the owner's chunk is decoded and
// summed here, in scratch.
//
// Two levels (groups of several hosts with the same number L >= 2 of ranks on each, every
// rank on the plain form): a float32 reduce-scatter inside each host over shared memory
// (local position p ends with its host's exact sum of chunk p of L), the compressed
// allreduce above of that chunk among the ranks at position p on every host, then a float32
// allgather inside the host. A host's link carries its host's sum once instead of each of its
// ranks' contributions: L times fewer bytes in phase 1. The host's sum is what gets
// quantised, so the residual of the rank at position p is what the encoding lost of its
// host's sum of chunk p (zero elsewhere): summed over the ranks, the same as on one level,
// what the first quantisation lost.
#include <algorithm>
#include <memory>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/collectives/pacer.h"
#include "csrc/collectives/ring.h"
#include "csrc/collectives/route_model.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {

size_t roundUp64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// Whether `n` ranks, one per host, take the direct exchange for `encodedBytes` on the wire
// (RINGDIST_ROUTE=direct forces it; ring and the other routes keep the rounds).
bool takesDirect(const Communicator& comm, int n, size_t encodedBytes) {
  if (n <= 2 || comm.hostCount() != n ||
      !RouteModel::allowed(Route::kDirect, ModelledOp::kAllreduce, n)) {
    return false;
  }
  if (comm.options().route != RouteMode::kAuto) return comm.options().route == RouteMode::kDirect;
  const RouteModel model = comm.routeModel();
  return model.timeUs(Route::kDirect, ModelledOp::kAllreduce, n, encodedBytes) <=
         kRouteGain * model.timeUs(Route::kRing, ModelledOp::kAllreduce, n, encodedBytes);
}

// lost = data - decode(encoded): what the encoding of `length` values lost (error feedback).
void keepLoss(Codec codec, const float* data, const char* encoded, size_t length, float* lost) {
  decode(codec, encoded, length, lost);
  for (size_t i = 0; i < length; ++i) lost[i] = data[i] - lost[i];
}

class CompressedAllreduce {
 public:
  // Plain form: data is encoded and decoded here. Encoded form: data is null,
  // encodedIn is the whole buffer's encoding and encodedOut gets the result's.
  // group: the ranks taking part, in ring order (this rank at group.pos); divisor > 0:
  // the result is divided by it (AVG); residual (plain form, or null): gets what the encoding
  // of data lost.
  CompressedAllreduce(Communicator& comm, const SubRing& group, float* data,
                      const char* encodedIn, char* encodedOut, size_t count, Codec codec,
                      int divisor, float* residual);

  void run() {
    postReceives();
    phase1();
    reduceOwnChunk();
    phase2();
    waitForSends();
  }

 private:
  using Tickets = std::vector<std::vector<uint64_t>>;  // [ring position][segment]

  void postReceives();
  // The allgather's receives of chunk c, from rank `from`.
  void postGatherReceives(int from, size_t c);
  void phase1();
  void reduceOwnChunk();
  void phase2();
  void waitForSends();

  // Encodes chunk c into the send area (plain form; the encoded form has it
  // already); sendNow: each segment leaves for its owner as soon as it is
  // encoded.
  void encodeChunk(size_t c, bool sendNow);
  // Receiver side of pacing: all but the tail of the contribution of the rank at ring
  // position `from` arrived.
  bool contributionArrived(size_t from);
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
  // The ring position `offset` positions after ours (negative: before), and its rank.
  size_t posAt(int offset) const { return modPos(static_cast<long>(me_) + offset, n_); }
  int rankAt(int offset) const { return group_.members[posAt(offset)]; }

  Communicator& comm_;
  const SubRing& group_;
  float* const data_;  // null in the encoded form
  float* const residual_;
  const size_t count_;
  const Codec codec_;
  const int divisor_;
  const int n_;
  const size_t me_;  // our ring position, and so our chunk
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
  Tickets contribTicket_;           // [contributor's position][segment of our chunk]
  Tickets gatherTicket_;            // [chunk's position][segment]
  const bool direct_;               // the direct exchange (above)
  std::unique_ptr<Pacer> pacer_;    // only when paced
  bool allgatherGoSent_ = false;
};

CompressedAllreduce::CompressedAllreduce(Communicator& comm, const SubRing& group, float* data,
                                         const char* encodedIn, char* encodedOut, size_t count,
                                         Codec codec, int divisor, float* residual)
    : comm_(comm),
      group_(group),
      data_(data),
      residual_(residual),
      count_(count),
      codec_(codec),
      divisor_(divisor),
      n_(group.size()),
      me_(static_cast<size_t>(group.pos)),
      layout_((count + kCodecBlock - 1) / kCodecBlock, group.size(), comm.segmentBytes(),
              sizeof(float) * kCodecBlock),
      lastSend_(static_cast<size_t>(comm.size()), 0),
      contribTicket_(static_cast<size_t>(group.size()),
                     std::vector<uint64_t>(layout_.segmentsPerChunk, 0)),
      gatherTicket_(contribTicket_),
      direct_(takesDirect(comm, group.size(), encodedBytes(codec, count))) {
  for (int k = 1; k < n_; ++k) peers_.push_back(rankAt(k));
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
  // is no shared link, and the hand-offs would only add latency; on long links the hand-offs
  // cost a one-way trip each, and the direct exchange leaves the sharing to TCP.
  if (n_ > 2 && comm_.hostCount() > 1 && !direct_) {
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
// itself: the chunk of the rank s positions before us, s = 1..N-1. In the
// direct exchange each peer sends its contribution, then its own chunk's result.
void CompressedAllreduce::postReceives() {
  for (int k = 1; k < n_; ++k) {
    const int q = rankAt(k);
    const size_t from = posAt(k);
    if (pacer_ && k <= n_ - k) pacer_->expectGo(q, k);
    forSegments(me_, [&](size_t j, size_t, size_t length) {
      contribTicket_[from][j] = comm_.channel(q).postRecv(
          recvArea_ + from * slotBytes_ + slotOffset(me_, j), encoded(length));
    });
    if (pacer_ && k > n_ - k) pacer_->expectGo(q, k);
    if (pacer_ && k == 1) pacer_->expectGo(q, n_);
    if (direct_) postGatherReceives(q, from);
  }
  if (n_ == 1 || direct_) {
    return;  // one rank: no allgather; direct: posted above
  }
  for (int s = 1; s < n_; ++s) postGatherReceives(group_.left(), posAt(-s));
}

void CompressedAllreduce::postGatherReceives(int from, size_t c) {
  Channel& link = comm_.channel(from);
  forSegments(c, [&](size_t j, size_t begin, size_t length) {
    gatherTicket_[c][j] = link.postRecv(gatherArea_ + encoded(begin), encoded(length));
  });
}

void CompressedAllreduce::encodeChunk(size_t c, bool sendNow) {
  forSegments(c, [&](size_t, size_t begin, size_t length) {
    const char* enc = sendArea_ + encoded(begin);
    if (data_ != nullptr) {
      encode(codec_, data_ + begin, length, encodeArea_ + encoded(begin));
    }
    if (residual_ != nullptr) keepLoss(codec_, data_ + begin, enc, length, residual_ + begin);
    if (sendNow) {
      send(group_.members[c], enc, length);
      comm_.progress();
    }
  });
}

bool CompressedAllreduce::contributionArrived(size_t from) {
  Channel& link = comm_.channel(group_.members[from]);
  bool done = true;
  forSegments(me_, [&](size_t j, size_t, size_t) {
    const uint64_t t = contribTicket_[from][j];
    if (!pacer_->inTail(slotOffset(me_, j)) && !link.recvDone(t)) done = false;
  });
  return done;
}

// Round k: send our encoding of chunk posAt(k) to its owner. A round's chunk
// is encoded while the previous round is on the wire (unpaced: segment by
// segment as it is sent); our own chunk is encoded first, for the reduction.
void CompressedAllreduce::phase1() {
  encodeChunk(me_, false);
  for (int k = 1; k < n_; ++k) {
    const int to = rankAt(k);
    const size_t c = posAt(k);
    if (!pacer_) {
      encodeChunk(c, true);
      continue;
    }
    encodeChunk(c, false);
    if (k > 1) {
      comm_.waitUntil([&] { return contributionArrived(posAt(-(k - 1))); });
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
  forSegments(me_, [&](size_t j, size_t begin, size_t length) {
    comm_.waitUntil([&] {
      for (size_t p = 0; p < static_cast<size_t>(n_); ++p) {
        uint64_t t = contribTicket_[p][j];
        if (t != 0 && !comm_.channel(group_.members[p]).recvDone(t)) return false;
      }
      return true;
    });
    const size_t encOffset = slotOffset(me_, j);
    float* out = own_ + (begin - chunkBegin(me_));
    for (size_t p = 0; p < static_cast<size_t>(n_); ++p) {
      const char* src = p == me_ ? sendArea_ + encoded(begin) : recvArea_ + p * slotBytes_ + encOffset;
      if (p == 0) {
        decode(codec_, src, length, out);
      } else {
        decodeAdd(codec_, src, length, out);
      }
    }
    if (divisor_ > 1) divideInPlace(out, length, DataType::kFloat32, divisor_);
    if (pacer_ && !allgatherGoSent_ && pacer_->inTail(encOffset + encoded(length))) {
      pacer_->sendGo(group_.left(), n_);  // (nearly) all of phase 1 is here
      allgatherGoSent_ = true;
    }
    char* enc = gatherArea_ + encoded(begin);
    encode(codec_, out, length, enc);
    if (direct_) {
      for (int p : peers_) send(p, enc, length);
      comm_.progress();
    } else if (!pacer_ && n_ > 1) {
      send(group_.right(), enc, length);
      comm_.progress();
    }
    if (data_ != nullptr) {
      decode(codec_, enc, length, out);
    }
  });
}

// Step s forwards to the right the chunk received at step s-1 (step 0: our
// own), segment by segment; each arrival is decoded. In the direct exchange
// each chunk comes from its owner and goes nowhere.
void CompressedAllreduce::phase2() {
  if (n_ == 1) {
    return;  // our chunk is the whole buffer, already reduced
  }
  const int right = group_.right();
  if (pacer_) {
    if (!allgatherGoSent_) pacer_->sendGo(group_.left(), n_);  // an empty chunk has no segments
    pacer_->waitForTurn(right, n_, rankAt(n_ - 1));
    forSegments(me_, [&](size_t, size_t begin, size_t length) {
      send(right, gatherArea_ + encoded(begin), length);
    });
    comm_.progress();
  }
  for (int s = 1; s < n_; ++s) {
    const size_t c = posAt(-s);
    Channel& from = comm_.channel(direct_ ? rankAt(-s) : group_.left());
    forSegments(c, [&](size_t j, size_t begin, size_t length) {
      comm_.waitUntil([&] { return from.recvDone(gatherTicket_[c][j]); });
      const char* enc = gatherArea_ + encoded(begin);
      if (s < n_ - 1 && !direct_) {
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

// The header, with the form in its tag (1: plain, 0: encoded), to and from every peer.
// Returns whether every rank calls the plain form: only then may the group take two levels
// (the encoded form has no float32 to sum inside a host), and every rank learns the same.
bool exchangeHeaders(Communicator& comm, size_t count, Codec codec, bool average, bool plain) {
  RINGDIST_CHECK(isKnownCodec(static_cast<uint8_t>(codec)), "ringdist ", comm.opName(), ": rank ",
                 comm.rank(), ": unknown codec id ", static_cast<int>(codec));
  OpHeader header = comm.makeHeader(OpType::kCompressedAllreduce, count, DataType::kFloat32,
                                    average ? ReduceOp::kAvg : ReduceOp::kSum, -1);
  header.variant = static_cast<uint8_t>(codec);
  header.tag = plain ? 1 : 0;
  const std::vector<int> peers = comm.others();
  std::vector<OpHeader> theirs(peers.size());
  Communicator::Transfers sends, recvs;
  for (size_t i = 0; i < peers.size(); ++i) {
    Channel& link = comm.channel(peers[i]);
    sends.emplace_back(&link, link.postSend(&header, sizeof(OpHeader)));
    recvs.emplace_back(&link, link.postRecv(&theirs[i], sizeof(OpHeader)));
  }
  comm.waitAll(sends, recvs);
  bool everyPlain = plain;
  for (size_t i = 0; i < peers.size(); ++i) {
    everyPlain = everyPlain && theirs[i].tag == 1;
    theirs[i].tag = header.tag;  // the form may differ; everything else must not
    comm.checkHeader(header, theirs[i], peers[i]);
  }
  return everyPlain;
}

// Two ranks (a group of two, or a two-level group's cross ring across two hosts): each
// encodes its whole buffer segment by segment and sends it; both decode the two encodings
// and sum them, position 0's first, so both compute the same bits. One one-way trip where
// the rounds take two, the same bytes, and each element quantised once. Segment j travels on
// lane j % lanes: on a long link a lost packet holds back only its lane.
void pairCompressedAllreduce(Communicator& comm, const SubRing& pair, float* data, size_t count,
                             Codec codec, int divisor, float* residual) {
  const int peer = pair.members[static_cast<size_t>(1 - pair.pos)];
  const ChunkLayout layout((count + kCodecBlock - 1) / kCodecBlock, 1, comm.segmentBytes(),
                           sizeof(float) * kCodecBlock);
  const size_t segments = layout.segmentsPerChunk;
  auto range = [&](size_t j) {  // segment j: (first element, elements); whole blocks
    size_t firstBlock, blocks;
    layout.segment(0, j, &firstBlock, &blocks);
    const size_t begin = std::min(count, firstBlock * kCodecBlock);
    return std::pair<size_t, size_t>(begin, std::min(count, (firstBlock + blocks) * kCodecBlock) - begin);
  };
  const size_t slot = roundUp64(encodedBytes(codec, count));
  char* mine = comm.scratch(2 * slot);
  char* theirs = mine + slot;
  const int lanes = comm.laneCount(peer);
  std::vector<uint64_t> sent(segments), heard(segments);
  for (size_t j = 0; j < segments; ++j) {
    const auto [begin, length] = range(j);
    heard[j] = comm.lane(peer, static_cast<int>(j % lanes))
                   .postRecv(theirs + encodedBytes(codec, begin), encodedBytes(codec, length));
  }
  for (size_t j = 0; j < segments; ++j) {
    const auto [begin, length] = range(j);
    char* enc = mine + encodedBytes(codec, begin);
    encode(codec, data + begin, length, enc);
    if (residual != nullptr) keepLoss(codec, data + begin, enc, length, residual + begin);
    sent[j] = comm.lane(peer, static_cast<int>(j % lanes)).postSend(enc, encodedBytes(codec, length));
    comm.progress();
  }
  for (size_t j = 0; j < segments; ++j) {
    const auto [begin, length] = range(j);
    Channel& lane = comm.lane(peer, static_cast<int>(j % lanes));
    comm.waitUntil([&] { return lane.recvDone(heard[j]); });
    const size_t at = encodedBytes(codec, begin);
    decode(codec, (pair.pos == 0 ? mine : theirs) + at, length, data + begin);
    decodeAdd(codec, (pair.pos == 0 ? theirs : mine) + at, length, data + begin);
    if (divisor > 1) divideInPlace(data + begin, length, DataType::kFloat32, divisor);
  }
  comm.waitUntil([&] {  // our encoding stays untouched until the peer has it
    for (size_t j = 0; j < segments; ++j) {
      if (!comm.lane(peer, static_cast<int>(j % lanes)).sendDone(sent[j])) return false;
    }
    return true;
  });
}

// The plain form among `group` (every rank, or a cross ring): the pair exchange for two.
void plainCompressedAllreduce(Communicator& comm, const SubRing& group, float* data, size_t count,
                              Codec codec, int divisor, float* residual) {
  if (group.size() == 2) {
    pairCompressedAllreduce(comm, group, data, count, codec, divisor, residual);
  } else {
    CompressedAllreduce(comm, group, data, nullptr, nullptr, count, codec, divisor, residual).run();
  }
}

void twoLevelCompressedAllreduce(Communicator& comm, float* data, size_t count, Codec codec,
                                 bool average, float* residual) {
  const SubRing& host = comm.hostRing();
  const long l = host.size();
  const ReduceFn sum = reduceFunction(DataType::kFloat32, ReduceOp::kSum);
  ringSteps(comm, host, data, count, DataType::kFloat32, sum, 0, l - 1, 0);
  const ChunkLayout layout(count, host.size(), comm.segmentBytes(), sizeof(float));
  const size_t offset = layout.chunkOffset(static_cast<size_t>(host.pos));
  const size_t length = layout.chunkLength(static_cast<size_t>(host.pos));
  if (residual != nullptr) {
    std::fill(residual, residual + offset, 0.0f);
    std::fill(residual + offset + length, residual + count, 0.0f);
  }
  // The same length on every rank at this position: a cross ring skips alike.
  if (length > 0) {
    plainCompressedAllreduce(comm, comm.crossRing(), data + offset, length, codec,
                             average ? comm.size() : 0, residual ? residual + offset : nullptr);
  }
  ringSteps(comm, host, data, count, DataType::kFloat32, sum, l - 1, 2 * (l - 1), 0);
}

}  // namespace

void compressedAllreduce(Communicator& comm, float* data, size_t count, Codec codec,
                         bool average, float* residual) {
  const bool everyPlain = exchangeHeaders(comm, count, codec, average, /*plain=*/true);
  if (count == 0) return;
  if (residual != nullptr) {  // here, in op order: the previous call on this group wrote it
    for (size_t i = 0; i < count; ++i) data[i] += residual[i];
  }
  if (everyPlain && comm.hierarchical()) {
    twoLevelCompressedAllreduce(comm, data, count, codec, average, residual);
  } else if (everyPlain) {
    plainCompressedAllreduce(comm, comm.ring(), data, count, codec, average ? comm.size() : 0,
                             residual);
  } else {  // the encoded form's rounds, which a plain rank among encoded ones follows
    CompressedAllreduce(comm, comm.ring(), data, nullptr, nullptr, count, codec,
                        average ? comm.size() : 0, residual)
        .run();
  }
}

std::string compressedAllreduceRoute(const Communicator& comm, size_t count, Codec codec) {
  const auto among = [&](int n, size_t elements) -> std::string {
    if (n == 2) return "pair";
    if (takesDirect(comm, n, encodedBytes(codec, elements))) return "direct";
    return n > 2 && comm.hostCount() > 1 ? "rounds, paced" : "rounds";
  };
  if (!comm.hierarchical()) return among(comm.size(), count);
  const SubRing& host = comm.hostRing();
  const ChunkLayout layout(count, host.size(), comm.segmentBytes(), sizeof(float));
  return "two-level, " + among(comm.crossRing().size(),
                               layout.chunkLength(static_cast<size_t>(host.pos)));
}

void compressedAllreduceEncoded(Communicator& comm, const void* encodedIn, void* encodedOut,
                                size_t count, Codec codec, bool average) {
  exchangeHeaders(comm, count, codec, average, /*plain=*/false);
  if (count > 0) {
    CompressedAllreduce(comm, comm.ring(), nullptr, static_cast<const char*>(encodedIn),
                        static_cast<char*>(encodedOut), count, codec, average ? comm.size() : 0,
                        nullptr)
        .run();
  }
}

}  // namespace ringdist
