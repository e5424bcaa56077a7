# torch for building ringdist itself: the interface target torch_ringdist_torch
# with the headers and libraries of an installed torch (a pip wheel or LibTorch),
# as torch.utils.cpp_extension compiles extensions.
#
# Not find_package(Torch): for a CUDA build of torch that call requires a CUDA
# toolkit at configure time, and most pip users have a CUDA torch but no nvcc;
# ringdist then builds CPU-only. (Users of the installed package do call
# find_package(Torch): TorchRingdistConfig.cmake.)
#
# Sets TORCH_PREFIX, TORCH_INCLUDE_DIR, TORCH_LIBRARY_DIR, TORCH_VERSION,
# TORCH_VERSION_MINOR ("2.13"), TORCH_CXX_STANDARD and TORCH_IS_CUDA.

function(ringdist_find_torch_config out)
  set(candidates)
  if(Torch_DIR)
    list(APPEND candidates "${Torch_DIR}")
  endif()
  foreach(prefix IN LISTS CMAKE_PREFIX_PATH)
    list(APPEND candidates "${prefix}/Torch" "${prefix}/share/cmake/Torch")
  endforeach()
  foreach(dir IN LISTS candidates)
    if(EXISTS "${dir}/TorchConfig.cmake")
      get_filename_component(dir "${dir}" ABSOLUTE)
      set(${out} "${dir}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  # Last: the torch of the Python on PATH.
  find_package(Python3 QUIET COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(prefix AND EXISTS "${prefix}/Torch/TorchConfig.cmake")
      set(${out} "${prefix}/Torch" PARENT_SCOPE)
      return()
    endif()
  endif()
  message(FATAL_ERROR
    "torch_ringdist: torch not found. Pass its CMake folder: "
    "-DCMAKE_PREFIX_PATH=\"$(python -c 'import torch; print(torch.utils.cmake_prefix_path)')\"")
endfunction()

function(ringdist_torch_version config_dir out)
  include("${config_dir}/TorchConfigVersion.cmake")  # sets PACKAGE_VERSION (this scope only)
  set(${out} "${PACKAGE_VERSION}" PARENT_SCOPE)
endfunction()

ringdist_find_torch_config(TORCH_CONFIG_DIR)
get_filename_component(TORCH_PREFIX "${TORCH_CONFIG_DIR}/../../.." ABSOLUTE)
set(TORCH_INCLUDE_DIR "${TORCH_PREFIX}/include")
set(TORCH_LIBRARY_DIR "${TORCH_PREFIX}/lib")
ringdist_torch_version("${TORCH_CONFIG_DIR}" TORCH_VERSION)
string(REGEX MATCH "^[0-9]+\\.[0-9]+" TORCH_VERSION_MINOR "${TORCH_VERSION}")

# The standard torch's own CMake asks for (C++20 from torch 2.13, C++17 before).
file(READ "${TORCH_CONFIG_DIR}/TorchConfig.cmake" _torch_config)
if(_torch_config MATCHES "CXX_STANDARD ([0-9]+)")
  set(TORCH_CXX_STANDARD ${CMAKE_MATCH_1})
else()
  set(TORCH_CXX_STANDARD 17)
endif()

set(TORCH_IS_CUDA OFF)
if(EXISTS "${TORCH_LIBRARY_DIR}/libtorch_cuda.so")
  set(TORCH_IS_CUDA ON)
endif()

add_library(torch_ringdist_torch INTERFACE)
target_include_directories(torch_ringdist_torch SYSTEM INTERFACE
  "${TORCH_INCLUDE_DIR}" "${TORCH_INCLUDE_DIR}/torch/csrc/api/include")
set(_torch_libraries c10 torch_cpu torch)
foreach(name IN LISTS _torch_libraries)
  target_link_libraries(torch_ringdist_torch INTERFACE "${TORCH_LIBRARY_DIR}/lib${name}.so")
endforeach()
