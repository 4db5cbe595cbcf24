# dmx::build_info(): the version, the git revision of the sources and the build's options, for
# `dmx --version` and bug reports. The revision is read at every build (not only at configure), so
# it never names an older commit than the one built; the file is rewritten only when it changes.
set(DMX_BUILD_OPTIONS
    "${CMAKE_BUILD_TYPE}, ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}, ${DMX_CUDA_REASON}, ${DMX_RDMA_REASON}")
if(DMX_SANITIZE)
  string(APPEND DMX_BUILD_OPTIONS ", sanitizer ${DMX_SANITIZE}")
endif()
if(DMX_TRACE)
  string(APPEND DMX_BUILD_OPTIONS ", trace points on")
endif()
string(REPLACE ";" " " DMX_BUILD_OPTIONS "${DMX_BUILD_OPTIONS}")  # a list would split the command
set(DMX_BUILD_INFO_CC ${PROJECT_BINARY_DIR}/generated/build_info.cc)
add_custom_target(dmx_build_info
  COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR} -DOUT=${DMX_BUILD_INFO_CC}
          -DVERSION=${PROJECT_VERSION} "-DOPTIONS=${DMX_BUILD_OPTIONS}" -P ${PROJECT_SOURCE_DIR}/cmake/build_info.cmake
  BYPRODUCTS ${DMX_BUILD_INFO_CC}
  COMMENT "" VERBATIM)
