#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ringdist {

// Every setting of the engine, with its default and the reason for it. The
// backend fills one Options from the environment and validates it
// (csrc/backend/environment.cc, where the RINGDIST_* names live); each layer gets
// its part. Nothing below csrc/backend/ reads the environment.

// ------------------------------------------------------------------ transport

enum class TransportPolicy : uint8_t {
  kAuto,  // shared memory between ranks on one host, TCP otherwise
  kTcp,   // TCP only
  kShm,   // shared memory required: an error if a peer is on another host
};
const char* transportPolicyName(TransportPolicy policy);
// The inverse of transportPolicyName; false for any other name.
bool transportPolicyFromName(const std::string& name, TransportPolicy* out);

// How same-host ranks move large buffers between them (RINGDIST_SINGLE_COPY).
enum class SingleCopyMode : uint8_t {
  kAuto,  // measured at connect time (kCopyProbeBytes): single copy only where it is faster
  kOn,    // single copy wherever the kernel allows process_vm_readv/writev
  kOff,   // always through the shared-memory rings
};
const char* singleCopyModeName(SingleCopyMode mode);
// The inverse of singleCopyModeName ("auto", "1", "0"); false for any other name.
bool singleCopyModeFromName(const std::string& name, SingleCopyMode* out);

// The route collectives of a group with one rank per host take (RINGDIST_ROUTE; every rank
// must agree): the route model's (collectives/route_model.h), or one forced wherever the group
// and the operation allow it (else the ring).
enum class RouteMode : uint8_t { kAuto, kRing, kDirect, kHalvingDoubling, kPair };

// The connect-time copy probe (kAuto): every rank of a host times a kernel
// copy (process_vm_readv) of this many bytes from a peer's memory against
// what the rings do with them, a memcpy into shared memory and one out of it;
// best of kCopyProbeRounds (the first pays page faults). 1 MiB, the band
// where the choice matters: a 256 KiB probe stays in L2, where the kernel copy
// wins, and picked single copy (x0.78) on a day the rings were x1.4-1.7
// faster for allreduce at 64 KiB-16 MiB (at 1 MiB: x1.75, rings). About 2 ms.
constexpr size_t kCopyProbeBytes = 1 << 20;
constexpr int kCopyProbeRounds = 8;
// The rings are chosen when the kernel copy takes more than this times their
// two memcpys. On an AMD EPYC VM the probe gave 1.4-2.9 (the machine's
// memory was slower in some hours), and the rings beat single copy x1.15-1.3
// at 1.4 and x1.5-2 at 2.3; an Intel VM's kernel copy took about 0.9 of two
// in-cache memcpys (a C probe, session 14), where single copy won x1.3-2.9
// (benchmarks/notes/single_copy.md). Near the threshold the two paths are
// close.
constexpr double kRingsWinRatio = 1.2;

// Bytes per direction of a same-host shared-memory ring: 8 default segments in
// flight, so writer and reader rarely wait on each other, while the bytes
// between them stay in cache (4 MiB was up to x1.3 slower at 8 MiB,
// benchmarks/notes/pipeline_depth.md).
constexpr size_t kDefaultShmRingBytes = 2 << 20;

// What every channel of a group does alike (all ranks must agree).
struct LinkOptions {
  // A CRC32C trailer after every posted transfer, checked before a receive
  // completes: TCP's checksum is weak and shared memory has none.
  bool checksums = false;
  // Testing only: this process's k-th checksummed send carries a wrong CRC.
  uint64_t corruptSendAt = 0;
  // Testing only: a single-copy write waits this long, its write flag set,
  // before it writes (a write in flight while the peer aborts).
  std::chrono::milliseconds writeDelay{0};
};

