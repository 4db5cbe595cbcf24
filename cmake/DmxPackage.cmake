# libdmx as users get it: one shared library (dmx::dmx) and one static archive (dmx::dmx_static)
# made of the layer libraries' objects, their install rules, the CMake package and dmx.pc.
#
# The layers stay separate static libraries for the in-tree tests and tools; here their objects are
# linked once more into libdmx.so, which takes fmt, spdlog, OpenSSL and (with CUDA) the static CUDA
# runtime as private dependencies: the public headers include only the standard library, so a user
# needs none of their headers. libdmx.a cannot hide them: dmx::dmx_static names them for the linker.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_dmx_layers dmx_core dmx_memory dmx_wire dmx_topo dmx_cuda dmx_device dmx_stream dmx_transport dmx_tcp dmx_devmem dmx_shm dmx_cuda_ipc dmx_rdma
    dmx_store dmx_engine dmx_probe)
set(_dmx_objects "")
foreach(layer IN LISTS _dmx_layers)
  get_target_property(_type ${layer} TYPE)
  if(NOT _type STREQUAL "INTERFACE_LIBRARY")  # dmx_cuda without CUDA
    list(APPEND _dmx_objects $<TARGET_OBJECTS:${layer}>)
  endif()
endforeach()
# What the layers' code calls into. The static CUDA runtime keeps a CUDA build runnable on hosts
# without a driver (GPU memory kinds are then unavailable, with the reason).
set(_dmx_private_deps fmt::fmt spdlog::spdlog OpenSSL::Crypto Threads::Threads)
if(DMX_HAVE_CUDA)
  list(APPEND _dmx_private_deps CUDA::cudart_static)
endif()
# rdma-core's libibverbs is a shared library: a build with rdma needs libibverbs1 where it runs.
if(DMX_HAVE_RDMA)
  list(APPEND _dmx_private_deps ${DMX_IBVERBS_LIBRARY})
endif()
# libcpp-httplib is a shared library: a build with the etcd store needs libcpp-httplib0.11 where it runs.
if(DMX_HAVE_HTTPLIB)
  list(APPEND _dmx_private_deps ${DMX_HTTPLIB_LIBRARY})
endif()
# Before 1.0 every minor release may change the ABI.
set(DMX_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})

foreach(kind shared static)
  string(TOUPPER ${kind} _type)
  add_library(dmx_${kind} ${_type} ${_dmx_objects})
  set_target_properties(dmx_${kind} PROPERTIES OUTPUT_NAME dmx LINKER_LANGUAGE CXX)
  target_include_directories(dmx_${kind} INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(dmx_${kind} INTERFACE cxx_std_20)
  target_link_libraries(dmx_${kind} PUBLIC Threads::Threads PRIVATE ${_dmx_private_deps})
endforeach()
set_target_properties(dmx_shared PROPERTIES EXPORT_NAME dmx VERSION ${PROJECT_VERSION} SOVERSION ${DMX_SOVERSION})
# Keep the static archives' symbols (the CUDA runtime's above all) out of libdmx.so's exports, so
# that they cannot clash with a libcudart.so the application loads.
target_link_options(dmx_shared PRIVATE LINKER:--exclude-libs,ALL)
# Fail on anything unresolved, except in sanitizer builds: a static sanitizer runtime (clang's)
# leaves shared libraries with undefined symbols by design.
if(DMX_SANITIZE STREQUAL "")
  target_link_options(dmx_shared PRIVATE LINKER:--no-undefined)
endif()
set_target_properties(dmx_static PROPERTIES EXPORT_NAME dmx_static)

# ---- install ----
set(_dmx_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/dmx)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/dmx DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")  # device.cuh: for CUDA users (docs/gpu-push.md)
install(TARGETS dmx_shared EXPORT dmxTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS dmx_static EXPORT dmxStaticTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS dmx_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT dmxTargets NAMESPACE dmx:: DESTINATION ${_dmx_cmakedir})
install(EXPORT dmxStaticTargets NAMESPACE dmx:: DESTINATION ${_dmx_cmakedir})
set(DMX_CONFIG_CUDA_NOTE "")
if(DMX_HAVE_CUDA)
  set(DMX_CONFIG_CUDA_NOTE " and the CUDA toolkit (static runtime)")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dmxConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dmxConfig.cmake INSTALL_DESTINATION ${_dmx_cmakedir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dmxConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dmxConfig.cmake ${PROJECT_BINARY_DIR}/dmxConfigVersion.cmake
        DESTINATION ${_dmx_cmakedir})

# dmx.pc finds its prefix relative to itself, so an installed tree can be moved (or installed with
# `cmake --install --prefix`).
set(_dmx_pcdir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH DMX_PC_PREFIX_FROM_PCDIR /${_dmx_pcdir} /)
string(REGEX REPLACE "/$" "" DMX_PC_PREFIX_FROM_PCDIR "${DMX_PC_PREFIX_FROM_PCDIR}")
set(DMX_PC_LIBS_PRIVATE "-lspdlog -lfmt -lcrypto -pthread")
if(DMX_HAVE_CUDA)
  string(APPEND DMX_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
endif()
if(DMX_HAVE_RDMA)
  string(APPEND DMX_PC_LIBS_PRIVATE " -libverbs")
endif()
if(DMX_HAVE_HTTPLIB)
  string(APPEND DMX_PC_LIBS_PRIVATE " -lcpp-httplib")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/dmx.pc.in ${PROJECT_BINARY_DIR}/dmx.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/dmx.pc DESTINATION ${_dmx_pcdir})
