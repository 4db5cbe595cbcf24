# devmem gather benchmark (owner: devmem). Included from bench/CMakeLists.txt.
if(DMX_HAVE_CUDA)
  add_executable(dmx_bench_devmem_gather ${CMAKE_CURRENT_LIST_DIR}/devmem_gather.cu)
  # CMake < 3.26 does not know nvcc's C++20 flag; the gather API header needs C++20.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set_target_properties(dmx_bench_devmem_gather PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
  target_link_libraries(dmx_bench_devmem_gather PRIVATE dmx_cuda)
endif()