// How every TCP socket is set up (tcp/tuning.h). Each side chooses for its own
// sockets: ranks need not agree.
//
// Congestion control (RINGDIST_TCP_CONGESTION): "auto" picks bbr where the
// kernel offers it and lets this process choose it, else leaves the system's
// default; "system" always leaves it; any other word is an algorithm the
// kernel must accept. On an emulated 1 Gbit/s link with RTT 100 ms and 0.1%
// random loss one cubic stream moved 11 Mbit/s, one bbr stream 133
// (benchmarks/README.md, Emulated WAN).
constexpr const char* kDefaultTcpCongestion = "auto";
// The most each socket buffer (send and receive) is set to: within
// net.core.wmem_max / rmem_max, or up to this with CAP_NET_ADMIN. A buffer is
// set only where that gives more than the kernel's autotuning may reach
// (net.ipv4.tcp_wmem / tcp_rmem maximum), as setting one turns autotuning off
// for it. One stream's window is bounded by its buffers: the common 4 MiB
// tcp_wmem maximum holds a 1 Gbit/s link at 100 ms RTT near 330 Mbit/s; 32
// MiB (the kernel doubles it for its bookkeeping) covers a 1 Gbit/s x 100 ms
// bandwidth-delay product with room for loss recovery. 0: never set.
constexpr size_t kDefaultTcpBufferBytes = 32 << 20;
// The most TCP connections to each peer on the other host of a group that spans two hosts, when
// its links are long (its round trip at least kLanesRoundTripUs): the pair exchange sends a part
// of its buffer on each, so a link carries several windows. A group takes as many as its
// streams' windows need to cover kDefaultTcpBufferBytes per 100 ms of round trip (what the
// default buffer covers: a 1 Gbit/s link with room for loss recovery): with the kernel's
// autotuned 4 MiB at RTT 100 ms, all 4; where its buffers could be set to 32 MiB, one (more
// lanes of bbr then overflowed the link's queue: 64 MiB took 0.76 s on 4 lanes against 0.67 s
// on one on the emulated 1 Gbit/s line). One connection otherwise.
constexpr int kDefaultTcpLanes = 4;
constexpr int kMaxTcpLanes = 16;
constexpr uint32_t kLanesRoundTripUs = 1000;

struct TcpOptions {
  std::string congestion = kDefaultTcpCongestion;
  size_t bufferBytes = kDefaultTcpBufferBytes;
  int lanes = kDefaultTcpLanes;
};

// How TCP links are sealed and how peers prove themselves (tcp/handshake.h).
// Every rank of a group must agree on both.
struct TcpSecurity {
  // Every byte in AES-256-GCM records under per-connection keys
  // (RINGDIST_TCP_ENCRYPT). Off only for links that are trusted anyway:
  // sealing costs about one core-second per 5 GB each way.
  bool encrypt = true;
  // The secret the user gave every rank out of band (RINGDIST_SECRET or
  // RINGDIST_SECRET_FILE): only holders of it complete a handshake. Empty:
  // links are still encrypted, but peers are not authenticated.
  std::vector<uint8_t> secret;
};
// A shorter secret could be guessed offline from one recorded handshake.
constexpr size_t kMinSecretBytes = 16;

struct MeshOptions {
  std::string bindIp;                    // TCP listens here; never a wildcard address
  std::chrono::milliseconds timeout{0};  // for the whole connect phase
  TransportPolicy transport = TransportPolicy::kAuto;
  size_t shmRingBytes = kDefaultShmRingBytes;
  // Whether this rank offers single-copy reads (off also when
  // CollectiveOptions::singleCopyBytes is 0). A host uses them only if every
  // rank there offers them, and with kAuto on every rank only if they measured
  // faster there; kOn on any rank skips the measurement.
  SingleCopyMode singleCopy = SingleCopyMode::kAuto;
  // Testing: a label that refines (never replaces) this rank's detected host
  // identity, to emulate several hosts on one machine.
  std::string hostLabel;
  TcpOptions tcp;
  TcpSecurity security;
  LinkOptions link;
  // Testing only: this rank reports this round trip (microseconds) for its
  // links instead of the measured one (0: measured), so tests on one machine
  // run the collectives as sized for a long link.
  uint32_t testRoundTripUs = 0;
  // Testing only: a rank that maps its host's shared-memory segment waits this long between
  // reading its name and opening it (a window in which a test kills the segment's creator).
  std::chrono::milliseconds testShmMapDelay{0};
};

