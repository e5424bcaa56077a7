// Top-k selection and scatter on the GPU (radix select; terms in
// csrc/topk/topk_math.h, contract in csrc/topk/topk.h).
//
// Selection, queued on one stream with no host wait:
//   histogram  per pass, each block counts in shared memory the digits of the
//              entries in the prefix, then adds its counts to the pass's
//              histogram; pass 0 first adds grad into the residual (x).
//   choose     one block scans the histogram from the high digit and narrows
//              the state to the digit that holds the cut.
//   count      per tile of kTile entries: how many are above the threshold,
//              how many equal it.
//   offsets    one block scans the tiles' counts: entries equal to the
//              threshold before each tile, selected entries before it.
//   write      per tile: a block scan gives each selected entry its place in
//              index order; its value and index are written, its residual
//              zeroed.
// Scatter: one launch per rank, in rank order. A rank's indices are distinct,
// so its additions never collide, and each entry sums the ranks in the CPU's
// order.
#include "csrc/gpu/cuda/topk.h"

#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "csrc/common/error.h"
#include "csrc/topk/topk_math.h"

namespace ringdist {
namespace cuda {

namespace {

namespace tm = topkmath;
using tm::RadixState;

constexpr int kThreads = 256;
constexpr int kItems = 16;  // entries per thread in a tile
constexpr size_t kTile = static_cast<size_t>(kThreads) * kItems;
// The one-block kernels: 1024 threads hold the 2048 digits of a pass, two each.
constexpr int kScanThreads = 1024;
constexpr unsigned kMaxGridBlocks = 1024;
constexpr size_t kStateBytes = 16;  // RadixState, padded

size_t tileCount(size_t n) { return (n + kTile - 1) / kTile; }

unsigned gridFor(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxGridBlocks ? blocks : kMaxGridBlocks);
}

struct Workspace {
  RadixState* state;
  uint32_t* histogram;  // kMaxRadixBins counters
  uint32_t* tileA;      // per tile: entries above the threshold, then selected entries before it
  uint32_t* tileB;      // per tile: entries equal to the threshold, then those before it
};

Workspace carve(void* base, size_t n) {
  char* bytes = static_cast<char*>(base);
  Workspace w;
  w.state = reinterpret_cast<RadixState*>(bytes);
  w.histogram = reinterpret_cast<uint32_t*>(bytes + kStateBytes);
  w.tileA = w.histogram + tm::kMaxRadixBins;
  w.tileB = w.tileA + tileCount(n);
  return w;
}

__global__ void initState(RadixState* state, uint32_t k) { *state = RadixState{0u, k}; }

// kAdd (pass 0 with a residual): x = residual + grad, written to the residual.
template <bool kAdd>
__global__ void histogram(const float* grad, float* residual, const float* x, size_t n,
                          const RadixState* state, int pass, uint32_t* out) {
  __shared__ uint32_t counts[tm::kMaxRadixBins];
  const uint32_t bins = tm::radixBins(pass);
  for (uint32_t b = threadIdx.x; b < bins; b += blockDim.x) counts[b] = 0;
  __syncthreads();
  const RadixState s = *state;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v;
    if (kAdd) {
      v = residual[i] + grad[i];
      residual[i] = v;
    } else {
      v = x[i];
    }
    const uint32_t key = tm::magnitudeKey(v);
    if (tm::inPrefix(key, s, pass)) atomicAdd(&counts[tm::radixDigit(key, pass)], 1u);
  }
  __syncthreads();
  for (uint32_t b = threadIdx.x; b < bins; b += blockDim.x) {
    if (counts[b] != 0) atomicAdd(&out[b], counts[b]);
  }
}

// Thread t holds digits bins-1-2t and bins-2-2t: an exclusive scan of the
// threads' pair sums counts the entries above each pair.
__global__ void chooseDigit(const uint32_t* hist, RadixState* state, int pass) {
  using Scan = cub::BlockScan<uint32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  const RadixState s = *state;
  const int high = static_cast<int>(tm::radixBins(pass)) - 1 - 2 * static_cast<int>(threadIdx.x);
  const uint32_t countHigh = high >= 0 ? hist[high] : 0u;
  const uint32_t countLow = high >= 1 ? hist[high - 1] : 0u;
  uint32_t above;
  Scan(temp).ExclusiveSum(countHigh + countLow, above);
  if (high >= 0 && tm::holdsCut(above, countHigh, s.remaining)) {
    *state = tm::narrowTo(s, pass, static_cast<uint32_t>(high), above);
  } else if (high >= 1 && tm::holdsCut(above + countHigh, countLow, s.remaining)) {
    *state = tm::narrowTo(s, pass, static_cast<uint32_t>(high - 1), above + countHigh);
  }
}

// Counts of one tile, packed as (above << 32) | equal (each at most kTile).
__global__ void countTiles(const float* x, size_t n, const RadixState* state, uint32_t* above,
                           uint32_t* equal) {
  using Reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint32_t threshold = state->prefix;
  const size_t start = static_cast<size_t>(blockIdx.x) * kTile;
  unsigned long long counts = 0;
  for (int j = 0; j < kItems; ++j) {
    const size_t i = start + static_cast<size_t>(j) * kThreads + threadIdx.x;
    if (i < n) {
      const uint32_t key = tm::magnitudeKey(x[i]);
      counts += (key > threshold ? (1ull << 32) : 0ull) + (key == threshold ? 1ull : 0ull);
    }
  }
  const unsigned long long total = Reduce(temp).Sum(counts);
  if (threadIdx.x == 0) {
    above[blockIdx.x] = static_cast<uint32_t>(total >> 32);
    equal[blockIdx.x] = static_cast<uint32_t>(total & 0xffffffffu);
  }
}

// In: tileA = above, tileB = equal. Out: tileA = selected entries before the
// tile, tileB = entries equal to the threshold before it. Thread t scans a
// contiguous run of tiles.
__global__ void tileOffsets(size_t tiles, const RadixState* state, uint32_t* tileA, uint32_t* tileB) {
  using Scan = cub::BlockScan<uint32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  const uint32_t take = state->remaining;
  const size_t per = (tiles + kScanThreads - 1) / kScanThreads;
  const size_t begin = min(tiles, static_cast<size_t>(threadIdx.x) * per);
  const size_t end = min(tiles, begin + per);
  uint32_t equal = 0;
  for (size_t t = begin; t < end; ++t) equal += tileB[t];
  uint32_t equalBefore;
  Scan(temp).ExclusiveSum(equal, equalBefore);
  uint32_t chosen = 0;
  for (size_t t = begin; t < end; ++t) {
    const uint32_t e = tileB[t];
    const uint32_t s = tileA[t] + tm::equalTaken(equalBefore, e, take);
    tileB[t] = equalBefore;
    equalBefore += e;
    tileA[t] = s;
    chosen += s;
  }
  __syncthreads();  // temp is scanned again
  uint32_t chosenBefore;
  Scan(temp).ExclusiveSum(chosen, chosenBefore);
  for (size_t t = begin; t < end; ++t) {
    const uint32_t s = tileA[t];
    tileA[t] = chosenBefore;
    chosenBefore += s;
  }
}

// Thread t holds entries t*kItems.. of the tile (loaded striped, transposed in
// shared memory), so a block scan of per-thread counts orders them by index.
__global__ void writeSelected(const float* x, size_t n, const RadixState* state,
                              const uint32_t* chosenBefore, const uint32_t* equalBefore,
                              float* values, int32_t* indices, float* residual) {
  using Load = cub::BlockLoad<float, kThreads, kItems, cub::BLOCK_LOAD_TRANSPOSE>;
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ union {
    typename Load::TempStorage load;
    typename Scan::TempStorage scan;
  } temp;
  const size_t start = static_cast<size_t>(blockIdx.x) * kTile;
  const int valid = static_cast<int>(min(kTile, n - start));
  float v[kItems];
  Load(temp.load).Load(x + start, v, valid, 0.0f);
  __syncthreads();
  const RadixState s = *state;
  const int first = static_cast<int>(threadIdx.x) * kItems;  // within the tile
  uint32_t equal = 0;
  for (int j = 0; j < kItems; ++j) {
    equal += (first + j < valid && tm::magnitudeKey(v[j]) == s.prefix) ? 1u : 0u;
  }
  uint32_t equalSeen;
  Scan(temp.scan).ExclusiveSum(equal, equalSeen);
  equalSeen += equalBefore[blockIdx.x];
  bool take[kItems];
  uint32_t chosen = 0;
  for (int j = 0; j < kItems; ++j) {
    const uint32_t key = tm::magnitudeKey(v[j]);
    const bool present = first + j < valid;
    take[j] = present && tm::selected(key, s.prefix, equalSeen, s.remaining);
    if (present && key == s.prefix) ++equalSeen;
    chosen += take[j] ? 1u : 0u;
  }
  __syncthreads();  // temp is scanned again
  uint32_t place;
  Scan(temp.scan).ExclusiveSum(chosen, place);
  place += chosenBefore[blockIdx.x];
  for (int j = 0; j < kItems; ++j) {
    if (!take[j]) continue;
    const size_t i = start + static_cast<size_t>(first + j);
    values[place] = v[j];
    indices[place] = static_cast<int32_t>(i);
    if (residual != nullptr) residual[i] = 0.0f;  // sent: leaves the residual
    ++place;
  }
}

__global__ void scatterRank(const float* part, size_t k, size_t n, float world, uint32_t rank,
                            float* out, unsigned long long* firstBad) {
  const auto* idx = reinterpret_cast<const int32_t*>(part + k);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k; j += stride) {
    const auto i = static_cast<uint32_t>(idx[j]);
    if (i >= n) {
      atomicMin(firstBad, (static_cast<unsigned long long>(rank) << 32) | j);
      continue;
    }
    out[i] = tm::scatterAdd(out[i], part[j], world);
  }
}

