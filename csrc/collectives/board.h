#pragma once

// The board's protocol (glossary: board). Each rank's area holds the number
// (seq) of the last collective it published and, by that number's parity, its
// header and up to kBoardDataBytes of data. Every collective publishes its
// header there, so a rank that takes the board for a small operation meets a
// peer that took another path as a header mismatch, not a timeout.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "csrc/collectives/op_header.h"
#include "csrc/transport/board.h"

namespace ringdist {

class Communicator;
class Waiter;

// Data of a small operation published on the board (BoardProtocol::publish),
// at most this many bytes; the allreduce takes that way up to it.
constexpr size_t kBoardDataBytes = 4 << 10;

class BoardProtocol {
 public:
  // board: every rank on this host over shared memory (Mesh::board), else
  // null. comm and waiter outlive this object.
  BoardProtocol(Communicator& comm, Waiter& waiter, std::shared_ptr<Board> board);

  bool exists() const { return board_ != nullptr; }
  // Publishes `header` with `bytes` of `data` (waiting, bounded, until every
  // peer published the one before, so that no one still reads the entry this
  // overwrites) and wakes the peers that sleep.
  // Returns where our data sits on the board.
  const char* publish(const OpHeader& header, const void* data, size_t bytes);
  // The data `peer` published with the collective `mine` (waits, bounded,
  // until it published it), after checking its header against ours.
  const char* published(int peer, const OpHeader& mine);

  // The header `peer` published last (seq 0 before its first collective); teardown
  // reads it to see a peer waiting in a collective this rank never joined.
  OpHeader lastPublished(int peer) const;

  // The peer a wait is for, else -1 (named when the wait times out).
  int waitsFor() const { return waitsFor_; }
  // Bytes we published and read so far (statistics).
  uint64_t bytesPublished() const { return bytesPublished_; }
  uint64_t bytesRead() const { return bytesRead_; }

 private:
  // Until peer's board area has published at least `seq` (peers ring our
  // doorbell when they publish); deadline, abort and the peer's liveness
  // checked.
  void waitForPublished(int peer, uint64_t seq);

  Communicator& comm_;
  Waiter& waiter_;
  std::shared_ptr<Board> board_;
  int waitsFor_ = -1;
  uint64_t bytesPublished_ = 0;
  uint64_t bytesRead_ = 0;
};

}  // namespace ringdist
