#pragma once

// libtorch_ringdist.so is built with hidden visibility: only what is marked
// TORCH_RINGDIST_API is exported (the C++ API, the backend class and what the
// Python module binds).
#define TORCH_RINGDIST_API __attribute__((visibility("default")))
