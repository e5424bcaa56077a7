#pragma once

#include <memory>
#include <vector>

#include "csrc/common/options.h"
#include "csrc/common/rendezvous.h"
#include "csrc/transport/channel.h"
#include "csrc/transport/tcp/socket.h"

namespace ringdist {
namespace tcp {

// Wire version of the handshake and of everything after it (records, op
// headers); ranks that speak different versions refuse each other at connect
// time.
constexpr uint32_t kProtocolVersion = 9;

// Connects a TCP link to every rank r with wanted[r]; returns the channels by
// rank (null elsewhere). Each rank listens on options.bindIp (never a
// wildcard address) and publishes ip:port in the rendezvous; higher ranks
// dial lower ones.
//
// The handshake is mutual: each side proves it holds the proof key, an
// HMAC-SHA256 key from the user's secret (RINGDIST_SECRET or
// RINGDIST_SECRET_FILE, given out of band) salted with a random group secret
// rank 0 publishes in the store (which only keeps concurrent jobs apart:
// the store is plaintext). Each side brings an ephemeral X25519 key:
//   acceptor -> dialer   Challenge {magic, version, acceptor rank, flags, nonceA, keyA}
//   dialer -> acceptor   Hello {magic, version, rank, size, flags, nonceD, keyD,
//                               HMAC(proof key, "hello", challenge | hello before its MAC)}
//   acceptor -> dialer   Ack {magic, HMAC(proof key, "ack", the same transcript)}
// (flags: the settings both ends must share, RINGDIST_TCP_ENCRYPT and RINGDIST_CRC; a proven
// hello whose flags differ fails the connect on both ranks, naming the setting). A hello whose MAC
// fails is answered with a refusal, so a rank given another secret fails at
// once, naming the secret. The link's two keys, one per direction, are
// HKDF-SHA256 of the X25519 secret, salted with the proof key, bound to the
// transcript (records.h seals with them). Without a user secret the proof key
// is the group secret's alone: links are encrypted against eavesdroppers, but
// whoever reads the store could join; ringdist says so once.
// Anything else (garbage, wrong secret, replays, duplicate or absurd ranks,
// silent clients) is dropped and logged, served concurrently so it cannot
// delay real peers; the job is unaffected.
// With `door`, the listener stays open after the connect, in a Door (below) whose addresses
// the caller fills in.
struct Door;
std::vector<std::unique_ptr<Channel>> connectAll(Rendezvous& rendezvous, int rank, int size,
                                                 const MeshOptions& options,
                                                 const std::vector<bool>& wanted,
                                                 std::shared_ptr<Door>* door = nullptr);

// A rank's listener kept open for its group's life, with what a later connect of some of the
// group's ranks needs without the store: every rank's address and the group's proof key. A
// shrink connects the survivors through their doors (reconnect), and a connect refused at a
// rank's door proves its process gone while its host is up (goneBehind).
struct Door {
  std::shared_ptr<const Socket> listener;  // shared by the groups a shrink derives
  Address self;                            // where it listens
  SocketTuning tuning;
  std::vector<uint8_t> key;            // of the group's handshake proofs
  std::vector<Address> addresses;      // every rank's door, by rank
};

// Connects `members` (ranks of `door`'s group, in their new order; this rank is
// members[rank]) to each other through their doors, with the handshake above under a proof
// key derived from the group's and `label` (the same on every member, another for each new
// group: a rank given another label, or left out, cannot join). No store round trip: the
// connects and handshakes alone. `kept` (by new rank; null where none): the old group's
// links to members, open and sealed (Channel::keepable), which stay the group's once both
// ends fenced them under a digest of the new key; a pair whose fence fails (the peer closed
// its end) connects afresh, as do pairs without a kept link. Returns the channels by new
// rank and the new group's door.
std::vector<std::unique_ptr<Channel>> reconnect(const Door& door, const std::vector<int>& members,
                                                int rank, const std::string& label,
                                                const MeshOptions& options,
                                                std::shared_ptr<Door>* newDoor,
                                                std::vector<std::unique_ptr<Channel>> kept);

// The ranks among `peers` whose door refused a connect within `limit` (see connectsRefused).
std::vector<int> goneBehind(const Door& door, const std::vector<int>& peers,
                            std::chrono::milliseconds limit);

// Says once per process that peers are not authenticated (no user secret), or
// not even sealed. The mesh calls it where that matters: a peer stays on TCP,
// or the listener was reachable from other hosts during the handshakes.
void warnOnceIfUnauthenticated(const TcpSecurity& security);

}  // namespace tcp
}  // namespace ringdist
