#include "csrc/reduce/outer_step.h"

#include <cmath>
#include <cstring>

#include "csrc/common/cpu.h"
#include "csrc/reduce/half.h"  // RD_INLINE

// Written once as always-inline templates, instantiated as the reduce kernels are: a baseline
// family and, on x86-64, an AVX2+FMA one (there std::fma is one instruction and the loops
// vectorise). std::fma rounds once in either, so both give the same bits.

namespace ringdist {

namespace {

template <bool kResidual, bool kSent>
RD_INLINE void deltaSpan(const float* p, const float* theta, float* out, const float* residual,
                         float* sent, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float d = p[i] - theta[i];
    out[i] = d;
    if constexpr (kSent) sent[i] = kResidual ? d + residual[i] : d;
  }
}

template <bool kResidual, bool kSent>
RD_INLINE void deltaAll(const std::vector<FloatSpan>& params, const float* theta, float* out,
                        const float* residual, float* sent) {
  size_t at = 0;
  for (const FloatSpan& span : params) {
    deltaSpan<kResidual, kSent>(span.data, theta + at, out + at, kResidual ? residual + at : nullptr,
                                kSent ? sent + at : nullptr, span.count);
    at += span.count;
  }
}

// One parameter's elements: g = -avg; torch.optim.SGD's momentum (buf.mul_(mu).add_(g)),
// Nesterov (g.add_(buf, alpha=mu)) and step (theta.add_(step, alpha=-lr)); then the parameter.
template <bool kMomentum, bool kFirst, bool kNesterov, bool kMix>
RD_INLINE void stepSpan(float* p, float* theta, const float* avg, float* buffer, size_t n,
                        const OuterStep& s) {
  for (size_t i = 0; i < n; ++i) {
    const float g = -avg[i];
    float step = g;
    if constexpr (kMomentum) {
      const float b = kFirst ? g : buffer[i] * s.momentum + g;
      buffer[i] = b;
      step = kNesterov ? std::fma(b, s.momentum, g) : b;
    }
    const float t = std::fma(step, -s.lr, theta[i]);
    theta[i] = t;
    p[i] = kMix ? std::fma(t, s.oneMinusAlpha, p[i] * s.alpha) : t;
  }
}

template <bool kMomentum, bool kFirst, bool kNesterov, bool kMix>
RD_INLINE void stepAll(const std::vector<FloatSpan>& params, float* theta, const float* avg,
                       float* buffer, const OuterStep& s) {
  size_t at = 0;
  for (const FloatSpan& span : params) {
    stepSpan<kMomentum, kFirst, kNesterov, kMix>(span.data, theta + at, avg + at,
                                                 kMomentum ? buffer + at : nullptr, span.count, s);
    at += span.count;
  }
}

// Each family picks the loop for the run-time flags (3 delta loops, 10 step loops).
#define RD_OUTER_FAMILY(FAMILY, ATTR)                                                         \
  ATTR void FAMILY##_delta(const std::vector<FloatSpan>& params, const float* theta,            \
                           float* out, const float* residual, float* sent) {                    \
    if (sent == nullptr) return deltaAll<false, false>(params, theta, out, nullptr, nullptr);   \
    if (residual == nullptr) return deltaAll<false, true>(params, theta, out, nullptr, sent);   \
    deltaAll<true, true>(params, theta, out, residual, sent);                                   \
  }                                                                                             \
  template <bool kMomentum, bool kFirst, bool kNesterov>                                        \
  ATTR void FAMILY##_stepMix(const std::vector<FloatSpan>& params, float* theta,                \
                             const float* avg, float* buffer, const OuterStep& s) {             \
    if (s.mix) return stepAll<kMomentum, kFirst, kNesterov, true>(params, theta, avg, buffer, s); \
    stepAll<kMomentum, kFirst, kNesterov, false>(params, theta, avg, buffer, s);                \
  }                                                                                             \
  ATTR void FAMILY##_step(const std::vector<FloatSpan>& params, float* theta, const float* avg, \
                          float* buffer, const OuterStep& s) {                                  \
    if (s.momentum == 0.0f) return FAMILY##_stepMix<false, false, false>(params, theta, avg,    \
                                                                         nullptr, s);           \
    if (s.firstRound) {                                                                         \
      if (s.nesterov) return FAMILY##_stepMix<true, true, true>(params, theta, avg, buffer, s); \
      return FAMILY##_stepMix<true, true, false>(params, theta, avg, buffer, s);                \
    }                                                                                           \
    if (s.nesterov) return FAMILY##_stepMix<true, false, true>(params, theta, avg, buffer, s);  \
    FAMILY##_stepMix<true, false, false>(params, theta, avg, buffer, s);                        \
  }

RD_OUTER_FAMILY(generic, )
#if defined(RINGDIST_X86)
RD_OUTER_FAMILY(avx2, __attribute__((target("avx2,fma"))))
#define RD_OUTER_PICK(NAME) (useVectorKernels() ? &avx2_##NAME : &generic_##NAME)
#else
#define RD_OUTER_PICK(NAME) (&generic_##NAME)
#endif

}  // namespace

void roundDelta(const std::vector<FloatSpan>& params, const float* theta, float* out,
                const float* residual, float* sent) {
  RD_OUTER_PICK(delta)(params, theta, out, residual, sent);
}

void outerStep(const std::vector<FloatSpan>& params, float* theta, const float* avg,
               float* buffer, const OuterStep& step) {
  RD_OUTER_PICK(step)(params, theta, avg, buffer, step);
}

}  // namespace ringdist
