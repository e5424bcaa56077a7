#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "csrc/common/options.h"
#include "csrc/common/rendezvous.h"
#include "csrc/transport/board.h"
#include "csrc/transport/channel.h"
#include "csrc/transport/host_identity.h"

namespace ringdist {

namespace tcp {
struct Door;
}

struct Mesh {
  std::vector<std::unique_ptr<Channel>> channels;  // by rank; null for self
  std::vector<int> ring;                            // ranks in ring order
  std::vector<int> hostOf;                          // by rank: host index, numbered in ring order
  std::vector<std::string> transportOf;             // by rank: "tcp", "shm" or "self"
  SameHostCopy sameHostCopy;                        // this host's ranks, over shared memory
  std::shared_ptr<Board> board;  // every rank on this host over shared memory, else null
  // The longest round trip of any TCP link of the group, measured at connect
  // (microseconds; the same on every rank): what the collectives size the
  // data they keep in flight by.
  uint32_t roundTripUs = 0;
  // The smallest window one TCP stream of the group's ranks can open (PeerRecord::windowBytes;
  // 0: unknown): with the round trip, it sets the lanes.
  uint64_t windowBytes = 0;
  // More TCP connections to each peer on another host, when the links are long and one
  // stream's window is short of them (lanes - 1 per such peer, each Channel knowing its peer);
  // empty otherwise.
  std::vector<std::unique_ptr<Channel>> lanes;
  // This rank's kept listener (null in a group of one), and every rank's record: what a
  // shrink reconnects the survivors with (reconnectMesh).
  std::shared_ptr<tcp::Door> door;
  std::vector<PeerRecord> records;
};

// Connects this rank to every other rank of the group through the
// rendezvous, in stages: an authenticated TCP link to every peer
// (tcp/handshake.h), then every rank publishes its host identity and
// transport policy (host_identity.h) and a pair on the same host moves to
// shared memory (shm/connect.h) unless either side asks for TCP. The ring
// visits the ranks of one host consecutively, so it crosses each host
// boundary once.
Mesh connectMesh(Rendezvous& rendezvous, int rank, int size, const MeshOptions& options);

// The mesh of `members` (ranks of the group whose mesh had `door` and `records`, in their new
// order; this rank is members[rank]): their TCP links through the doors, under a proof key
// derived with `label` (tcp::reconnect), the records as they were, and the stages after as in
// connectMesh (shared memory, lanes: through `rendezvous`, which must be the new group's own).
// `kept` (by new rank, null where none): the old group's links that may stay (tcp::reconnect).
Mesh reconnectMesh(Rendezvous& rendezvous, const tcp::Door& door,
                   const std::vector<PeerRecord>& records, const std::vector<int>& members,
                   int rank, const std::string& label, const MeshOptions& options,
                   std::vector<std::unique_ptr<Channel>> kept);

// The ranks among `peers` (on TCP) whose host refused a connect at their door within `limit`:
// their processes are gone (tcp::goneBehind).
std::vector<int> goneAtDoors(const tcp::Door& door, const std::vector<int>& peers,
                             std::chrono::milliseconds limit);

// The address a rank listens on, never a wildcard: the address of interface
// `ifname` when given, else the local address that routes to `storeHost`
// (so peers on other hosts can reach it), loopback when the store is local
// or unknown.
std::string chooseListenAddress(const std::string& ifname, const std::string& storeHost);

}  // namespace ringdist
