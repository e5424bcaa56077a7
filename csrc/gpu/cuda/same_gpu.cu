#include "csrc/gpu/cuda/same_gpu.h"

#include <cuda.h>  // the driver's types and constants only: its functions come through entry points

#include <algorithm>
#include <cstring>

#include "csrc/common/error.h"
#include "csrc/gpu/cuda/ipc.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {
namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;  // over all spans; larger spans loop in the kernel

// The driver functions the hand-offs use, resolved once.
struct Driver {
  CUresult (*waitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*writeValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*addressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
};

template <typename Fn>
void resolve(const char* symbol, Fn* fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  // 12000: the CUDA 12 ABI of each symbol (cuStreamWaitValue32 is its _v2).
  check(cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found),
        symbol);
  RINGDIST_CHECK(found == cudaDriverEntryPointSuccess && address != nullptr,
                 "ringdist cuda: the driver has no ", symbol);
  *fn = reinterpret_cast<Fn>(address);
}

const Driver& driver() {
  static const Driver resolved = [] {
    Driver d;
    resolve("cuStreamWaitValue32", &d.waitValue32);
    resolve("cuStreamWriteValue32", &d.writeValue32);
    resolve("cuMemGetAddressRange", &d.addressRange);
    return d;
  }();
  return resolved;
}

void checkDriver(CUresult result, const char* what) {
  RINGDIST_CHECK(result == CUDA_SUCCESS, "ringdist cuda: ", what, " failed (CUresult ",
                 static_cast<int>(result), ")");
}

// The group's abort word lives in host memory (the host sets it); read by every
// thread of the fused kernel it would cost a read across the bus per thread (the
// H200 run: about 32 ns each, 34 ms for a 16 MiB allreduce). One thread copies it
// to device memory first. The latch only ever goes from 0 to 1, as the word does,
// so queues of the group sharing it cannot undo one another's abort.
__global__ void latchAbort(const volatile uint32_t* word, uint32_t* latch) {
  if (*word != 0) *latch = 1;
}

template <typename T, typename Op>
__global__ void fusedKernel(FusedArgs args) {
  if (*args.abort != 0) return;  // the group failed: release the streams, touch nothing
  const FusedSpan& span = args.spans[blockIdx.y];
  fusedSpan<T, Op>(args, span, static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                   static_cast<uint64_t>(gridDim.x) * blockDim.x);
}

}  // namespace

void fusedPass(const FusedArgs& hostArgs, uint32_t* latch, DataType dtype, ReduceOp op,
               cudaStream_t stream) {
  uint64_t longest = 0;
  for (int s = 0; s < hostArgs.spanCount; ++s) longest = std::max(longest, hostArgs.spans[s].length);
  if (longest == 0) return;
  latchAbort<<<1, 1, 0, stream>>>(hostArgs.abort, latch);
  check(cudaGetLastError(), "launch of the same-GPU abort latch");
  FusedArgs args = hostArgs;
  args.abort = latch;
  visitReduction(dtype, op, [&](auto elementTag, auto opTag) {
    using T = typename decltype(elementTag)::type;
    using Op = typename decltype(opTag)::type;
    using S = typename elementwise::Storage<T>::type;
    const uint64_t perThread = sizeof(FusedVector) / sizeof(S);
    const uint64_t threads = (longest + perThread - 1) / perThread;
    const unsigned cap = std::max(1u, kMaxBlocks / static_cast<unsigned>(args.spanCount));
    const unsigned blocks = static_cast<unsigned>(
        std::min<uint64_t>(cap, (threads + kThreads - 1) / kThreads));
    fusedKernel<T, Op><<<dim3(blocks, static_cast<unsigned>(args.spanCount)), kThreads, 0, stream>>>(
        args);
  });
  check(cudaGetLastError(), "launch of the fused same-GPU kernel");
}

// ---------------------------------------------------------------- the queue

class SameGpuDevice::StreamQueue final : public SignalQueue {
 public:
  StreamQueue(const SameGpuDevice& owner, cudaStream_t stream) : owner_(owner), stream_(stream) {}

  void write(SignalWord* word, uint32_t value) override {
    // The default flags put a memory barrier before the write: everything the
    // stream did before is visible to whoever sees the value.
    checkDriver(driver().writeValue32(stream_, deviceAddress(word), value, 0),
                "cuStreamWriteValue32");
  }
  void waitFor(SignalWord* word, uint32_t value) override {
    checkDriver(driver().waitValue32(stream_, deviceAddress(word), value, CU_STREAM_WAIT_VALUE_GEQ),
                "cuStreamWaitValue32");
  }
  void combine(const FusedArgs& args, DataType dtype, ReduceOp op) override {
    FusedArgs onDevice = args;
    onDevice.abort = reinterpret_cast<const volatile uint32_t*>(
        owner_.pageDevice_ + (reinterpret_cast<const char*>(const_cast<const uint32_t*>(args.abort)) -
                              owner_.pageHost_));
    fusedPass(onDevice, owner_.abortLatch_, dtype, op, stream_);
  }
  void copy(void* dst, const void* src, size_t bytes) override { copyAsync(dst, src, bytes, stream_); }

 private:
  CUdeviceptr deviceAddress(SignalWord* word) const {
    return reinterpret_cast<CUdeviceptr>(owner_.pageDevice_ +
                                         (reinterpret_cast<char*>(word) - owner_.pageHost_));
  }
  const SameGpuDevice& owner_;
  cudaStream_t stream_;
};

