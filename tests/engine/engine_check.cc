// The engine without torch, for any architecture (tests/test_arm.py runs it on
// x86-64 and under qemu-aarch64): every CPU kernel of one family checked
// against the shared element arithmetic (reduce/elementwise.h,
// codec/block_math.h) or an independent reference, then a two-rank group in
// one process (shared memory, then TCP) checked against closed forms. Each
// case prints a digest of its results; the digests must be the same for every
// kernel family on every architecture (NaNs hashed as one canonical NaN: their
// sign and payload are the hardware's, x86-64 and aarch64 differ).
//
//   ringdist_engine_check [--family generic|avx2|neon]
//
// Exit code 0 when every check passed; each line is "<case> <digest>".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "csrc/codec/codec.h"
#include "csrc/codec/elementwise_codec.h"
#include "csrc/collectives/collectives.h"
#include "csrc/common/cpu.h"
#include "csrc/common/crc32c.h"
#include "csrc/common/error.h"
#include "csrc/common/rendezvous.h"
#include "csrc/reduce/elementwise.h"
#include "csrc/reduce/half.h"
#include "csrc/reduce/outer_step.h"
#include "csrc/reduce/reduce.h"
#include "csrc/topk/topk.h"
#include "csrc/transport/mesh.h"

using namespace ringdist;

namespace {

namespace ew = elementwise;

int failures = 0;

void fail(const std::string& what) {
  ++failures;
  std::printf("MISMATCH %s\n", what.c_str());
}

// ---------------------------------------------------------------- digests and inputs

// FNV-1a over the bytes, NaNs of floating types replaced by one pattern.
struct Digest {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  void values(DataType dtype, const void* data, size_t count) {
    const size_t size = elementSize(dtype);
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < count; ++i, p += size) {
      if (isNaN(dtype, p)) {
        const uint8_t canonical[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
        bytes(canonical, size);
      } else {
        bytes(p, size);
      }
    }
  }
  static bool isNaN(DataType dtype, const uint8_t* p) {
    switch (dtype) {
      case DataType::kFloat32: { float v; std::memcpy(&v, p, 4); return v != v; }
      case DataType::kFloat64: { double v; std::memcpy(&v, p, 8); return v != v; }
      case DataType::kFloat16: { uint16_t b; std::memcpy(&b, p, 2); return (b & 0x7fff) > 0x7c00; }
      case DataType::kBFloat16: { uint16_t b; std::memcpy(&b, p, 2); return (b & 0x7fff) > 0x7f80; }
      default: return false;
    }
  }
};

void report(const std::string& name, const Digest& d) {
  std::printf("%-40s %016llx\n", name.c_str(), static_cast<unsigned long long>(d.h));
}

// Equal bits, or NaN on both sides.
bool sameValues(DataType dtype, const void* a, const void* b, size_t count, size_t* at) {
  const size_t size = elementSize(dtype);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < count; ++i) {
    const bool nan = Digest::isNaN(dtype, x + i * size) && Digest::isNaN(dtype, y + i * size);
    if (!nan && std::memcmp(x + i * size, y + i * size, size) != 0) {
      *at = i;
      return false;
    }
  }
  return true;
}

struct Rng {  // splitmix64
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

// Random bits (every NaN, infinity and subnormal class), with every other
// element a small value (rounding, ties and cancellation in the ordinary range).
std::vector<uint8_t> inputs(DataType dtype, size_t count, uint64_t seed) {
  Rng rng{seed};
  const size_t size = elementSize(dtype);
  std::vector<uint8_t> out(count * size);
  for (size_t i = 0; i < count; ++i) {
    uint64_t bits = rng.next();
    uint8_t* p = out.data() + i * size;
    std::memcpy(p, &bits, size);
    if (i % 2 == 1 && isFloating(dtype)) {
      const float small = static_cast<float>(static_cast<int>(bits % 4001) - 2000) / 64.0f;
      switch (dtype) {
        case DataType::kFloat32: std::memcpy(p, &small, 4); break;
        case DataType::kFloat64: { double d = small; std::memcpy(p, &d, 8); break; }
        case DataType::kFloat16: { uint16_t h = ew::floatToFp16(small); std::memcpy(p, &h, 2); break; }
        default: { uint16_t h = ew::floatToBf16(small); std::memcpy(p, &h, 2); break; }
      }
    }
    if (dtype == DataType::kBool) *p &= 1;
  }
  return out;
}

// ---------------------------------------------------------------- kernels

const DataType kDataTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                               DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                               DataType::kInt32,   DataType::kInt64,   DataType::kBool};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin,
                         ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};

