#pragma once

#include <cstddef>
#include <cstdint>

namespace ringdist {

// Top-k sparsification of a gradient bucket with error feedback, the CPU work
// of the `topk` DDP hook in two fused passes instead of several torch ops.
//
// Terms:
//   magnitude  |x| compared as the bits of x without the sign: the same order
//              as |x| for numbers, and NaN above infinity (as torch.topk).
//   selected   the k entries with the largest magnitude; equal magnitudes are
//              broken by the lower index, so the choice is deterministic.
//   residual   error feedback: what was not sent, added to the next step.
//
// x = grad + residual (residual may be null: x = grad). Writes the selected
// entries to values[0..k) and indices[0..k), in increasing index order. With
// a residual it becomes x with the selected entries set to zero. grad is read
// only. k <= n < 2^31.
void topkSelect(const float* grad, float* residual, size_t n, size_t k, float* values,
                int32_t* indices);

// Dense result of an allgather of every rank's selection: out[0..n) is zero
// except out[indices[r][j]] += values[r][j] / world, added in rank order
// 0..world-1 (so every rank gets bitwise the same result). parts holds world
// blocks of [k values][k int32 indices]. Throws on an index outside [0, n).
void topkScatter(const float* parts, size_t world, size_t k, size_t n, float* out);

}  // namespace ringdist
