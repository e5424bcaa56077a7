# ringdist_python_module(NAME SOURCES...): a Python extension module built as
# torch.utils.cpp_extension builds one: against torch's bundled pybind11 headers
# (under torch/include, so its classes interoperate with torch's, e.g.
# c10d::Backend), linked with libtorch_python, for the Python that has this torch.

find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)

execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
    "import torch; print(torch.__version__)"
  OUTPUT_VARIABLE RINGDIST_PYTHON_TORCH_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _torch_python_rc)
if(NOT _torch_python_rc EQUAL 0)
  message(FATAL_ERROR "torch_ringdist: ${Python3_EXECUTABLE} cannot import torch")
endif()
if(NOT RINGDIST_PYTHON_TORCH_VERSION MATCHES "^${TORCH_VERSION_MINOR}\\.")
  message(FATAL_ERROR "torch_ringdist: ${Python3_EXECUTABLE} has torch ${RINGDIST_PYTHON_TORCH_VERSION}, "
                      "but the build found torch ${TORCH_VERSION} at ${TORCH_PREFIX}")
endif()
set(RINGDIST_TORCH_PYTHON "${TORCH_LIBRARY_DIR}/libtorch_python.so")
if(NOT EXISTS "${RINGDIST_TORCH_PYTHON}")
  message(FATAL_ERROR "torch_ringdist: ${RINGDIST_TORCH_PYTHON} not found")
endif()

function(ringdist_python_module name)
  Python3_add_library(${name} MODULE WITH_SOABI ${ARGN})
  target_compile_definitions(${name} PRIVATE TORCH_EXTENSION_NAME=${name} TORCH_API_INCLUDE_EXTENSION_H)
  target_link_libraries(${name} PRIVATE "${RINGDIST_TORCH_PYTHON}")
endfunction()
