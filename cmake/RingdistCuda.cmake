# Whether csrc/gpu/cuda/ is compiled (RINGDIST_WITH_CUDA) and, if so, the CUDA
# language, its architectures and torch's CUDA libraries on torch_ringdist_torch.
#
# TORCH_RINGDIST_CUDA: AUTO compiles CUDA when torch is a CUDA build and nvcc
# (with the CUDA headers) is found; ON makes a missing piece an error; OFF never.
# nvcc: CMAKE_CUDA_COMPILER, else $CUDA_HOME or $CUDA_PATH, else /usr/local/cuda
# when complete (a `nvcc` first on PATH may be a wrapper script elsewhere, whose
# folder has no CUDA headers), else nvcc on PATH.
# Architectures: TORCH_CUDA_ARCH_LIST as for any torch extension ("8.0;9.0+PTX"),
# else the visible GPU's, else 8.0 and 9.0 with PTX for newer GPUs to JIT-compile.

function(ringdist_find_nvcc out)
  if(CMAKE_CUDA_COMPILER)
    set(${out} "${CMAKE_CUDA_COMPILER}" PARENT_SCOPE)
    return()
  endif()
  foreach(home "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}")
    if(home)
      set(${out} "${home}/bin/nvcc" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  if(EXISTS "/usr/local/cuda/bin/nvcc" AND EXISTS "/usr/local/cuda/include/cuda_runtime_api.h")
    set(${out} "/usr/local/cuda/bin/nvcc" PARENT_SCOPE)
    return()
  endif()
  find_program(RINGDIST_NVCC nvcc)
  set(${out} "${RINGDIST_NVCC}" PARENT_SCOPE)
endfunction()

# "8.0;9.0+PTX" (torch's notation) -> "80-real;90-real;90-virtual" (CMake's).
function(ringdist_cuda_architectures torch_list out)
  string(REPLACE " " ";" entries "${torch_list}")
  set(archs)
  foreach(entry IN LISTS entries)
    if(entry STREQUAL "")
      continue()
    endif()
    if(NOT entry MATCHES "^([0-9]+)\\.([0-9]+)([af]?)(\\+PTX)?$")
      message(FATAL_ERROR "torch_ringdist: TORCH_CUDA_ARCH_LIST entry '${entry}' is not like 9.0 or 9.0+PTX")
    endif()
    set(arch "${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
    list(APPEND archs "${arch}-real")
    if(CMAKE_MATCH_4)
      list(APPEND archs "${arch}-virtual")
    endif()
  endforeach()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

string(TOUPPER "${TORCH_RINGDIST_CUDA}" _wanted)
if(NOT _wanted STREQUAL "AUTO")
  if(_wanted)
    set(_wanted ON)
  else()
    set(_wanted OFF)
  endif()
endif()

set(RINGDIST_WITH_CUDA OFF)
set(_missing "")
if(NOT _wanted STREQUAL "OFF")
  ringdist_find_nvcc(_nvcc)
  get_filename_component(_cuda_home "${_nvcc}/../.." ABSOLUTE)
  if(NOT TORCH_IS_CUDA)
    set(_missing "the installed torch ${TORCH_VERSION} is not a CUDA build")
  elseif(NOT _nvcc OR NOT EXISTS "${_nvcc}")
    set(_missing "nvcc was not found (set CUDA_HOME to the CUDA toolkit)")
  elseif(NOT EXISTS "${_cuda_home}/include/cuda_runtime_api.h")
    set(_missing "${_cuda_home} has no include/cuda_runtime_api.h")
  endif()
  if(_missing AND _wanted STREQUAL "ON")
    message(FATAL_ERROR "torch_ringdist: TORCH_RINGDIST_CUDA=ON but ${_missing}")
  elseif(_missing)
    message(STATUS "torch_ringdist: building without CUDA (${_missing})")
  else()
    set(RINGDIST_WITH_CUDA ON)
  endif()
endif()

if(RINGDIST_WITH_CUDA)
  set(CMAKE_CUDA_COMPILER "${_nvcc}")
  if(DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
    ringdist_cuda_architectures("$ENV{TORCH_CUDA_ARCH_LIST}" CMAKE_CUDA_ARCHITECTURES)
  elseif(NOT CMAKE_CUDA_ARCHITECTURES)
    execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE _smi OUTPUT_QUIET ERROR_QUIET)
    if(_smi EQUAL 0 AND CMAKE_VERSION VERSION_GREATER_EQUAL 3.24)
      set(CMAKE_CUDA_ARCHITECTURES native)
    else()
      ringdist_cuda_architectures("8.0;9.0+PTX" CMAKE_CUDA_ARCHITECTURES)
    endif()
  endif()
  # C++17: the .cu files include no torch header, and CMake 3.25 has no CUDA20
  # flags for nvcc 13.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # torch's own cudart (shared): a static copy would be a second CUDA runtime.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  target_link_libraries(torch_ringdist_torch INTERFACE
    "${TORCH_LIBRARY_DIR}/libc10_cuda.so" "${TORCH_LIBRARY_DIR}/libtorch_cuda.so" CUDA::cudart)
  message(STATUS "torch_ringdist: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
endif()
