#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "csrc/codec/codec.h"
#include "csrc/collectives/communicator.h"
#include "csrc/common/types.h"
#include "csrc/reduce/reduce.h"

namespace ringdist {

// The engine's collectives, one per file named after it (csrc/collectives/
// <name>.cc). They work on raw pointers and element counts, see only the
// Channel interface, and run on the calling (worker) thread.
// Each first exchanges OpHeaders, so ranks that disagree fail cleanly.
// Pointer arrays indexed "by rank" have comm.size() entries.

// Allreduce algorithms; travel in OpHeader::variant, so ranks must agree.
enum AllreduceVariant : uint8_t {
  kRingAllreduce = 0,
  kOneShotAllreduce = 1,      // small buffers: one round
  kHierarchicalAllreduce = 2, // several hosts with several ranks each
  kDeviceAllreduce = 3,       // GPU memory of one host's ranks (gpu/device_allreduce.h)
  kSingleCopyAllreduce = 4,   // one host: copies straight between the ranks' buffers
  kSameGpuAllreduce = 5,      // ranks sharing one GPU: one fused kernel (gpu/same_gpu.h)
  kDirectAllreduce = 6,       // one rank per host, long links: every peer at once (route_model.h)
  kHalvingDoublingAllreduce = 7,  // one rank per host, long links, many hosts (route_model.h)
};

// Broadcast, allgather and reduce-scatter: how the bytes travel; in OpHeader::variant.
enum CopyVariant : uint8_t {
  kRingCopy = 0,    // through the links (rings, sockets)
  kSingleCopy = 1,  // one host: ranks copy straight from or into peers' buffers (Communicator::singleCopy)
  kSameGpuCopy = 2, // ranks sharing one GPU: one fused kernel (gpu/same_gpu.h); reduce-scatter too
  kDirectCopy = 3,  // one rank per host, long links: every peer at once (route_model.h)
};

// Memory that fills and drains while an operation runs: a CUDA tensor's
// pinned host twin, copied from the GPU piece by piece ahead of the ring and
// back to it as each piece becomes final, so the copies overlap the network
// (gpu/stage/device_stage.cc). The rings (allreduce flat and two-level, allgather,
// reduce-scatter) ask before they first read input bytes and say when output
// bytes are final; their other paths need the whole input first and produce
// the whole output at the end. Offsets and lengths in bytes: need() counts
// them in the operation's input, produced() in its output (one buffer for
// allreduce; rank r's block at r * block bytes where there are several).
class StageGate {
 public:
  virtual ~StageGate() = default;
  // Every range the operation will need(), in the order it will first need
  // them; called once, before any need().
  virtual void plan(const std::vector<std::pair<size_t, size_t>>& ranges) = 0;
  // Returns once [offset, offset + length) holds the input (bounded by the
  // operation's deadline).
  virtual void need(size_t offset, size_t length) = 0;
  // [offset, offset + length) holds its result and is not written again.
  virtual void produced(size_t offset, size_t length) = 0;
};

// A gate on a path that reads its whole input from its first exchange on
// (a peer may read it from then): plans and waits for all of it.
inline void needWhole(StageGate* gate, size_t bytes) {
  if (gate == nullptr || bytes == 0) return;
  gate->plan({{0, bytes}});
  gate->need(0, bytes);
}

// One piece of `bytes` per rank in the communicator's scratch, each 64-byte aligned: where the
// one-round and direct paths land every peer's contribution before reducing.
class ScratchSlots {
 public:
  ScratchSlots(Communicator& comm, int ranks, size_t bytes)
      : stride_((bytes + 63) / 64 * 64),
        base_(comm.scratch(stride_ * static_cast<size_t>(ranks))) {}
  char* operator[](int rank) const { return base_ + static_cast<size_t>(rank) * stride_; }

 private:
  size_t stride_;
  char* base_;
};

// dst = from(0) (op) from(1) (op) ... from(n-1), in rank order, so every rank that reduces the
// same contributions gets the same bits; divided by n for AVG. n >= 2; dst may be from(0).
template <typename From>
void reduceInRankOrder(void* dst, int n, size_t count, DataType dtype, ReduceOp op, From from) {
  const ReduceFn reduceFn = reduceFunction(dtype, op);
  reduceFn(dst, from(0), from(1), count);
  for (int r = 2; r < n; ++r) reduceFn(dst, dst, from(r), count);
  if (op == ReduceOp::kAvg) divideInPlace(dst, count, dtype, n);
}

// The route an allreduce of `bytes` per rank in CPU memory takes on this group
// (docs/ARCHITECTURE.md's table: the first that applies), by its name: "board", "single copy",
// "pair", "one round", "two-level", "direct" or "ring".
const char* allreduceRoute(const Communicator& comm, size_t bytes);

// In place: data (count elements) becomes the reduction over all ranks.
// With a gate, data is read and finished range by range (StageGate).
void allreduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op,
               StageGate* gate = nullptr);

