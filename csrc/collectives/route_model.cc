#include "csrc/collectives/route_model.h"

#include "csrc/common/options.h"

namespace ringdist {

RouteModel RouteModel::forRoundTrip(uint32_t roundTripUs) {
  RouteModel m;
  m.alphaUs = roundTripUs / 2.0;
  m.betaUsPerByte = 8 / (kRingFillBitsPerSecond / 1e6);
  m.rhoUsPerByte = 1 / kReduceBytesPerUs;
  return m;
}

namespace {
// Bytes each rank sends (and receives) in a reduce-scatter and an allgather: 2(N-1)/N of it.
double linkBytes(int n, size_t bytes) { return 2.0 * (n - 1) / n * static_cast<double>(bytes); }
}  // namespace

double RouteModel::ringUs(int n, size_t bytes) const {
  return 2.0 * (n - 1) * alphaUs + linkBytes(n, bytes) * betaUsPerByte;
}

double RouteModel::directUs(int n, size_t bytes) const {
  const double reduced = (n - 1.0) / n * static_cast<double>(bytes);  // N-1 shares of our chunk
  return 2.0 * alphaUs + linkBytes(n, bytes) * betaUsPerByte + reduced * rhoUsPerByte;
}

bool RouteModel::directWins(int n, size_t bytes) const {
  return n >= 3 && n <= kMaxDirectRanks && directUs(n, bytes) <= kDirectGain * ringUs(n, bytes);
}

}  // namespace ringdist