void check(const char* what, cudaError_t err) {
  RINGDIST_CHECK(err == cudaSuccess, "ringdist cuda topk ", what, ": ", cudaGetErrorString(err));
}

}  // namespace

size_t topkSelectWorkspaceBytes(size_t n) {
  return kStateBytes + (tm::kMaxRadixBins + 2 * tileCount(n)) * sizeof(uint32_t);
}

void topkSelect(const float* grad, float* residual, size_t n, size_t k, float* values,
                int32_t* indices, void* workspace, cudaStream_t stream) {
  RINGDIST_CHECK(k <= n && n < (size_t{1} << 31), "ringdist topk: k = ", k, " of n = ", n,
                 " (need k <= n < 2^31)");
  if (n == 0 || (k == 0 && residual == nullptr)) return;
  const Workspace w = carve(workspace, n);
  const float* x = residual != nullptr ? residual : grad;
  initState<<<1, 1, 0, stream>>>(w.state, static_cast<uint32_t>(k));
  for (int pass = 0; pass < tm::kRadixPasses; ++pass) {
    check("select", cudaMemsetAsync(w.histogram, 0, tm::radixBins(pass) * sizeof(uint32_t), stream));
    if (pass == 0 && residual != nullptr) {
      histogram<true><<<gridFor(n), kThreads, 0, stream>>>(grad, residual, x, n, w.state, pass,
                                                           w.histogram);
    } else {
      histogram<false><<<gridFor(n), kThreads, 0, stream>>>(grad, residual, x, n, w.state, pass,
                                                            w.histogram);
    }
    if (k == 0) break;  // only the residual's sum was wanted
    chooseDigit<<<1, kScanThreads, 0, stream>>>(w.histogram, w.state, pass);
  }
  if (k > 0) {
    const auto tiles = static_cast<unsigned>(tileCount(n));
    countTiles<<<tiles, kThreads, 0, stream>>>(x, n, w.state, w.tileA, w.tileB);
    tileOffsets<<<1, kScanThreads, 0, stream>>>(tiles, w.state, w.tileA, w.tileB);
    writeSelected<<<tiles, kThreads, 0, stream>>>(x, n, w.state, w.tileA, w.tileB, values, indices,
                                                  residual);
  }
  check("select", cudaGetLastError());
}

