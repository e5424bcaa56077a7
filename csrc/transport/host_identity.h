#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "csrc/common/options.h"

namespace ringdist {

// "The same host" for shared memory: hostname, boot id, the /dev/shm mount
// and the pid namespace must all match (and the test label, when set).
struct HostIdentity {
  std::string hostname;
  std::string bootId;
  std::string shmMount;      // device:inode of /dev/shm, or "none"
  std::string pidNamespace;  // target of /proc/self/ns/pid
  std::string label;         // MeshOptions::hostLabel: refines, never replaces, the rest

  static HostIdentity detect(const std::string& label);
  bool operator==(const HostIdentity& other) const;
  bool operator!=(const HostIdentity& other) const { return !(*this == other); }
};

// What each rank sends its peers once connected, before transports are chosen.
struct PeerRecord {
  HostIdentity host;
  TransportPolicy transport = TransportPolicy::kAuto;
  // The longest of this rank's TCP links' round trips, measured at connect
  // (Channel::roundTripUs), microseconds.
  uint32_t roundTripUs = 0;
  // The address of the listener the rank keeps open (tcp::Door), "ip:port"; empty if none.
  std::string door;
  // The window one of its TCP streams can open (tcp::streamWindowBytes), bytes; 0 if unknown.
  uint64_t windowBytes = 0;

  std::vector<uint8_t> encode() const;
  // Throws, naming `rank`, on a record that is not one of ours.
  static PeerRecord decode(const std::vector<uint8_t>& bytes, int rank);
};

// How the ranks of one host copy large buffers between them, and why: chosen
// when they connect over shared memory (shm/connect.h), reported by the mesh
// (mesh.h), so it sits here, where neither names the other.
struct SameHostCopy {
  bool singleCopy = false;  // straight between buffers (process_vm_readv/writev), else the rings
  std::string why;
  // The copy probe's figures, summed over the host's ranks (0: not measured).
  double kernelCopyUs = 0;
  double ringCopyUs = 0;
};

}  // namespace ringdist