// Every (dtype, op) kernel against elementwise::apply, and AVG's division.
void reduceKernels() {
  const size_t n = 4099;  // vector bodies and tails
  for (DataType dtype : kDataTypes) {
    const auto a = inputs(dtype, n, 1 + static_cast<uint64_t>(dtype));
    const auto b = inputs(dtype, n, 101 + static_cast<uint64_t>(dtype));
    for (ReduceOp op : kOps) {
      if (!unsupportedReason(dtype, op).empty()) continue;
      std::vector<uint8_t> kernel(a.size()), shared(a.size());
      reduceFunction(dtype, op)(kernel.data(), a.data(), b.data(), n);
      visitReduction(dtype, op, [&](auto elementTag, auto opTag) {
        using T = typename decltype(elementTag)::type;
        using Op = typename decltype(opTag)::type;
        using S = typename ew::Storage<T>::type;
        const auto* x = reinterpret_cast<const S*>(a.data());
        const auto* y = reinterpret_cast<const S*>(b.data());
        auto* d = reinterpret_cast<S*>(shared.data());
        for (size_t i = 0; i < n; ++i) d[i] = ew::apply<T, Op>(x[i], y[i]);
      });
      const std::string name = std::string("reduce ") + dataTypeName(dtype) + " " + reduceOpName(op);
      size_t at = 0;
      if (!sameValues(dtype, kernel.data(), shared.data(), n, &at)) {
        fail(name + ": element " + std::to_string(at) + " differs from elementwise::apply");
      }
      Digest d;
      d.values(dtype, kernel.data(), n);
      report(name, d);
    }
    if (dtype == DataType::kBool) continue;
    std::vector<uint8_t> divided = a, shared = a;
    divideInPlace(divided.data(), n, dtype, 3);
    visitReduction(dtype, ReduceOp::kSum, [&](auto elementTag, auto) {
      using T = typename decltype(elementTag)::type;
      using S = typename ew::Storage<T>::type;
      auto* x = reinterpret_cast<S*>(shared.data());
      for (size_t i = 0; i < n; ++i) x[i] = ew::divide<T>(x[i], 3);
    });
    size_t at = 0;
    const std::string name = std::string("divide ") + dataTypeName(dtype);
    if (!sameValues(dtype, divided.data(), shared.data(), n, &at)) {
      fail(name + ": element " + std::to_string(at) + " differs from elementwise::divide");
    }
    Digest d;
    d.values(dtype, divided.data(), n);
    report(name, d);
  }
}

// The fp16 conversions the kernels use (the hardware's where it has them)
// against the bit arithmetic: every half, and floats around every half.
void halfConversions() {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> widened(all.size());
  half::Fp16::widen(widened.data(), all.data(), all.size());
  std::vector<float> floats;
  for (size_t i = 0; i < all.size(); ++i) {
    const float w = ew::fp16ToFloat(all[i]);
    if (std::memcmp(&w, &widened[i], 4) != 0 && !(w != w && widened[i] != widened[i])) {
      fail("fp16 widen of " + std::to_string(i));
    }
    const uint32_t bits = ew::floatBits(w);
    for (uint32_t delta : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x2000u}) {  // ties at 0x1000
      floats.push_back(ew::bitsFloat(bits + delta));
    }
  }
  std::vector<uint16_t> narrowed(floats.size());
  half::Fp16::narrow(narrowed.data(), floats.data(), floats.size());
  for (size_t i = 0; i < floats.size(); ++i) {
    const uint16_t want = ew::floatToFp16(floats[i]);
    const bool nan = floats[i] != floats[i];
    if (narrowed[i] != want && !(nan && (narrowed[i] & 0x7fff) > 0x7c00)) {
      fail("fp16 narrow of float bits " + std::to_string(ew::floatBits(floats[i])));
      break;
    }
  }
  Digest d;
  d.values(DataType::kFloat32, widened.data(), widened.size());
  d.values(DataType::kFloat16, narrowed.data(), narrowed.size());
  report("fp16 conversions", d);
}

// Encoded bytes, except the payload of a block whose scale is NaN (it decodes
// to NaN whatever it holds).
void digestEncoding(Codec codec, const std::vector<char>& bytes, size_t count, Digest& d) {
  if (codec == Codec::kBf16) {
    d.values(DataType::kBFloat16, bytes.data(), count);
    return;
  }
  for (size_t first = 0; first < count; first += kCodecBlock) {
    const size_t n = std::min(kCodecBlock, count - first);
    const char* block = bytes.data() + encodedBytes(codec, first);
    float scale;
    std::memcpy(&scale, block, 4);
    d.values(DataType::kFloat32, &scale, 1);
    if (scale == scale) d.bytes(block + 4, encodedBytes(codec, first + n) - encodedBytes(codec, first) - 4);
  }
}

