# CUDA is optional. DMX_ENABLE_CUDA defaults to ON when nvcc is found; forcing it ON without a
# usable toolkit is a configure error, never a silent downgrade. nvcc is looked for where toolkits
# install it, not only on PATH (a root shell or CI often lacks /usr/local/cuda/bin there), and
# DMX_CUDA_REASON says what was found where, for the summary and `dmx --version`.
include(CheckLanguage)
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(_dmx_nvcc nvcc)  # PATH first
  set(_dmx_nvcc_from "on PATH or in a system program directory")
  if(NOT _dmx_nvcc)
    file(GLOB _dmx_versioned LIST_DIRECTORIES true /usr/local/cuda-*)
    list(SORT _dmx_versioned COMPARE NATURAL ORDER DESCENDING)  # the newest versioned toolkit
    set(_dmx_roots "")
    foreach(root "${CUDAToolkit_ROOT}" "$ENV{CUDAToolkit_ROOT}" "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda
                 ${_dmx_versioned})
      if(root)
        list(APPEND _dmx_roots "${root}/bin")
      endif()
    endforeach()
    find_program(_dmx_nvcc nvcc PATHS ${_dmx_roots} NO_DEFAULT_PATH)
    set(_dmx_nvcc_from "in a CUDA toolkit directory: CUDAToolkit_ROOT, CUDA_HOME or /usr/local/cuda*")
  endif()
  if(_dmx_nvcc)
    set(CMAKE_CUDA_COMPILER "${_dmx_nvcc}" CACHE FILEPATH "CUDA compiler")
    set(DMX_CUDA_FOUND_BY "found ${_dmx_nvcc} (${_dmx_nvcc_from})" CACHE INTERNAL "")
  endif()
endif()
check_language(CUDA)
set(_dmx_cuda_default OFF)
if(CMAKE_CUDA_COMPILER)
  set(_dmx_cuda_default ON)
endif()
option(DMX_ENABLE_CUDA "Build CUDA support (copy engine, kernels)" ${_dmx_cuda_default})

set(DMX_HAVE_CUDA 0)
if(DMX_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "DMX_ENABLE_CUDA=ON but no CUDA compiler was found on PATH, in CUDAToolkit_ROOT, CUDA_HOME "
                        "or /usr/local/cuda* (set CMAKE_CUDA_COMPILER, or turn DMX_ENABLE_CUDA off)")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Portable default: the oldest architecture the toolkit supports plus PTX for newer ones.
    # Override with -DCMAKE_CUDA_ARCHITECTURES=90 (quickstart.sh and gpu-check.sh pass the GPU's own).
    set(CMAKE_CUDA_ARCHITECTURES 75-virtual 80 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(DMX_HAVE_CUDA 1)
  if(NOT DMX_CUDA_FOUND_BY)
    set(DMX_CUDA_FOUND_BY "compiler ${CMAKE_CUDA_COMPILER}")
  endif()
  set(DMX_CUDA_REASON "CUDA ${CUDAToolkit_VERSION} (${DMX_CUDA_FOUND_BY}), architectures ${CMAKE_CUDA_ARCHITECTURES}")
elseif(CMAKE_CUDA_COMPILER)
  set(DMX_CUDA_REASON "without CUDA: DMX_ENABLE_CUDA=OFF (nvcc at ${CMAKE_CUDA_COMPILER} not used)")
else()
  set(DMX_CUDA_REASON "without CUDA: no nvcc on PATH, in CUDAToolkit_ROOT, CUDA_HOME or /usr/local/cuda*")
endif()
