# cpp-httplib is optional: it serves `dmx bench --metrics-port`. DMX_ENABLE_HTTPLIB defaults to ON
# when it is found; forcing it ON without it is a configure error. Debian's libcpp-httplib-dev is a
# compiled library whose header needs the library's own defines (pkg-config cpp-httplib gives
# them); upstream's install (CMake package httplib) works too. Sets DMX_HTTPLIB_TARGET and
# DMX_HTTPLIB_REASON (for the summary and `dmx --version`).
find_package(httplib CONFIG QUIET)
set(DMX_HTTPLIB_TARGET "")
if(TARGET httplib::httplib)
  set(DMX_HTTPLIB_TARGET httplib::httplib)
  set(_dmx_httplib_version "${httplib_VERSION}")
else()
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(DMX_HTTPLIB QUIET IMPORTED_TARGET cpp-httplib)
    if(DMX_HTTPLIB_FOUND)
      set(DMX_HTTPLIB_TARGET PkgConfig::DMX_HTTPLIB)
      set(_dmx_httplib_version "${DMX_HTTPLIB_VERSION}")
    endif()
  endif()
endif()
set(_dmx_httplib_default OFF)
if(DMX_HTTPLIB_TARGET)
  set(_dmx_httplib_default ON)
endif()
option(DMX_ENABLE_HTTPLIB "Serve metrics over HTTP in dmx bench (cpp-httplib)" ${_dmx_httplib_default})
if(DMX_ENABLE_HTTPLIB AND NOT DMX_HTTPLIB_TARGET)
  message(FATAL_ERROR "DMX_ENABLE_HTTPLIB=ON but cpp-httplib was found neither as the CMake package httplib nor "
                      "by pkg-config (cpp-httplib): install libcpp-httplib-dev, or turn DMX_ENABLE_HTTPLIB off")
endif()
if(DMX_ENABLE_HTTPLIB)
  set(DMX_HTTPLIB_REASON "cpp-httplib ${_dmx_httplib_version} (bench --metrics-port)")
else()
  set(DMX_HTTPLIB_REASON "without cpp-httplib: no bench --metrics-port")
endif()