void codecs() {
  // Five full blocks (ordinary, tiny, ties, a NaN, an infinity) and a tail.
  const size_t count = 5 * kCodecBlock + 3;
  std::vector<float> x(count);
  Rng rng{7};
  for (size_t i = 0; i < count; ++i) {
    x[i] = static_cast<float>(static_cast<int64_t>(rng.next() % 20001) - 10000) / 997.0f;
  }
  for (size_t i = 0; i < kCodecBlock; ++i) x[kCodecBlock + i] *= 1e-33f;
  for (size_t i = 0; i < kCodecBlock; ++i) x[2 * kCodecBlock + i] = (static_cast<float>(i) - 127.5f) / 127.0f;
  x[3 * kCodecBlock + 17] = NAN;
  x[4 * kCodecBlock + 200] = -INFINITY;
  for (Codec codec : {Codec::kFp16, Codec::kBf16, Codec::kInt8, Codec::kInt4}) {
    const std::string name = std::string("codec ") + codecName(codec);
    std::vector<char> kernel(encodedBytes(codec, count)), shared(kernel.size());
    encode(codec, x.data(), count, kernel.data());
    encodeElementwise(codec, x.data(), count, shared.data());
    Digest k, s;
    digestEncoding(codec, kernel, count, k);
    digestEncoding(codec, shared, count, s);
    if (k.h != s.h) fail(name + ": encoding differs from block_math.h's");
    std::vector<float> decoded(count), reference(count), added(x), addedRef(x), trip(count), error(count);
    decode(codec, kernel.data(), count, decoded.data());
    decodeElementwise(codec, kernel.data(), count, reference.data(), false);
    decodeAdd(codec, kernel.data(), count, added.data());
    decodeElementwise(codec, kernel.data(), count, addedRef.data(), true);
    roundTrip(codec, x.data(), count, trip.data());
    roundTripError(codec, x.data(), count, error.data());
    size_t at = 0;
    if (!sameValues(DataType::kFloat32, decoded.data(), reference.data(), count, &at) ||
        !sameValues(DataType::kFloat32, added.data(), addedRef.data(), count, &at) ||
        !sameValues(DataType::kFloat32, trip.data(), decoded.data(), count, &at)) {
      fail(name + ": decoding differs from block_math.h's at element " + std::to_string(at));
    }
    for (size_t i = 0; i < count; ++i) {
      const float want = x[i] - decoded[i];
      if (std::memcmp(&want, &error[i], 4) != 0 && !(want != want && error[i] != error[i])) {
        fail(name + ": round-trip error at element " + std::to_string(i));
        break;
      }
    }
    for (const auto* v : {&decoded, &added, &error}) k.values(DataType::kFloat32, v->data(), count);
    report(name, k);
  }
}

// Top-k against a full sort (magnitude descending, lower index first), with
// ties and error feedback.
void topk() {
  const size_t n = 20011;
  std::vector<float> grad(n), residual(n);
  Rng rng{11};
  for (size_t i = 0; i < n; ++i) {
    grad[i] = static_cast<float>(static_cast<int64_t>(rng.next() % 2001) - 1000) / 100.0f;
    residual[i] = static_cast<float>(static_cast<int64_t>(rng.next() % 21) - 10) / 100.0f;
  }
  Digest d;
  for (size_t k : {size_t{1}, size_t{200}, size_t{5000}}) {
    std::vector<float> res = residual, values(k);
    std::vector<int32_t> indices(k);
    topkSelect(grad.data(), res.data(), n, k, values.data(), indices.data());
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = residual[i] + grad[i];
    std::vector<int32_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    std::vector<int32_t> want(order.begin(), order.begin() + static_cast<ptrdiff_t>(k));
    std::sort(want.begin(), want.end());
    bool ok = want == indices;
    for (size_t j = 0; ok && j < k; ++j) ok = values[j] == x[indices[j]] && res[indices[j]] == 0.0f;
    if (!ok) fail("topk k=" + std::to_string(k) + ": differs from a full sort");
    d.bytes(values.data(), k * 4);
    d.bytes(indices.data(), k * 4);
    d.bytes(res.data(), n * 4);
  }
  report("topk select", d);
}

