#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "csrc/common/types.h"

#include "torch_ringdist/export.h"

// The kernels on tensors, for tests (torch_ringdist._C.testing): the CPU
// reduce and codec kernels and the element arithmetic they share with the CUDA
// kernels (csrc/reduce/elementwise.h, csrc/codec/block_math.h), so tests
// compare the two bit for bit on any machine, GPU or not.
namespace ringdist::testing {

// a (op) b with the CPU reduce kernel the collectives use.
TORCH_RINGDIST_API at::Tensor reduceWithKernel(const at::Tensor& a, const at::Tensor& b,
                                               const std::string& op);
// The same, one element at a time through the arithmetic shared with the GPU.
TORCH_RINGDIST_API at::Tensor reduceWithShared(const at::Tensor& a, const at::Tensor& b,
                                               const std::string& op);
// float32 -> fp16/bf16 bits (int16) and back: the CPU kernels' conversion or the shared one.
TORCH_RINGDIST_API at::Tensor narrow(const at::Tensor& values, const std::string& to, bool shared);
TORCH_RINGDIST_API at::Tensor widen(const at::Tensor& bits, const std::string& from, bool shared);
// x / divisor with the CPU kernel that finalises AVG.
TORCH_RINGDIST_API at::Tensor divideWithKernel(const at::Tensor& x, int64_t divisor);
// The GPU reduce and divide kernels on the current stream (CUDA builds only).
TORCH_RINGDIST_API at::Tensor reduceWithCudaKernel(const at::Tensor& a, const at::Tensor& b,
                                                   const std::string& op);
TORCH_RINGDIST_API at::Tensor divideWithCudaKernel(const at::Tensor& x, int64_t divisor);
// Encoded bytes of float32 values, and back (added to a copy of acc if
// given): impl "cpu", "shared" or "cuda".
TORCH_RINGDIST_API at::Tensor codecEncode(const at::Tensor& values, const std::string& codec,
                                          const std::string& impl);
TORCH_RINGDIST_API at::Tensor codecDecode(const at::Tensor& bytes, const std::string& codec,
                                          int64_t count, const std::string& impl,
                                          std::optional<at::Tensor> acc);
// topk_select computed as the GPU kernels compute it (radix select, tiles of
// `tile` entries), on the host through the shared arithmetic.
TORCH_RINGDIST_API void topkRadixSelect(const at::Tensor& grad, std::optional<at::Tensor> residual,
                                        int64_t k, at::Tensor& packed, int64_t tile);
// The engine's large copy (copyBytes) within a uint8 tensor, regions may overlap.
TORCH_RINGDIST_API void copyBytesWithin(at::Tensor& buffer, int64_t to, int64_t from,
                                        int64_t bytes);

// How many segments of segmentBytes the ring allreduce forwards a segment
// after its arrival on links of roundTripUs (forwardLag, collectives/ring.h).
TORCH_RINGDIST_API int64_t ringForwardLag(int64_t roundTripUs, int64_t segmentBytes);

// A reduce op by its name ("sum", "avg", ...).
ReduceOp opFromName(const std::string& name);

// One collective ("all_reduce", "broadcast": in place on output, which must
// be input; "reduce_scatter", "all_gather": input -> output, blocks of the
// output's / input's size) on the group named groupName through the
// same-GPU protocol run on the CPU (testing_same_gpu.cc). The tensors are lent
// from `offset` bytes into this rank's shared arena (a fresh arena if renew;
// from no arena if !lend, so they go through scratch), `stall` drops this
// rank's signal writes, `vanish` makes this rank's lent memory impossible to
// map, `device` stands for its GPU and `peer_access` says whether it reaches
// the others' GPUs (ranks on different devices then run split). An all_to_all
// sends sends[r] elements to rank r and receives receipts[s] from rank s (the
// engine's alltoall when the ranks are not on one GPU). Returns fused (0: the
// ranks are not on one GPU and the engine ran it), seq, and the leader's
// cache figures (opens, cached).
TORCH_RINGDIST_API std::map<std::string, int64_t> sameGpuHostRun(
    const std::string& groupName, const std::string& kind, const at::Tensor& input,
    at::Tensor& output, const std::string& op, int64_t root, int64_t offset, bool lend,
    bool renew, bool stall, bool vanish, int64_t device, bool peerAccess, int64_t timeoutMs,
    const std::vector<int64_t>& sends, const std::vector<int64_t>& receipts);
// Device messages through the same protocol: this rank sends each of `sends`
// to its peer with its tag, the ranks exchange the messages' records, then
// each fills `receives` in order, taking the oldest unclaimed message of the
// tag from the source (-1: any). waiting_senders: the peers sent to whose
// done streams still waited when no receive had been queued; message_opens:
// senders' allocations mapped.
TORCH_RINGDIST_API std::map<std::string, int64_t> sameGpuHostMessages(
    const std::string& groupName, const std::vector<at::Tensor>& sends,
    const std::vector<int64_t>& sendPeers, const std::vector<int64_t>& sendTags,
    std::vector<at::Tensor>& receives, const std::vector<int64_t>& receiveSources,
    const std::vector<int64_t>& receiveTags, int64_t device, bool peerAccess, int64_t timeoutMs);
// Drops that group's state (its streams, watch and mappings).
TORCH_RINGDIST_API void sameGpuHostReset(const std::string& groupName);
// One point-to-point transfer on the group's worker with device messages
// (p2p.h), no GPU needed: a send of a DeviceMessage numbered `index`, or a
// receive (from `peer`, -1: any) that takes one if `takesDevice` (else only
// bytes, as a receive into host memory). `bytes` is the size the header
// names. Returns, for a receive, device (1: a device message arrived), index
// and source (byte_sum of what landed, for bytes).
TORCH_RINGDIST_API std::map<std::string, int64_t> p2pDeviceMessage(
    const std::string& groupName, bool send, int64_t peer, int64_t tag, int64_t bytes,
    int64_t index, bool takesDevice);

// `collective` ("allreduce", "all_gather" as all_gather_into_tensor,
// "reduce_scatter" as reduce_scatter_tensor) of input into output on the group
// named groupName through a StageGate on the CPU (testing_gated.cc), moved in
// the pieces the CUDA twins use (stage_pieces.h) of at most `pieceBytes`: the
// engine's input is filled piece by piece, `delay_us` apart, in the order
// issued, and the output is taken in runs as the engine says ranges are
// final. Returns planned (ranges), pieces, needs, produced (ranges),
// copies_back (runs), produced_early (ranges final before the last piece was
// in), bytes_planned_once and bytes_produced_once.
TORCH_RINGDIST_API std::map<std::string, int64_t> gated(const std::string& groupName,
                                                        const std::string& collective,
                                                        const at::Tensor& input,
                                                        at::Tensor& output, const std::string& op,
                                                        int64_t pieceBytes, int64_t delayUs,
                                                        int64_t timeoutMs);

}  // namespace ringdist::testing
