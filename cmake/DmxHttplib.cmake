# cpp-httplib (etcd's JSON gateway for the store, src/store) is optional. DMX_ENABLE_HTTPLIB
# defaults to ON when Debian's libcpp-httplib-dev is found; forced ON without it is a configure
# error. Without it the etcd store says "unavailable: built without cpp-httplib" (TCPStore works).
# Sets DMX_HAVE_HTTPLIB and DMX_HTTPLIB_LIBRARY.
include(DmxOptional)
dmx_find_optional(DMX_HTTPLIB httplib.h cpp-httplib DMX_ENABLE_HTTPLIB "Build the etcd store backend (cpp-httplib)"
                  libcpp-httplib-dev)
set(DMX_HAVE_HTTPLIB 0)
if(DMX_ENABLE_HTTPLIB)
  set(DMX_HAVE_HTTPLIB 1)
endif()
