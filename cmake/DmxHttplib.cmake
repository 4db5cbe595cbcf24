# cpp-httplib (etcd's JSON gateway for the store, src/store) is optional. DMX_ENABLE_HTTPLIB
# defaults to ON when Debian's libcpp-httplib-dev is found; forced ON without it is a configure
# error. Without it the etcd store says "unavailable: built without cpp-httplib" (TCPStore works).
# Sets DMX_HAVE_HTTPLIB and DMX_HTTPLIB_LIBRARY.
find_path(DMX_HTTPLIB_INCLUDE_DIR httplib.h)
find_library(DMX_HTTPLIB_LIBRARY cpp-httplib)
set(_dmx_httplib_default OFF)
if(DMX_HTTPLIB_INCLUDE_DIR AND DMX_HTTPLIB_LIBRARY)
  set(_dmx_httplib_default ON)
endif()
option(DMX_ENABLE_HTTPLIB "Build the etcd store backend (cpp-httplib)" ${_dmx_httplib_default})
set(DMX_HAVE_HTTPLIB 0)
if(DMX_ENABLE_HTTPLIB)
  if(NOT DMX_HTTPLIB_INCLUDE_DIR OR NOT DMX_HTTPLIB_LIBRARY)
    message(FATAL_ERROR "DMX_ENABLE_HTTPLIB=ON but cpp-httplib was not found (header: ${DMX_HTTPLIB_INCLUDE_DIR}, "
                        "library: ${DMX_HTTPLIB_LIBRARY}); install libcpp-httplib-dev (scripts/install-deps.sh) "
                        "or turn DMX_ENABLE_HTTPLIB off")
  endif()
  set(DMX_HAVE_HTTPLIB 1)
endif()
