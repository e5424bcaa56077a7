#pragma once

#include <torch/csrc/utils/pybind.h>

namespace ringdist {

// torch_ringdist._C.testing: the CPU reduce kernels and the element
// arithmetic they share with the CUDA kernels (csrc/reduce/elementwise.h),
// each callable on tensors, so tests compare the two bit for bit on any
// machine, GPU or not.
void defineTestingModule(pybind11::module_& parent);

}  // namespace ringdist
