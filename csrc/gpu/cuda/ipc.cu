#include "csrc/gpu/cuda/ipc.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "csrc/common/error.h"

namespace ringdist {
namespace cuda {

void check(cudaError_t err, const char* what) {
  RINGDIST_CHECK(err == cudaSuccess, "ringdist cuda: ", what, ": ", cudaGetErrorString(err));
}

DeviceScope::DeviceScope(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
}

DeviceScope::~DeviceScope() { (void)cudaSetDevice(previous_); }

namespace {

// A wait polls without sleeping this long first: most waits are for work of
// tens of microseconds, and a sleep costs ~60 us of timer slack; then it sleeps
// at most kMaxPoll between polls.
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kMaxPoll = std::chrono::microseconds(50);

}  // namespace

SharedBuffer::SharedBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
  DeviceScope scope(device_);
  check(cudaMalloc(&data_, bytes_), "cudaMalloc of the buffer shared with same-host ranks");
}

SharedBuffer::~SharedBuffer() {
  DeviceScope scope(device_);
  (void)cudaFree(data_);
}

BufferRecord SharedBuffer::record() const {
  DeviceScope scope(device_);
  cudaIpcMemHandle_t handle;
  check(cudaIpcGetMemHandle(&handle, data_), "cudaIpcGetMemHandle");
  BufferRecord record{};
  std::memcpy(record.handle, &handle, sizeof(handle));
  record.bytes = bytes_;
  record.valid = 1;
  return record;
}

MappedBuffer::MappedBuffer(int device, const BufferRecord& record) : device_(device) {
  DeviceScope scope(device_);
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, record.handle, sizeof(handle));
  check(cudaIpcOpenMemHandle(&data_, handle, cudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle of a same-host rank's buffer");
}

MappedBuffer::~MappedBuffer() {
  DeviceScope scope(device_);
  (void)cudaIpcCloseMemHandle(data_);
}

void copyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  }
}

StreamWaiter::StreamWaiter(int device) : device_(device) {
  DeviceScope scope(device_);
  check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
}

StreamWaiter::~StreamWaiter() {
  DeviceScope scope(device_);
  (void)cudaEventDestroy(event_);
}

void StreamWaiter::wait(cudaStream_t stream, std::chrono::steady_clock::time_point deadline,
                        const char* what) {
  check(cudaEventRecord(event_, stream), "cudaEventRecord");
  waitForEvent(event_, deadline, what);
}

void waitForEvent(cudaEvent_t event, std::chrono::steady_clock::time_point deadline,
                  const char* what) {
  const auto spinUntil = std::chrono::steady_clock::now() + kSpin;
  auto sleep = std::chrono::microseconds(1);
  while (true) {
    cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check(status, what);
    (void)cudaGetLastError();  // cudaErrorNotReady is not an error: clear it
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      throw TimeoutError(strCat("Timed out waiting for the GPU to ", what));
    }
    if (now < spinUntil) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kMaxPoll);
    }
  }
}

}  // namespace cuda
}  // namespace ringdist
