#pragma once

#include <cstddef>
#include <vector>

namespace ringdist {

// DiLoCo's host work in a round, one pass over a fragment each time it is touched
// (torch_ringdist/hooks/diloco.py runs these on float32 CPU fragments). Each element gets the
// bits of the torch ops written out in diloco.py as torch computes them on an x86-64 CPU with
// FMA (x.add_(y, alpha=a) is one fused multiply-add there, every other op rounds once), in both
// kernel families. Parameters are read and written in place: no flat copy of them.

// One parameter's elements; a fragment is its parameters one after another.
struct FloatSpan {
  float* data;
  size_t count;
};

// out = params - theta; sent (unless null) = out + residual (residual null: out). What a rank
// sends and keeps (for a redo or eager overlap) at the start of a round.
void roundDelta(const std::vector<FloatSpan>& params, const float* theta, float* out,
                const float* residual, float* sent);

struct OuterStep {
  float lr;
  float momentum;    // 0: plain SGD, no buffer
  bool nesterov;
  bool firstRound;   // the buffer starts as the gradient (torch.optim.SGD's first step)
  bool mix;          // params <- alpha * params + (1 - alpha) * theta; else params <- theta
  float alpha;
  float oneMinusAlpha;  // 1 - alpha as the caller rounds it (Python: in double, then float)
};

// theta <- theta stepped by torch.optim.SGD(foreach=False) with gradient -avg and `buffer` as
// its momentum buffer; then the params from the new theta (mixed, or set to it).
void outerStep(const std::vector<FloatSpan>& params, float* theta, const float* avg,
               float* buffer, const OuterStep& step);

}  // namespace ringdist