void topkScatter(const float* parts, size_t world, size_t k, size_t n, float* out, void* flag,
                 cudaStream_t stream) {
  check("scatter", cudaMemsetAsync(out, 0, n * sizeof(float), stream));
  if (k == 0) return;
  auto* firstBad = static_cast<unsigned long long*>(flag);
  check("scatter", cudaMemsetAsync(firstBad, 0xff, sizeof(*firstBad), stream));
  for (size_t r = 0; r < world; ++r) {
    scatterRank<<<gridFor(k), kThreads, 0, stream>>>(parts + r * 2 * k, k, n,
                                                      static_cast<float>(world),
                                                      static_cast<uint32_t>(r), out, firstBad);
  }
  check("scatter", cudaGetLastError());
  // Every index is checked before the result is used, as on the CPU.
  unsigned long long bad = 0;
  check("scatter", cudaMemcpyAsync(&bad, firstBad, sizeof(bad), cudaMemcpyDeviceToHost, stream));
  check("scatter", cudaStreamSynchronize(stream));
  if (bad == ~0ull) return;
  const size_t rank = bad >> 32;
  const size_t j = bad & 0xffffffffu;
  int32_t index = 0;
  check("scatter", cudaMemcpyAsync(&index, reinterpret_cast<const int32_t*>(parts + rank * 2 * k + k) + j,
                                   sizeof(index), cudaMemcpyDeviceToHost, stream));
  check("scatter", cudaStreamSynchronize(stream));
  RINGDIST_CHECK(false, "ringdist topk: rank ", rank, " sent index ", index, " for a bucket of ",
                 n, " entries");
}

}  // namespace cuda
}  // namespace ringdist
