#include "csrc/collectives/pacer.h"

#include "csrc/common/error.h"

namespace ringdist {

Pacer::Pacer(Communicator& comm, int rounds, size_t ownEncodedBytes,
             std::vector<uint64_t>& lastSend)
    : comm_(comm),
      ownEncodedBytes_(ownEncodedBytes),
      lastSend_(lastSend),
      goOut_(static_cast<size_t>(rounds) + 1),
      goIn_(static_cast<size_t>(rounds) + 1),
      goTicket_(static_cast<size_t>(rounds) + 1, 0) {
  for (size_t k = 0; k < goOut_.size(); ++k) goOut_[k] = k;
}

void Pacer::expectGo(int peer, int round) {
  const auto r = static_cast<size_t>(round);
  goTicket_[r] = comm_.channel(peer).postRecv(&goIn_[r], sizeof(uint64_t));
}

void Pacer::sendGo(int peer, int round) {
  lastSend_[static_cast<size_t>(peer)] =
      comm_.channel(peer).postSend(&goOut_[static_cast<size_t>(round)], sizeof(uint64_t));
  comm_.progress();
}

void Pacer::waitForTurn(int to, int round, int previous) {
  comm_.waitUntil([&] { return goArrived(to, round) && (previous < 0 || drained(previous)); },
                  kDrainPoll);
}

bool Pacer::goArrived(int peer, int round) {
  const auto r = static_cast<size_t>(round);
  if (!comm_.channel(peer).recvDone(goTicket_[r])) return false;
  RINGDIST_CHECK(goIn_[r] == r, "ringdist ", comm_.opName(), ": rank ", comm_.rank(), ": rank ",
                 peer, " sent go for round ", goIn_[r], " where round ", round, " was due");
  return true;
}

bool Pacer::drained(int peer) {
  const uint64_t t = lastSend_[static_cast<size_t>(peer)];
  Channel& ch = comm_.channel(peer);
  return (t == 0 || ch.sendDone(t)) && ch.unacknowledgedBytes() <= kRoundOverlapBytes;
}

}  // namespace ringdist
