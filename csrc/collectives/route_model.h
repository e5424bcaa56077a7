#pragma once

// The alpha-beta model (glossary: route model) from which a collective across hosts picks
// between its ring and the direct exchange. Its inputs are the same on every rank (the group's
// agreed round trip and constants), so every rank picks the same route.
//
//   alpha  one-way latency of the group's longest link: half the round trip agreed at connect
//   beta   time per byte of a host's link: kRingFillBitsPerSecond, the fastest link the rings
//          fill; a slower link adds the same bandwidth term to both routes
//   rho    time per byte of reducing on one core (kReduceBytesPerUs)
//
// With N ranks, one per host, and S the allreduce's buffer (b = one rank's block for
// allgather and reduce-scatter), each route moves the same bytes over each host's link:
//
//   allreduce       ring 2(N-1) alpha               direct 2 alpha + reducing (N-1)/N S
//   allgather       ring (N-1) alpha                direct alpha
//   reduce-scatter  ring (N-1) alpha                direct alpha + reducing (N-1) b
//
// (the rings overlap their reductions with the transfers; the direct exchange reduces once
// every share arrived). The direct exchange is taken where it is predicted at most
// kDirectGain of the ring's time.

#include <cstddef>
#include <cstdint>

namespace ringdist {

// Reducing float32 on one core of a loaded 2-core machine: 0.9-2.6 GB/s measured (the slower
// end, so the model errs towards the ring).
constexpr double kReduceBytesPerUs = 1000;
// The direct exchange's predicted time at most this fraction of the ring's.
constexpr double kDirectGain = 0.8;
// Up to this many ranks: beyond, each peer's share is small and N-1 flows share each host's
// link at once (recursive halving-doubling is the route that scales; not built yet).
constexpr int kMaxDirectRanks = 16;

enum class ModelledOp { kAllreduce, kAllgather, kReduceScatter };

struct RouteModel {
  double alphaUs = 0;  // one-way latency
  double betaUsPerByte = 0;
  double rhoUsPerByte = 0;

  // The model of a group whose longest link has this round trip.
  static RouteModel forRoundTrip(uint32_t roundTripUs);
  // Predicted times (us) of `op` over n ranks, one per host; `bytes`: the allreduce's buffer,
  // or one rank's block.
  double ringUs(ModelledOp op, int n, size_t bytes) const;
  double directUs(ModelledOp op, int n, size_t bytes) const;
  // Whether a group of n ranks, one per host, may take the direct exchange at all.
  static bool directAllowed(int n) { return n >= 3 && n <= kMaxDirectRanks; }
  // Whether the direct exchange is the route for it.
  bool directWins(ModelledOp op, int n, size_t bytes) const;
};

}  // namespace ringdist