// ---------------------------------------------------------------- collectives

// Large copies go in pieces of this size (copyBytes in cpu.h): below the L2
// of any current x86 core, where glibc's memmove keeps using `rep movsb`.
constexpr size_t kCopyPieceBytes = 256 << 10;

// Big enough that per-segment syscalls and loop overhead vanish next to the
// copy cost, small enough that reduce and transfer of neighbouring segments
// overlap and scratch stays in L2/L3.
constexpr size_t kDefaultSegmentBytes = 256 * 1024;
// Shorter chunks are cut into this many segments, of at least the minimum
// size (below it per-segment overhead shows), so that their copies overlap.
constexpr size_t kPipelineDepth = 4;
constexpr size_t kMinPipelinedSegmentBytes = 32 * 1024;
// A ring keeps the data of this rate times the group's longest measured round
// trip in flight on each link (ring.h, ringInFlightBytes), so a link of up to
// this rate stays full however far away the peer is: a ring step waits for a
// segment from its left neighbour, half a round trip away, and only sends
// queued before it keep the link busy meanwhile. Only the round trip is
// measured (at connect, from the kernel's TCP round trip): a link slower than
// this just gets more queued than it needs (at 1 Gbit/s and RTT 100 ms the
// ring then runs step by step, which costs nothing there). On one host or a
// LAN the round trip is tens of microseconds and the ring keeps its cache-
// friendly order (kForwardLag in ring.h).
constexpr double kRingFillBitsPerSecond = 10e9;
// How long an error path waits for the rendezvous store (the first error a peer published,
// publishing ours): a host cut off from the network cannot reach it either, and the error must
// not wait for TCP to give up on the store's connection.
constexpr std::chrono::milliseconds kStoreOnErrorMs{2000};
// Up to this size an allreduce is latency-bound: one round in which every
// rank sends its buffer to every peer beats 2(N-1) ring hops.
constexpr size_t kDefaultSmallAllreduceBytes = 64 * 1024;
// With two ranks the round sends no more than the ring does (each rank sends
// its buffer once either way) and saves the ring's second step, while the
// buffer fits a shared-memory ring (2 MiB) with room to spare: faster up to
// 1 MiB, slower from 2 MiB (benchmarks/notes/latency_mpi.md, session 13).
constexpr size_t kDefaultPairAllreduceBytes = 1 << 20;
// From this size per rank, broadcast and allgather on one host copy each
// byte once, straight between the ranks' buffers (process_vm_readv/writev),
// instead of twice through a shared-memory ring. Below it the syscall's
// fixed cost loses (benchmarks/notes/single_copy.md).
constexpr size_t kDefaultSingleCopyBytes = 32 * 1024;
// A read of a peer's memory goes in pieces of this size, with the op's abort
// and deadline checked between them. Each process_vm_readv call has a fixed
// cost: 4 MiB allgathers took 8 us less per call than with 1 MiB pieces, and
// one piece takes well under a millisecond.
constexpr size_t kSingleCopyPieceBytes = 4 << 20;
// A two-rank allreduce on one host copies straight between the two buffers
// from this size (and singleCopyBytes; 3+ ranks above the one-round limit):
// below it the one-round path's single
// exchange wins (32 KiB: 10.6 vs 11.7 us; 64 KiB about even; 256 KiB-1 MiB
// x1.4-1.8 for single copy, benchmarks/notes/single_copy.md).
constexpr size_t kMinSingleCopyAllreduceBytes = 64 * 1024;
// The single-copy allreduce and reduce-scatter read peers' data into scratch
// this much at a time, so the reduction that follows finds it in cache: the
// piece and its operand fill a 1 MiB L2. Fewer, larger calls than 128 KiB
// pieces: two-rank allreduce 2-4 MiB 5-7% faster, 16-64 MiB unchanged; 1 MiB
// pieces lose 12% at 16 MiB (benchmarks/notes/single_copy.md).
constexpr size_t kSingleCopyReducePieceBytes = 512 * 1024;
// A point-to-point message that arrives before its receive is buffered; its
// size comes from the wire, so it is bounded before anything is allocated.
constexpr size_t kDefaultMaxUnexpectedBytes = size_t{1} << 30;
// CUDA allreduce among the ranks of one host: the GPU memory each rank shares
// with the others (CUDA IPC). Larger buffers go through in pieces of this
// size, three barriers each; 64 MiB keeps those to a few per large gradient
// bucket for little memory.
constexpr size_t kDefaultDeviceBufferBytes = 64 << 20;
// Smaller CUDA allreduces stage through host memory even on one host: the
// GPU-to-GPU path waits for the GPU three times per piece, and with ranks
// sharing a GPU each wait costs a context switch (~270 us measured on an
// H100). There it wins from 4 MiB and loses at 1 MiB
// (benchmarks/notes/gpu_h100.md).
constexpr size_t kDefaultDeviceMinBytes = 2 << 20;
// From this size a staged CUDA allreduce (across hosts) copies to and from
// host memory piece by piece while the ring runs (StageGate) instead of
// before and after it: each wait for a piece is a host wait for the GPU, so
// small tensors keep the one copy and one wait.
constexpr size_t kDefaultDevicePipelineBytes = 4 << 20;

