#pragma once

// Memory of other processes on the same GPU, mapped lazily and cached: a rank
// names the tensor it lends as (handle of the allocation that holds it,
// offset), the way torch.multiprocessing shares CUDA storages, and the rank
// that maps it keeps one mapping per allocation for later calls.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <string>

namespace ringdist {

// Travels between ranks as bytes.
struct MemoryRecord {
  uint8_t handle[64];        // names the allocation (cudaIpcMemHandle_t on a GPU)
  uint64_t offset;           // of the lent bytes within the allocation
  uint64_t allocationBytes;  // the allocation's size
  uint64_t valid;            // 0: this rank's memory cannot be lent (see SameGpuPlatform)
};

// What a device send tells its receiver (through the host's point-to-point
// path, as the message's payload: p2p.h): where the data is, and which message
// of the pair it is (stream_signals.h).
struct DeviceMessage {
  uint64_t magic;
  MemoryRecord data;  // invalid for no bytes
  uint64_t bytes;
  uint32_t dtype;     // a DataType
  uint32_t index;     // k: the pair's message number
};

// Opens and closes peers' allocations (CUDA IPC in production, named shared
// memory in the CPU run of the protocol).
class PeerMemoryOpener {
 public:
  virtual ~PeerMemoryOpener() = default;
  // The allocation's base in this process; throws Error.
  virtual void* open(const MemoryRecord& record) = 0;
  virtual void close(void* base) noexcept = 0;
};

class PeerMemoryCache {
 public:
  // capacity: mappings kept open beyond those still in use.
  PeerMemoryCache(PeerMemoryOpener& opener, size_t capacity);
  ~PeerMemoryCache();
  PeerMemoryCache(const PeerMemoryCache&) = delete;
  PeerMemoryCache& operator=(const PeerMemoryCache&) = delete;

  // The record's bytes in this process, opening the allocation on first use;
  // `seq` is the operation that uses it (the mapping stays open until then).
  char* map(const MemoryRecord& record, uint32_t seq);
  // Closes the least recently used mappings beyond capacity whose last
  // operation finished(seq) says is over.
  void trim(const std::function<bool(uint32_t)>& finished);

  size_t size() const { return entries_.size(); }
  uint64_t opens() const { return opens_; }

 private:
  struct Entry {
    std::array<uint8_t, 64> handle;
    void* base;
    uint32_t lastSeq;
  };
  PeerMemoryOpener& opener_;
  size_t capacity_;
  std::list<Entry> entries_;  // most recently used first
  uint64_t opens_ = 0;
};

}  // namespace ringdist
