#pragma once

// Single copy (glossary): ranks of one host copying straight between each
// other's buffers instead of through the shared-memory rings. A collective
// exchanges, with its headers, the address of the buffer each rank lends;
// then reads or writes peers' memory in pieces; then tells each peer it is
// done with its memory (exchangeDone) before any rank reuses its buffer.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "csrc/collectives/op_header.h"
#include "csrc/transport/channel.h"

namespace ringdist {

class Communicator;

class SingleCopy {
 public:
  // Whether every peer's channel copies peer memory is read from channels
  // (the communicator's, by rank); comm outlives this object.
  SingleCopy(Communicator& comm, const std::vector<std::unique_ptr<Channel>>& channels);

  // Every peer is on this host, and the host chose single copy at connect time.
  bool peersCopyable() const { return peersCopyable_; }
  // exchangeHeaders with each of peers both ways; our header is followed by
  // the address of the buffer we lend, and addresses[peer] (indexed by rank)
  // receives the one that follows each peer's header. `with` >= 0: addresses
  // go to and come from that peer only. The second form lends each peer its
  // own buffer, lentTo[peer] (indexed by rank).
  void exchangeHeadersAndAddresses(const OpHeader& mine, const std::vector<int>& peers,
                                   const void* lent, std::vector<uint64_t>* addresses, int with);
  void exchangeHeadersAndAddresses(const OpHeader& mine, const std::vector<int>& peers,
                                   const std::vector<const void*>& lentTo,
                                   std::vector<uint64_t>* addresses, int with);
  // Reads bytes at `from` in peer's memory into dst (write: src to `to` in
  // the peer's memory), in pieces, checking abort and the deadline between
  // them.
  void read(int peer, uint64_t from, void* dst, size_t bytes);
  void write(int peer, uint64_t to, const void* src, size_t bytes);
  // Tells each of `to` that we are done with its memory and waits until each
  // of `from` is done with ours (one byte each way).
  void exchangeDone(const std::vector<int>& to, const std::vector<int>& from);
  // Bytes copied from or into peers' memory so far (statistics).
  uint64_t bytes() const { return bytes_; }

 private:
  // read/write's loop: copy(done, piece) for each piece of at most
  // kSingleCopyPieceBytes, abort and deadline checked and links progressed
  // between pieces; counts the bytes in bytes_.
  template <typename Copy>
  void copyInPieces(size_t bytes, Copy copy);

  Communicator& comm_;
  bool peersCopyable_ = false;  // every peer's channel copiesPeerMemory()
  uint64_t bytes_ = 0;
};

}  // namespace ringdist
