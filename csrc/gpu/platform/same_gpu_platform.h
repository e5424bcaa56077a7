#pragma once

// What a device gives the same-GPU collectives (csrc/gpu/same_gpu.h): lending
// and mapping memory, the signal page, queues. The GPU's implementation
// (csrc/gpu/cuda/same_gpu.cu) and the CPU run of the protocol implement it, so
// this folder names nothing of the Communicator or the transports: it sits
// below csrc/gpu/cuda/ and csrc/collectives/ (docs/ARCHITECTURE.md, "Include
// rules").

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "csrc/gpu/platform/peer_memory.h"
#include "csrc/gpu/platform/stream_signals.h"

namespace ringdist {

class SameGpuPlatform : public PeerMemoryOpener {
 public:
  // Names the `bytes` at `data` for the leader; false, with the reason, when
  // the memory cannot be lent (memory from expandable segments has no IPC
  // handle): the call then goes through scratch().
  virtual bool lend(const void* data, size_t bytes, MemoryRecord* record, std::string* why) = 0;
  // Lendable memory of at least `bytes` of this rank (slot 0: inputs, 1:
  // outputs), kept for the platform's life.
  virtual void* scratch(int slot, size_t bytes) = 0;
  // Makes the signal page reachable from this rank's queue (`rank` owns
  // probe[rank] for a trial there).
  virtual void attach(SharedPage& page, int rank) = 0;
  virtual void detach(SharedPage& page) noexcept = 0;
  // 16 bytes naming the device (the GPU's UUID).
  virtual std::array<uint8_t, 16> deviceId() = 0;
  // Whether this rank's kernels can read and write memory of `device` (peer
  // access): ranks on several GPUs go this way only if every pair can.
  virtual bool reaches(const std::array<uint8_t, 16>& device) = 0;
};

}  // namespace ringdist