// data (count elements) on root is copied to every rank.
void broadcast(Communicator& comm, void* data, size_t count, DataType dtype, int root);

// outputs[r] (count elements each) receives rank r's input. With a gate,
// the input must be outputs[rank] (the gate's owner puts it in place), and
// only the other ranks' blocks are produced.
void allgather(Communicator& comm, const void* input, void* const* outputs, size_t count,
               DataType dtype, StageGate* gate = nullptr);

// output (count elements) receives the reduction of inputs[rank] over all
// ranks; inputs are left unchanged. A gate counts inputs[r] from byte
// r * count * element size.
void reduceScatter(Communicator& comm, const void* const* inputs, void* output, size_t count,
                   DataType dtype, ReduceOp op, StageGate* gate = nullptr);

// In place on root; other ranks' data is left unchanged.
void reduce(Communicator& comm, void* data, size_t count, DataType dtype, ReduceOp op, int root);

// On root, outputs[r] receives rank r's input (outputs unused elsewhere).
void gather(Communicator& comm, const void* input, void* const* outputs, size_t count,
            DataType dtype, int root);

// output receives root's inputs[rank] (inputs unused off root).
void scatter(Communicator& comm, const void* const* inputs, void* output, size_t count,
             DataType dtype, int root);

// outputs[r] (recvCounts[r] elements) receives what rank r sent us from its
// inputs[rank] (sendCounts[rank] elements there).
void alltoall(Communicator& comm, const void* const* inputs, const std::vector<uint64_t>& sendCounts,
              void* const* outputs, const std::vector<uint64_t>& recvCounts, DataType dtype);

void barrier(Communicator& comm);

// The `parts` consecutive blocks of `bytes` each that make up one buffer
// (the rank-by-rank layout of all_gather_into_tensor / reduce_scatter_tensor).
template <typename T>
std::vector<T*> blocksOf(T* base, int parts, size_t bytes) {
  std::vector<T*> blocks;
  for (int r = 0; r < parts; ++r) {
    blocks.push_back(reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(base) +
                                          static_cast<size_t>(r) * bytes));
  }
  return blocks;
}

// Every rank's `mine` (a plain value), by rank: an allgather of its bytes.
template <typename T>
std::vector<T> allgatherValue(Communicator& comm, const T& mine) {
  std::vector<T> all(static_cast<size_t>(comm.size()));
  std::vector<void*> outputs;
  for (T& value : all) outputs.push_back(&value);
  allgather(comm, &mine, outputs.data(), sizeof(T), DataType::kUInt8);
  return all;
}

// Whether every rank said yes; every rank learns the same answer.
inline bool everyRank(Communicator& comm, bool mine) {
  for (uint8_t ok : allgatherValue<uint8_t>(comm, mine ? 1 : 0)) {
    if (ok == 0) return false;
  }
  return true;
}

// In place: data (count float32 elements) becomes the sum (or, with
// average, the mean) over all ranks, sent on the wire in `codec`. Each
// element is quantised at most twice (once as a contribution, once as
// the reduced value; between two ranks only as a contribution), whatever the world size; the sum is taken in float32
// in a fixed order; every rank decodes the same bytes, so results are bitwise
// identical on all ranks. A contribution is this rank's data, or, where every rank of a group
// with the same number of ranks on each host calls this form, its host's sum of one chunk
// (two levels). residual (count float32, or null): error feedback. It is added to data first,
// then gets what the quantisation of this rank's contributions lost (zero where it
// contributed none), for the next call. Both on the group's thread in op order, so calls in
// flight together chain correctly. See compressed_allreduce.cc.
void compressedAllreduce(Communicator& comm, float* data, size_t count, Codec codec,
                         bool average, float* residual = nullptr);
// The same operation on an already encoded buffer: encodedIn holds the
// encoding of all count elements (encodedBytes(codec, count)), encodedOut
// receives the encoding of the result (same size); decoding it gives what
// compressedAllreduce leaves in data. The wire is the same, so ranks using
// either form can be in one operation (which then takes one level). For CUDA
// tensors, which encode and decode on the GPU so only encoded bytes cross PCIe.
void compressedAllreduceEncoded(Communicator& comm, const void* encodedIn, void* encodedOut,
                                size_t count, Codec codec, bool average);
// The route compressedAllreduce takes for `count` elements when every rank calls the plain
// form: "pair", "direct", "rounds", "rounds, paced", or "two-level, " and the one across hosts.
std::string compressedAllreduceRoute(const Communicator& comm, size_t count, Codec codec);

// Debug: every rank's `bytes` at `data` must be identical; all ranks compare
// CRCs (one small allgather) and fail naming the ranks that differ.
void checkIdenticalResults(Communicator& comm, void* data, size_t bytes, const char* opName);

}  // namespace ringdist
