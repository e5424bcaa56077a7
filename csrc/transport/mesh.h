#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "csrc/common/rendezvous.h"
#include "csrc/transport/channel.h"

namespace ringdist {

struct MeshOptions {
  std::string bindIp;                 // TCP listens here; never a wildcard address
  std::chrono::milliseconds timeout;  // for the whole connect phase
};

struct Mesh {
  std::vector<std::unique_ptr<Channel>> channels;  // by rank; null for self
  std::vector<int> ring;                            // ranks in ring order
  std::vector<int> hostOf;                          // by rank: host index, numbered in ring order
  std::vector<std::string> transportOf;             // by rank: "tcp", "shm" or "self"
};

// Connects this rank to every other rank of the group through the
// rendezvous, in two stages: first an authenticated TCP link to every peer
// (mutual HMAC-SHA256 challenge-response keyed with a random per-group
// secret rank 0 publishes; see mesh.cc), then every rank publishes its host
// identity and transport policy (RINGDIST_TRANSPORT=auto|tcp|shm) and a pair
// on the same host moves to shared memory unless either side asks for tcp.
// The ring visits the ranks of one host consecutively, so it crosses each
// host boundary once.
Mesh connectMesh(Rendezvous& rendezvous, int rank, int size, const MeshOptions& options);

// Identity of "the same host" for shared memory: hostname, boot id, the
// /dev/shm mount and the pid namespace must all match.
std::string hostIdentity();
// hostIdentity(), refined by RINGDIST_HOST_ID when set (tests).
std::string hostIdentityOf(int rank, int size);

}  // namespace ringdist