struct CollectiveOptions {
  size_t segmentBytes = kDefaultSegmentBytes;  // ranks must agree (checked per op)
  size_t smallAllreduceBytes = kDefaultSmallAllreduceBytes;  // 3+ ranks
  size_t pairAllreduceBytes = kDefaultPairAllreduceBytes;    // 2 ranks
  RouteMode route = RouteMode::kAuto;
  // Whether an allreduce of `bytes` among `ranks` takes the one-round path.
  bool oneRoundAllreduce(size_t bytes, int ranks) const {
    return bytes <= (ranks == 2 ? pairAllreduceBytes : smallAllreduceBytes);
  }
  // 0: never copy peers' memory directly (every rank of the host then uses the rings).
  size_t singleCopyBytes = kDefaultSingleCopyBytes;
  // Two-level allreduce on groups of >= 2 hosts with the same number (>= 2)
  // of ranks on each: each host link then carries 2(H-1)/H of the buffer
  // instead of 2(N-1)/N.
  bool hierarchical = true;
  // After every allreduce and broadcast, ranks compare a CRC of their results.
  bool checkResults = false;
  size_t maxUnexpectedBytes = kDefaultMaxUnexpectedBytes;
  // 0: CUDA allreduce stages through host memory on one host too.
  size_t deviceBufferBytes = kDefaultDeviceBufferBytes;
  size_t deviceMinBytes = kDefaultDeviceMinBytes;
  size_t devicePipelineBytes = kDefaultDevicePipelineBytes;  // 0: never pipelined
  // Collectives among ranks that share one GPU: stream-ordered hand-offs and
  // one fused kernel at every size (same_gpu.h). Off until it has run on a GPU.
  bool deviceFused = false;
  // Testing only: flip one bit of this process's k-th checked result.
  uint64_t corruptResultAt = 0;
};

// dist.shrink_group waits at most this long (and at most the group's
// timeout) for the other survivors to connect: a survivor that died, or was
// told other ranks to exclude, never arrives.
constexpr auto kDefaultShrinkTimeout = std::chrono::seconds(60);

// Operations each group remembers for its flight-recorder trace.
constexpr size_t kDefaultTraceEntries = 2000;

struct Options {
  MeshOptions mesh;
  CollectiveOptions collectives;
  std::chrono::milliseconds shrinkTimeout = kDefaultShrinkTimeout;
  size_t traceEntries = kDefaultTraceEntries;  // 0: no trace
  std::string traceDump;  // file prefix for the trace written at the first failure; empty: none
  bool debug = false;  // connection and tuning details on stderr
};

}  // namespace ringdist
