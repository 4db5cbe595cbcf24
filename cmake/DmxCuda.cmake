# CUDA is optional. DMX_ENABLE_CUDA defaults to ON when nvcc is found; forcing it ON without a
# usable toolkit is a configure error, never a silent downgrade.
include(CheckLanguage)
set(_dmx_cuda_default OFF)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_dmx_cuda_default ON)
endif()
option(DMX_ENABLE_CUDA "Build CUDA support (copy engine, kernels)" ${_dmx_cuda_default})

set(DMX_HAVE_CUDA 0)
if(DMX_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "DMX_ENABLE_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER or turn it off)")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Portable default: the oldest architecture the toolkit supports plus PTX for newer ones.
    # Override with -DCMAKE_CUDA_ARCHITECTURES=90 (scripts/gpu-check.sh does for Hopper).
    set(CMAKE_CUDA_ARCHITECTURES 75-virtual 80 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(DMX_HAVE_CUDA 1)
endif()
