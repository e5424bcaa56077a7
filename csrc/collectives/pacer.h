#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "csrc/collectives/communicator.h"

namespace ringdist {

// Pacing of the compressed allreduce when the group spans hosts (see
// compressed_allreduce.cc for rounds and chunks). A round's chunk leaves only
// once (1) its receiver said "go" and (2) our previous round has drained
// from the TCP send queue; a receiver says go once all but the last
// kEarlyGoBytes of its current round arrived. So each host link carries one
// transfer at a time: all pairs at once made three or more TCP streams
// converge on each host's link and a shallow switch queue dropped thousands
// of segments per step (measurements: benchmarks/notes/compressed_pacing.md).
//
// A go is the 8-byte round number; round N stands for the allgather.
class Pacer {
 public:
  // ownEncodedBytes: the encoding of this rank's own chunk (the early go is
  // measured against it). lastSend[peer]: the ticket of our latest send to
  // peer, shared with the collective (the pacer adds its gos to it).
  Pacer(Communicator& comm, int rounds, size_t ownEncodedBytes, std::vector<uint64_t>& lastSend);

  // Queues the receive of `peer`'s go for `round`, in the peer's send order.
  void expectGo(int peer, int round);
  // Sends our go for `round` to `peer`.
  void sendGo(int peer, int round);
  // Waits until `to` said go for `round` and our sends to `previous` (-1:
  // none) have left its send queue, up to kRoundOverlapBytes.
  void waitForTurn(int to, int round, int previous);
  // True if bytes at encoded offset `offset` of our own chunk lie in the
  // last kEarlyGoBytes: a go need not wait for them.
  bool inTail(size_t offset) const { return offset + kEarlyGoBytes > ownEncodedBytes_; }

 private:
  // A round starts once the previous round's bytes have (nearly) reached
  // their receiver: "sent" only means the kernel took them, and a TCP send
  // queue can hold tens of ms of a slow link.
  static constexpr size_t kRoundOverlapBytes = 64 * 1024;
  // No fd signals a draining send queue: poll it this often.
  static constexpr std::chrono::microseconds kDrainPoll{200};
  // The go crosses the reverse link's queue (up to ~2 ms behind data), so
  // sent this early the next stream starts about when the current one ends.
  static constexpr size_t kEarlyGoBytes = 128 * 1024;

  bool goArrived(int peer, int round);
  bool drained(int peer);

  Communicator& comm_;
  const size_t ownEncodedBytes_;
  std::vector<uint64_t>& lastSend_;
  std::vector<uint64_t> goOut_;     // by round: the value we send
  std::vector<uint64_t> goIn_;      // by round: what arrived
  std::vector<uint64_t> goTicket_;  // by round: the receive's ticket
};

}  // namespace ringdist
