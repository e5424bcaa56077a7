#include "csrc/collectives/route_model.h"

#include <algorithm>
#include <limits>

#include "csrc/common/options.h"

namespace ringdist {

const char* routeName(Route route) {
  switch (route) {
    case Route::kDirect: return "direct";
    case Route::kHalvingDoubling: return "halving-doubling";
    case Route::kPair: return "pair";
    default: return "ring";
  }
}

RouteModel RouteModel::forLink(uint32_t roundTripUs, double bitsPerSecond) {
  RouteModel m;
  m.alphaUs = roundTripUs / 2.0;
  m.betaUsPerByte = 8 / (bitsPerSecond / 1e6);
  m.rhoUsPerByte = 1 / kReduceBytesPerUs;
  return m;
}

RouteModel RouteModel::forRoundTrip(uint32_t roundTripUs) {
  return forLink(roundTripUs, kRingFillBitsPerSecond);
}

bool RouteModel::allowed(Route route, ModelledOp op, int n) {
  switch (route) {
    case Route::kDirect: return n >= 2 && n <= kMaxDirectRanks;
    case Route::kHalvingDoubling: return n >= 3 && op == ModelledOp::kAllreduce;
    case Route::kPair: return n == 2 && op == ModelledOp::kAllreduce;
    default: return true;
  }
}

int powerOfTwoBelow(int n) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

namespace {

int log2Of(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}

}  // namespace

double RouteModel::timeUs(Route route, ModelledOp op, int n, size_t bytes) const {
  const double s = static_cast<double>(bytes);
  if (op == ModelledOp::kBroadcast) {  // the chain (and its acknowledgement) or scatter-allgather
    return route == Route::kDirect ? 2 * alphaUs + 2.0 * (n - 1) / n * s * betaUsPerByte
                                   : n * alphaUs + s * betaUsPerByte;
  }
  if (route == Route::kPair) return alphaUs + s * std::max(betaUsPerByte, rhoUsPerByte);
  const bool allreduce = op == ModelledOp::kAllreduce;
  // Bytes over each rank's link each way, the same for the ring and the direct exchange.
  const double linkBytes = allreduce ? 2.0 * (n - 1) / n * s : (n - 1.0) * s;
  switch (route) {
    case Route::kDirect: {
      const double reduced = allreduce                              ? (n - 1.0) / n * s
                             : op == ModelledOp::kReduceScatter ? (n - 1.0) * s
                                                                : 0.0;
      return (allreduce ? 2 : 1) * alphaUs + linkBytes * betaUsPerByte + reduced * rhoUsPerByte;
    }
    case Route::kHalvingDoubling: {
      const int p = powerOfTwoBelow(n);
      const double folded = p < n ? 2 * alphaUs + 2 * s * betaUsPerByte : 0.0;
      return 2 * log2Of(p) * alphaUs + 2.0 * (p - 1) / p * s * betaUsPerByte + folded;
    }
    default: return (allreduce ? 2 * (n - 1) : n - 1) * alphaUs + linkBytes * betaUsPerByte;
  }
}

Route RouteModel::best(ModelledOp op, int n, size_t bytes) const {
  const double ring = timeUs(Route::kRing, op, n, bytes);
  Route chosen = Route::kRing;
  double fastest = 0;
  for (Route route : {Route::kDirect, Route::kHalvingDoubling, Route::kPair}) {  // ties: the earlier
    if (!allowed(route, op, n)) continue;
    const double t = timeUs(route, op, n, bytes);
    const bool gains = t <= (route == Route::kPair ? kPairGain : kRouteGain) * ring;
    if (gains && (chosen == Route::kRing || t < fastest)) {
      chosen = route;
      fastest = t;
    }
  }
  return chosen;
}

double RouteModel::rateFromSample(Route route, ModelledOp op, int n, size_t bytes,
                                  double us) const {
  if (route == Route::kPair) {  // the link's rate shows only where it is slower than reducing
    const double perByte = (us - alphaUs) / static_cast<double>(bytes);
    return perByte > rhoUsPerByte ? 8e6 / perByte : std::numeric_limits<double>::infinity();
  }
  RouteModel fixed = *this;  // the terms that do not depend on the rate
  fixed.betaUsPerByte = 0;
  const double rest = fixed.timeUs(route, op, n, bytes);
  fixed.betaUsPerByte = 1;
  const double perBeta = fixed.timeUs(route, op, n, bytes) - rest;  // bytes on the link
  if (us <= rest || perBeta <= 0) return std::numeric_limits<double>::infinity();
  return 8e6 / ((us - rest) / perBeta);
}

std::map<std::string, double> RouteModel::timesUs(ModelledOp op, int n, size_t bytes) const {
  std::map<std::string, double> out;
  for (Route route : {Route::kRing, Route::kDirect, Route::kHalvingDoubling, Route::kPair}) {
    if (allowed(route, op, n)) out[routeName(route)] = timeUs(route, op, n, bytes);
  }
  return out;
}

}  // namespace ringdist
