#include "csrc/collectives/single_copy.h"

#include <algorithm>

#include "csrc/collectives/communicator.h"
#include "csrc/common/options.h"

namespace ringdist {

SingleCopy::SingleCopy(Communicator& comm, const std::vector<std::unique_ptr<Channel>>& channels)
    : comm_(comm) {
  const int size = comm.size();
  peersCopyable_ = size > 1;
  for (int p = 0; p < size; ++p) {
    const auto& ch = channels[static_cast<size_t>(p)];
    peersCopyable_ = peersCopyable_ && (p == comm.rank() || (ch && ch->copiesPeerMemory()));
  }
}

void SingleCopy::exchangeHeadersAndAddresses(const OpHeader& mine, const std::vector<int>& peers,
                                             const void* lent, std::vector<uint64_t>* addresses,
                                             int with) {
  exchangeHeadersAndAddresses(
      mine, peers, std::vector<const void*>(static_cast<size_t>(comm_.size()), lent), addresses,
      with);
}

void SingleCopy::exchangeHeadersAndAddresses(const OpHeader& mine, const std::vector<int>& peers,
                                             const std::vector<const void*>& lentTo,
                                             std::vector<uint64_t>* addresses, int with) {
  addresses->assign(static_cast<size_t>(comm_.size()), 0);
  std::vector<uint64_t> outgoing(peers.size());
  std::vector<OpHeader> in(peers.size());
  Communicator::Transfers sends, headers, trailers;
  for (size_t i = 0; i < peers.size(); ++i) {
    Channel& ch = comm_.channel(peers[i]);
    sends.emplace_back(&ch, ch.postSend(&mine, sizeof(OpHeader)));
    headers.emplace_back(&ch, ch.postRecv(&in[i], sizeof(OpHeader)));
    if (with < 0 || with == peers[i]) {
      outgoing[i] = reinterpret_cast<uint64_t>(lentTo[static_cast<size_t>(peers[i])]);
      sends.emplace_back(&ch, ch.postSend(&outgoing[i], sizeof(outgoing[i])));
      auto* at = &(*addresses)[static_cast<size_t>(peers[i])];
      trailers.emplace_back(&ch, ch.postRecv(at, sizeof(*at)));
    }
  }
  // The headers first: a peer in another operation sends no address.
  comm_.waitAll({}, headers);
  comm_.checkHeaders(mine, peers, in, nullptr);
  comm_.waitAll(sends, trailers);
}

template <typename Copy>
void SingleCopy::copyInPieces(size_t bytes, Copy copy) {
  for (size_t done = 0; done < bytes;) {
    comm_.throwIfStopped();
    const size_t piece = std::min(bytes - done, kSingleCopyPieceBytes);
    copy(done, piece);
    done += piece;
    comm_.progress();  // keep the other links moving between pieces
  }
  bytes_ += bytes;
}

void SingleCopy::read(int peer, uint64_t from, void* dst, size_t bytes) {
  Channel& ch = comm_.channel(peer);
  copyInPieces(bytes, [&](size_t done, size_t piece) {
    ch.readPeerMemory(from + done, static_cast<char*>(dst) + done, piece);
  });
}

void SingleCopy::write(int peer, uint64_t to, const void* src, size_t bytes) {
  Channel& ch = comm_.channel(peer);
  copyInPieces(bytes, [&](size_t done, size_t piece) {
    ch.writePeerMemory(to + done, static_cast<const char*>(src) + done, piece);
  });
}

void SingleCopy::exchangeDone(const std::vector<int>& to, const std::vector<int>& from) {
  static const uint8_t kDone = 1;
  std::vector<uint8_t> got(from.size());
  Communicator::Transfers sends, recvs;
  for (int peer : to) {
    sends.emplace_back(&comm_.channel(peer), comm_.channel(peer).postSend(&kDone, 1));
  }
  for (size_t i = 0; i < from.size(); ++i) {
    recvs.emplace_back(&comm_.channel(from[i]), comm_.channel(from[i]).postRecv(&got[i], 1));
  }
  comm_.waitAll(sends, recvs);
}

}  // namespace ringdist
