#pragma once

// ringdist from C++ (LibTorch): the backend torch.distributed knows as
// "ringdist", without Python. torch has no C++ registry of backends and no C++
// init_process_group: these functions make the group, and the collectives are
// c10d's own calls on it, e.g.
//
//   auto group = torch_ringdist::init();              // torchrun, mpirun or by hand
//   std::vector<at::Tensor> tensors{t};
//   group->allreduce(tensors)->wait();
//   torch_ringdist::shutdown(group);
//
// Errors are c10::Error (c10::DistBackendError for the group's failures) with
// the messages Python users see.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "torch_ringdist/export.h"

namespace torch_ringdist {

// torch's default for a group's operations and its connection (30 minutes).
constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(30);

// ---------------------------------------------------------------- groups

// The backend init_process_group("ringdist") makes: rank `rank` of `size`
// ranks that meet through `store` (give each group its own keys, e.g. with a
// c10d::PrefixStore). Settings come from the RINGDIST_* environment variables,
// as in Python. It listens on RINGDIST_SOCKET_IFNAME's address if set, else on
// the local address that routes to the store's host (MASTER_ADDR when the
// store is not a TCPStore), loopback when that host is this one. Returns once
// connected to every peer; `timeout` bounds that and every operation.
TORCH_RINGDIST_API c10::intrusive_ptr<c10d::Backend> createBackend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout = kDefaultTimeout);

// The same backend inside a c10d::ProcessGroup (for CPU tensors, and CUDA
// tensors when cudaCompiled()), as init_process_group("ringdist") returns it.
TORCH_RINGDIST_API c10::intrusive_ptr<c10d::ProcessGroup> createProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout = kDefaultTimeout);

// Waits for the group's queued operations, tells the peers, closes every
// link (what destroy_process_group does). A group also shuts down when its
// last reference goes; call this before main returns when the group is held
// somewhere that outlives main (a static, a global).
TORCH_RINGDIST_API void shutdown(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

// ---------------------------------------------------------------- launch

// What the launcher told this process, from the environment.
struct Launch {
  // "torchrun" (TORCHELASTIC_* set), "mpirun" (Open MPI's OMPI_COMM_WORLD_*,
  // or PMI_RANK/PMI_SIZE of MPICH and Intel MPI), "env" (RANK and WORLD_SIZE
  // set by hand or by another launcher) or "none" (one process, nothing set).
  std::string launcher = "none";
  int rank = 0;
  int size = 1;
  int localRank = 0;   // LOCAL_RANK or the MPI local rank; for one process 0; -1: not told
  std::string masterAddr;  // where the store is served (MASTER_ADDR)
  int masterPort = 0;      // MASTER_PORT
  // torchrun's agent already serves the store on MASTER_PORT: every rank
  // connects to it (a rank 0 that served it too would find the port taken).
  bool agentStore = false;
  std::string storePrefix;  // agent store: keys of this restart attempt ("/worker/attempt_N")
};

// Reads the launch environment. MASTER_ADDR and MASTER_PORT are required
// for more than one rank, except under mpirun with every rank on this host
// (then 127.0.0.1 and, if MASTER_PORT is unset, 29500). Bad values raise an
// error naming the variable.
TORCH_RINGDIST_API Launch launchFromEnvironment();

// The store for a launch: a client of torchrun's agent store; else a TCPStore
// at MASTER_ADDR:MASTER_PORT that rank 0 serves; a HashStore for one rank.
TORCH_RINGDIST_API c10::intrusive_ptr<c10d::Store> storeFor(
    const Launch& launch, std::chrono::milliseconds timeout = kDefaultTimeout);

// launchFromEnvironment(), storeFor() and createProcessGroup() in one call.
TORCH_RINGDIST_API c10::intrusive_ptr<c10d::ProcessGroup> init(
    std::chrono::milliseconds timeout = kDefaultTimeout);

// ---------------------------------------------------------------- ringdist's own calls

// Allreduce with a lossy wire codec ("fp16", "bf16", "int8" or "int4"), summed in
// float32, SUM or (average) AVG; bitwise identical on every rank. One dense
// float32, bfloat16 or float16 tensor, in place. residual (optional): a float32 tensor of as
// many elements, added to the tensor, then given what the codec lost of this rank's
// contributions, for the next call (error feedback). As torch_ringdist.all_reduce.
TORCH_RINGDIST_API c10::intrusive_ptr<c10d::Work> allreduceCompressed(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor& tensor,
    const std::string& codec, bool average = false, const at::Tensor& residual = {});

// Per-operation counters of a ringdist group, as torch_ringdist.stats().
struct OpStats {
  uint64_t calls = 0;
  uint64_t bytesSent = 0;      // wire bytes, headers included
  uint64_t bytesReceived = 0;
  uint64_t bytesSentAcrossHosts = 0;  // of bytesSent, to peers on other hosts
  uint64_t payloadBytes = 0;   // bytes of the operations' output tensors
  double seconds = 0;          // time the operations ran
  uint64_t inlineCalls = 0;    // calls run on the caller's thread
  uint64_t singleCopyBytes = 0;  // bytes copied straight between same-host ranks' memory
};
// Keyed by operation ("allreduce", "compressed_allreduce/int8", ...).
TORCH_RINGDIST_API std::map<std::string, OpStats> stats(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group);
TORCH_RINGDIST_API void resetStats(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

// The ringdist backend of a group made by createProcessGroup or by Python;
// raises for groups of other backends.
TORCH_RINGDIST_API c10::intrusive_ptr<c10d::Backend> ringdistBackend(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group);

// The address a group on this store listens on (see createBackend); a null
// store stands for MASTER_ADDR.
TORCH_RINGDIST_API std::string listenAddress(const c10::intrusive_ptr<c10d::Store>& store);

// Whether this build of libtorch_ringdist contains ringdist's CUDA code.
TORCH_RINGDIST_API bool cudaCompiled();

// The torch version this build was compiled against ("2.13.0").
TORCH_RINGDIST_API std::string builtWithTorch();

}  // namespace torch_ringdist
