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

// Bytes over each rank's link each way, the same for both routes.
double linkBytes(ModelledOp op, int n, size_t bytes) {
  const double s = static_cast<double>(bytes);
  return op == ModelledOp::kAllreduce ? 2.0 * (n - 1) / n * s : (n - 1.0) * s;
}

}  // namespace

double RouteModel::ringUs(ModelledOp op, int n, size_t bytes) const {
  const int trips = op == ModelledOp::kAllreduce ? 2 * (n - 1) : n - 1;
  return trips * alphaUs + linkBytes(op, n, bytes) * betaUsPerByte;
}

double RouteModel::directUs(ModelledOp op, int n, size_t bytes) const {
  const double s = static_cast<double>(bytes);
  const double reduced = op == ModelledOp::kAllreduce     ? (n - 1.0) / n * s
                         : op == ModelledOp::kReduceScatter ? (n - 1.0) * s
                                                            : 0.0;
  const int trips = op == ModelledOp::kAllreduce ? 2 : 1;
  return trips * alphaUs + linkBytes(op, n, bytes) * betaUsPerByte + reduced * rhoUsPerByte;
}

bool RouteModel::directWins(ModelledOp op, int n, size_t bytes) const {
  return directAllowed(n) && directUs(op, n, bytes) <= kDirectGain * ringUs(op, n, bytes);
}

}  // namespace ringdist
