#pragma once

#include <torch/csrc/utils/pybind.h>

namespace ringdist {

// torch_ringdist._C.testing: the kernels on tensors of csrc/backend/testing.h.
void defineTestingModule(pybind11::module_& parent);

}  // namespace ringdist
