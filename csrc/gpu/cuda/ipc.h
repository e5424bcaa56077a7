#pragma once

// Device memory shared between processes of one host through CUDA IPC, and
// the host-side waits around it. Built only with CUDA (RINGDIST_CUDA).

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ringdist {
namespace cuda {

// Throws Error ("ringdist cuda: <what>: <CUDA's message>") unless err is cudaSuccess.
void check(cudaError_t err, const char* what);

// Runs with `device` current and restores the caller's device afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// What a peer needs to map a SharedBuffer. Travels between ranks as bytes.
struct BufferRecord {
  uint8_t handle[64];  // cudaIpcMemHandle_t
  uint64_t bytes;      // the buffer's size (as asked for, even if allocation failed)
  uint64_t valid;      // 0: this rank has no buffer
};
static_assert(sizeof(cudaIpcMemHandle_t) == 64, "BufferRecord holds a cudaIpcMemHandle_t");

// Device memory of this process that other processes on the host can map.
class SharedBuffer {
 public:
  SharedBuffer(int device, size_t bytes);  // throws Error
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  void* data() const { return data_; }
  BufferRecord record() const;

 private:
  int device_;
  size_t bytes_;
  void* data_ = nullptr;
};

// A peer's SharedBuffer mapped into this process, on `device` (the same GPU,
// or one with peer access to it).
class MappedBuffer {
 public:
  MappedBuffer(int device, const BufferRecord& record);  // throws Error
  ~MappedBuffer();
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  void* data() const { return data_; }

 private:
  int device_;
  void* data_ = nullptr;
};

// dst = src (bytes), device or pinned host memory, queued on stream.
void copyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// Host-side wait, bounded by a deadline, for a recorded event (polls it:
// yields, then sleeps longer and longer). Throws TimeoutError naming `what`.
void waitForEvent(cudaEvent_t event, std::chrono::steady_clock::time_point deadline,
                  const char* what);

// Host-side wait, bounded by a deadline, for everything a stream has queued
// so far (polls an event; never an unbounded cudaStreamSynchronize).
class StreamWaiter {
 public:
  explicit StreamWaiter(int device);
  ~StreamWaiter();
  StreamWaiter(const StreamWaiter&) = delete;
  StreamWaiter& operator=(const StreamWaiter&) = delete;
  // Throws TimeoutError naming `what` once the deadline passed.
  void wait(cudaStream_t stream, std::chrono::steady_clock::time_point deadline,
            const char* what);

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace cuda
}  // namespace ringdist
