#pragma once

// The alpha-beta model (glossary: route model) from which a collective across hosts picks its
// route: the ring, the direct exchange, recursive halving-doubling or, for two hosts, the pair
// exchange. Its inputs are the same on
// every rank (the group's agreed round trip and constants), so every rank picks the same route.
//
//   alpha  one-way latency of the group's longest link: half the round trip agreed at connect
//   beta   time per byte of a host's link: the group's measured rate (below), and until one is
//          agreed kRingFillBitsPerSecond (the fastest link the rings fill)
//   rho    time per byte of reducing on one core (kReduceBytesPerUs)
//
// With N ranks, one per host, S the allreduce's buffer (b = one rank's block for allgather and
// reduce-scatter), P the largest power of two <= N and R = N - P:
//
//   allreduce       ring     2(N-1) alpha + 2(N-1)/N S beta
//                   direct   2 alpha      + 2(N-1)/N S beta + reducing (N-1)/N S
//                   halving  2 log2(P) alpha + 2(P-1)/P S beta, and with R > 0
//                            2 alpha + 2 S beta more (the pairs that fold N onto P ranks)
//                   pair     alpha + S max(beta, rho)   (N = 2: each sends its whole buffer
//                            and reduces the other's as it arrives)
//   allgather       ring (N-1) alpha        direct alpha               (+ (N-1) b beta each)
//   reduce-scatter  ring (N-1) alpha        direct alpha + reducing (N-1) b
//   broadcast       chain N alpha + S beta  direct 2 alpha + 2(N-1)/N S beta (scatter, allgather)
//
// (the ring and halving-doubling overlap their reductions with the transfers; the direct
// exchange reduces once every share arrived). A route other than the ring is taken where it is
// predicted at most kRouteGain of the ring's time, the fastest such; the pair exchange at most
// kPairGain of it: it moves the ring's bytes over the ring's one link, so the margin for costs
// the model leaves out (incast, many flows) has little to cover, and it forwards nothing, so a
// lost packet holds back only its own bytes, never the link's next sends.
//
// The rate is measured, not configured: every allreduce of at least kRateSampleBytes on a
// group the model serves (one rank per host, 2 or more) times itself, and the rate at which the
// model would have predicted that time (rateFromSample) is a sample; every kRateAgreeEvery such
// calls the group agrees on the slowest rank's best sample since the last agreement (a 16-byte
// allreduce before the call), so every rank keeps the same model and a link that slows down is
// seen within two rounds of samples. The rate so measured is the route's rate end to end
// (links, sealing, reductions), what the model's beta stands for. The same allreduce agrees on
// the round trip again: each rank's longest link's TCP min_rtt now, a minimum over a window
// (net.ipv4.tcp_min_rtt_wlen, 300 s by default), so a round trip that shrinks is seen at the
// next agreement and one that grows once the window has passed over the shorter samples.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace ringdist {

// Reducing float32 on one core of a loaded 2-core machine: 0.9-2.6 GB/s measured (the slower
// end, so the model errs towards the ring).
constexpr double kReduceBytesPerUs = 1000;
// A route other than the ring: its predicted time at most this fraction of the ring's.
constexpr double kRouteGain = 0.8;
// The pair exchange: at most this fraction. On two emulated hosts at 1 Gbit/s (docs/wan.md) it
// beat the ring at RTT 100 ms by up to 21% without loss and 30% with 0.1% loss; at RTT 10 ms and
// 16 MiB, where it is predicted 3.5% faster, runs put either route ahead by 8-14%: below a 5%
// predicted gain the emulated links cannot tell them apart, and the ring stays.
constexpr double kPairGain = 0.95;
// Allreduces of at least this many bytes give rate samples (the bandwidth term dominates).
constexpr size_t kRateSampleBytes = 1 << 20;
// The group agrees on its rate before every this many sampled allreduces.
constexpr uint64_t kRateAgreeEvery = 32;
// The direct exchange up to this many ranks: beyond, each peer's share is small and N-1 flows
// share each host's link at once; halving-doubling is the route that scales.
constexpr int kMaxDirectRanks = 16;

enum class ModelledOp { kAllreduce, kAllgather, kReduceScatter, kBroadcast };
// The largest power of two <= n: the ranks halving-doubling folds n onto.
int powerOfTwoBelow(int n);
enum class Route : uint8_t { kRing, kDirect, kHalvingDoubling, kPair };
const char* routeName(Route route);

struct RouteModel {
  double alphaUs = 0;  // one-way latency
  double betaUsPerByte = 0;
  double rhoUsPerByte = 0;

  // The model of a group whose longest link has this round trip; links of `bitsPerSecond`.
  static RouteModel forLink(uint32_t roundTripUs, double bitsPerSecond);
  static RouteModel forRoundTrip(uint32_t roundTripUs);  // links taken as kRingFillBitsPerSecond
  // Whether a group of n ranks, one per host, may take `route` for `op` at all.
  static bool allowed(Route route, ModelledOp op, int n);
  // Predicted time (us) of `op` over n ranks, one per host, by `route` (an allowed one);
  // `bytes`: the allreduce's buffer, or one rank's block.
  double timeUs(Route route, ModelledOp op, int n, size_t bytes) const;
  // The route for it: the fastest allowed one predicted at most kRouteGain of the ring's time,
  // else the ring.
  Route best(ModelledOp op, int n, size_t bytes) const;
  // The link rate (bits/s) at which `route` would take `us` for `op`; +inf where the latency
  // and reduction terms alone account for it (no bandwidth to measure).
  double rateFromSample(Route route, ModelledOp op, int n, size_t bytes, double us) const;
  // Every allowed route's predicted time (us), by routeName.
  std::map<std::string, double> timesUs(ModelledOp op, int n, size_t bytes) const;
};

}  // namespace ringdist
