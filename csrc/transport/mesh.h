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
  std::vector<std::string> transportOf;             // by rank: "tcp", "shm" or "self"
};

// Connects this rank to every other rank of the group through the
// rendezvous. Each rank publishes its host identity and transport policy
// (RINGDIST_TRANSPORT=auto|tcp|shm); a pair on the same host uses shared
// memory unless either side asks for tcp, any other pair TCP. TCP: higher
// ranks dial lower ones and every connection proves it belongs to this
// group (a random per-group token published by rank 0). The ring visits the
// ranks of one host consecutively, so it crosses each host boundary once.
Mesh connectMesh(Rendezvous& rendezvous, int rank, int size, const MeshOptions& options);

// Identity of "the same host" for shared memory: hostname, boot id, the
// /dev/shm mount and the pid namespace must all match.
std::string hostIdentity();

}  // namespace ringdist