// DiLoCo's round passes against their arithmetic written out per element (torch's ops: one
// rounding each, x.add_(y, alpha=a) one fused multiply-add), for every flag combination.
void outerSteps() {
  const size_t sizes[] = {37, 1, 1001, 64};  // parameters of odd lengths: vector loops' tails
  size_t n = 0;
  for (size_t count : sizes) n += count;
  Rng rng{23};
  auto value = [&](float scale) {
    return static_cast<float>(static_cast<int64_t>(rng.next() % 20001) - 10000) * scale;
  };
  std::vector<float> params0(n), theta0(n), avg(n), buffer0(n), residual(n);
  for (size_t i = 0; i < n; ++i) {
    params0[i] = value(1e-4f);
    theta0[i] = value(1e-4f);
    avg[i] = value(1e-6f);
    buffer0[i] = value(1e-6f);
    residual[i] = value(1e-7f);
  }
  auto spans = [&](std::vector<float>& flat) {
    std::vector<FloatSpan> out;
    size_t at = 0;
    for (size_t count : sizes) {
      out.push_back(FloatSpan{flat.data() + at, count});
      at += count;
    }
    return out;
  };
  Digest d;
  std::vector<float> params = params0, out(n), sent(n);
  roundDelta(spans(params), theta0.data(), out.data(), residual.data(), sent.data());
  for (size_t i = 0; i < n; ++i) {
    const float want = params0[i] - theta0[i];
    if (out[i] != want || sent[i] != want + residual[i]) {
      fail("diloco delta at " + std::to_string(i));
      break;
    }
  }
  d.bytes(out.data(), n * 4);
  d.bytes(sent.data(), n * 4);
  for (int flags = 0; flags < 16; ++flags) {
    const OuterStep step{0.7f, (flags & 1) ? 0.9f : 0.0f, (flags & 2) != 0, (flags & 4) != 0,
                         (flags & 8) != 0, 0.25f, 0.75f};
    std::vector<float> p = params0, theta = theta0, buffer = buffer0;
    outerStep(spans(p), theta.data(), avg.data(), step.momentum != 0 ? buffer.data() : nullptr,
              step);
    for (size_t i = 0; i < n; ++i) {
      const float g = -avg[i];
      float direction = g, b = buffer0[i];
      if (step.momentum != 0) {
        b = step.firstRound ? g : buffer0[i] * step.momentum + g;
        direction = step.nesterov ? std::fma(b, step.momentum, g) : b;
      }
      const float t = std::fma(direction, -step.lr, theta0[i]);
      const float q = step.mix ? std::fma(t, step.oneMinusAlpha, params0[i] * step.alpha) : t;
      if (theta[i] != t || p[i] != q || buffer[i] != b) {
        fail("diloco outer step, flags " + std::to_string(flags) + ", at " + std::to_string(i));
        break;
      }
    }
    d.bytes(theta.data(), n * 4);
    d.bytes(p.data(), n * 4);
    d.bytes(buffer.data(), n * 4);
  }
  report("diloco round passes", d);
}

void crc() {
  const char check[] = "123456789";
  if (crc32cExtend(0, check, 9) != 0xe3069283u) fail("crc32c of 123456789 is not e3069283");
  Digest d;
  std::vector<uint8_t> buffer(300);
  Rng rng{5};
  for (auto& b : buffer) b = static_cast<uint8_t>(rng.next());
  for (size_t len = 0; len <= buffer.size(); ++len) {
    const uint32_t c = crc32cExtend(0, buffer.data(), len);
    d.bytes(&c, 4);
  }
  report("crc32c", d);
}

// ---------------------------------------------------------------- a two-rank group

class MemoryRendezvous : public Rendezvous {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
    changed_.notify_all();
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!changed_.wait_for(lock, timeout, [&] { return values_.count(key) != 0; })) {
      throw TimeoutError("engine check: no key " + key);
    }
    return values_[key];
  }
  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return values_.count(key) != 0;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& v = values_[key];
    int64_t now = 0;
    if (!v.empty()) std::memcpy(&now, v.data(), 8);
    now += delta;
    v.resize(8);
    std::memcpy(v.data(), &now, 8);
    changed_.notify_all();
    return now;
  }
  std::vector<uint8_t> setFirst(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.emplace(key, value).first;
    changed_.notify_all();
    return it->second;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>> values_;
};

constexpr auto kOpTimeout = std::chrono::seconds(120);