// ---------------------------------------------------------------- the platform

SameGpuDevice::SameGpuDevice(int device) : device_(device) {}

SameGpuDevice::~SameGpuDevice() {
  DeviceScope scope(device_);
  for (auto& slot : scratch_) {
    for (auto& [data, bytes] : slot) (void)cudaFree(data);
  }
}

void* SameGpuDevice::scratch(int slot, size_t bytes) {
  auto& held = scratch_[slot];
  if (held.empty() || held.back().second < bytes) {
    DeviceScope scope(device_);
    const size_t grown = std::max(bytes, held.empty() ? size_t{0} : 2 * held.back().second);
    void* data = nullptr;
    check(cudaMalloc(&data, grown), "cudaMalloc of same-GPU scratch memory");
    held.emplace_back(data, grown);
  }
  return held.back().first;
}

bool SameGpuDevice::lend(const void* data, size_t bytes, MemoryRecord* record, std::string* why) {
  (void)bytes;
  DeviceScope scope(device_);
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult range = driver().addressRange(&base, &size, reinterpret_cast<CUdeviceptr>(data));
  if (range != CUDA_SUCCESS) {
    *why = strCat("cuMemGetAddressRange failed (CUresult ", static_cast<int>(range), ")");
    return false;
  }
  cudaIpcMemHandle_t handle;
  const cudaError_t err = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *why = strCat("cudaIpcGetMemHandle: ", cudaGetErrorString(err),
                  "; memory from expandable segments or a cudaMallocAsync pool has no legacy "
                  "IPC handle");
    return false;
  }
  std::memcpy(record->handle, &handle, sizeof(handle));
  record->offset = reinterpret_cast<uint64_t>(data) - static_cast<uint64_t>(base);
  record->allocationBytes = size;
  return true;
}

void* SameGpuDevice::open(const MemoryRecord& record) {
  DeviceScope scope(device_);
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, record.handle, sizeof(handle));
  void* base = nullptr;
  check(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle of a rank's tensor on the same GPU");
  return base;
}

void SameGpuDevice::close(void* base) noexcept {
  DeviceScope scope(device_);
  (void)cudaIpcCloseMemHandle(base);
}

void SameGpuDevice::attach(SharedPage& page, int rank) {
  DeviceScope scope(device_);
  driver();  // the stream memory operations exist, or this group takes the staged path
  void* host = page.signals();
  check(cudaHostRegister(host, page.bytes(), cudaHostRegisterMapped | cudaHostRegisterPortable),
        "cudaHostRegister of the signal page");
  void* device = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&device, host, 0);
  if (err != cudaSuccess) {
    (void)cudaHostUnregister(host);
    check(err, "cudaHostGetDevicePointer of the signal page");
  }
  pageHost_ = static_cast<char*>(host);
  pageDevice_ = static_cast<char*>(device);
  try {
    check(cudaMalloc(&abortLatch_, sizeof(uint32_t)), "cudaMalloc of the abort latch");
    check(cudaMemset(abortLatch_, 0, sizeof(uint32_t)), "cudaMemset of the abort latch");
    probe(page, rank);
  } catch (const Error&) {
    detach(page);
    throw;
  }
}

void SameGpuDevice::probe(SharedPage& page, int rank) {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // This rank's own word: the ranks attach at the same time.
  SignalWord* word = &page.signals()->probe[rank];
  StreamQueue queue(*this, stream);
  try {
    const uint32_t next = word->value.load() + 1;
    queue.write(word, next);
    queue.waitFor(word, next);
    StreamWaiter(device_).wait(stream, std::chrono::steady_clock::now() + std::chrono::seconds(10),
                               "run a trial of the stream memory operations");
  } catch (const Error&) {
    (void)cudaStreamDestroy(stream);
    throw;
  }
  (void)cudaStreamDestroy(stream);
}

void SameGpuDevice::detach(SharedPage& page) noexcept {
  if (pageHost_ == nullptr) return;
  DeviceScope scope(device_);
  (void)cudaHostUnregister(page.signals());
  if (abortLatch_ != nullptr) (void)cudaFree(abortLatch_);
  abortLatch_ = nullptr;
  pageHost_ = pageDevice_ = nullptr;
}

std::array<uint8_t, 16> SameGpuDevice::deviceId() {
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device_), "cudaGetDeviceProperties");
  std::array<uint8_t, 16> id{};
  std::memcpy(id.data(), &properties.uuid, id.size());
  return id;
}

bool SameGpuDevice::reaches(const std::array<uint8_t, 16>& device) {
  // The GPU of that UUID among this process's visible ones, and peer access to it.
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  for (int other = 0; other < count; ++other) {
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, other), "cudaGetDeviceProperties");
    if (std::memcmp(&properties.uuid, device.data(), device.size()) != 0) continue;
    int can = 0;
    check(cudaDeviceCanAccessPeer(&can, device_, other), "cudaDeviceCanAccessPeer");
    return can != 0;
  }
  return false;  // not visible here (CUDA_VISIBLE_DEVICES): no mapping either
}

std::unique_ptr<SignalQueue> SameGpuDevice::queueOn(cudaStream_t stream) {
  return std::make_unique<StreamQueue>(*this, stream);
}

}  // namespace cuda
}  // namespace ringdist