// One rank's operations; returns its results, each checked against its closed form.
std::vector<float> runRank(Communicator& comm) {
  const int rank = comm.rank();
  std::vector<float> results;
  for (size_t n : {size_t{7}, (size_t{1} << 18) + 7}) {  // one round; ring (or single copy)
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 13) + static_cast<float>(rank);
    comm.beginOp(OpType::kAllreduce, kOpTimeout);
    allreduce(comm, x.data(), n, DataType::kFloat32, ReduceOp::kSum);
    for (size_t i = 0; i < n; ++i) {
      if (x[i] != 2.0f * static_cast<float>(i % 13) + 1.0f) throw Error("allreduce float32 SUM");
    }
    results.insert(results.end(), x.begin(), x.begin() + 7);
  }
  std::vector<uint16_t> h(3001);
  for (size_t i = 0; i < h.size(); ++i) h[i] = ew::floatToBf16(static_cast<float>(i % 9 + rank));
  comm.beginOp(OpType::kAllreduce, kOpTimeout);
  allreduce(comm, h.data(), h.size(), DataType::kBFloat16, ReduceOp::kMax);
  for (size_t i = 0; i < h.size(); ++i) {
    if (ew::bf16ToFloat(h[i]) != static_cast<float>(i % 9 + 1)) throw Error("allreduce bf16 MAX");
  }
  std::vector<int64_t> mine(5, rank * 10), gathered(10);
  void* outputs[2] = {gathered.data(), gathered.data() + 5};
  comm.beginOp(OpType::kAllgather, kOpTimeout);
  allgather(comm, mine.data(), outputs, 5, DataType::kInt64);
  if (gathered[0] != 0 || gathered[9] != 10) throw Error("allgather int64");
  // No libm in the inputs: its last bits may differ between architectures.
  auto value = [](size_t i, int r) {
    return static_cast<float>(static_cast<int>((i * 37 + static_cast<size_t>(r) * 11) % 200) - 100) / 64.0f;
  };
  std::vector<float> c(1000);
  for (size_t i = 0; i < c.size(); ++i) c[i] = value(i, rank);
  comm.beginOp(OpType::kCompressedAllreduce, kOpTimeout);
  compressedAllreduce(comm, c.data(), c.size(), Codec::kInt8, true);
  for (size_t i = 0; i < c.size(); ++i) {  // two roundings of half a step (max 100/64 / 127)
    if (std::fabs(c[i] - (value(i, 0) + value(i, 1)) / 2) > 2.0f * (100.0f / 64.0f) / 127.0f) {
      throw Error("compressed allreduce int8 AVG");
    }
  }
  results.insert(results.end(), c.begin(), c.end());
  comm.beginOp(OpType::kBarrier, kOpTimeout);
  barrier(comm);
  return results;
}

void twoRanks(TransportPolicy transport, const char* name) {
  auto rendezvous = std::make_shared<MemoryRendezvous>();
  std::vector<std::unique_ptr<Communicator>> comms(2);
  std::vector<std::vector<float>> results(2);
  std::vector<std::string> errors(2);
  std::vector<std::string> transports(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        MeshOptions options;
        options.bindIp = "127.0.0.1";
        options.timeout = std::chrono::seconds(60);
        options.transport = transport;
        Mesh mesh = connectMesh(*rendezvous, rank, 2, options);
        transports[rank] = mesh.transportOf[1 - rank];
        comms[rank] = std::make_unique<Communicator>(rank, 2, std::move(mesh.channels),
                                                     std::move(mesh.ring), std::move(mesh.hostOf),
                                                     rendezvous, CollectiveOptions{});
        results[rank] = runRank(*comms[rank]);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    if (!errors[rank].empty()) fail(std::string(name) + ": rank " + std::to_string(rank) + ": " + errors[rank]);
  }
  if (results[0] != results[1]) fail(std::string(name) + ": the ranks' results differ");
  if (transports[0] != (transport == TransportPolicy::kTcp ? "tcp" : "shm")) {
    fail(std::string(name) + ": linked by " + transports[0]);
  }
  Digest d;
  d.values(DataType::kFloat32, results[0].data(), results[0].size());
  report(name, d);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--family") == 0) {
    if (!selectKernelFamily(argv[2])) {
      std::printf("this CPU cannot run kernel family %s\n", argv[2]);
      return 2;
    }
  } else if (argc != 1) {
    std::printf("usage: ringdist_engine_check [--family generic|avx2|neon]\n");
    return 2;
  }
  std::printf("kernel family %s, hardware crc32c %s\n", kernelFamily(),
              cpuFeatures().crc32 ? "yes" : "no");
  try {
    reduceKernels();
    halfConversions();
    codecs();
    topk();
    outerSteps();
    crc();
    twoRanks(TransportPolicy::kAuto, "two ranks, shared memory");
    twoRanks(TransportPolicy::kTcp, "two ranks, tcp");
  } catch (const std::exception& e) {
    fail(std::string("uncaught: ") + e.what());
  }
  std::printf("%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
