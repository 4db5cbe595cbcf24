# DMX_SANITIZE adds -fsanitize flags to everything. Supported lanes: "address,undefined" (ASan and
# UBSan together, as scripts/sanitize.sh asan builds it) and "thread"; "address" and "undefined"
# alone still work. UBSan never recovers: a report fails the test that caused it.
if(DMX_SANITIZE STREQUAL "")
  return()
endif()
string(REPLACE "," ";" _dmx_sanitizers "${DMX_SANITIZE}")
list(SORT _dmx_sanitizers)
list(JOIN _dmx_sanitizers "," _dmx_sorted)
if(NOT _dmx_sorted MATCHES "^(address|undefined|thread|address,undefined)$")
  message(FATAL_ERROR "DMX_SANITIZE must be address,undefined or thread (or address or undefined "
                      "alone); got '${DMX_SANITIZE}'. ThreadSanitizer cannot join AddressSanitizer.")
endif()
set(_flags -fsanitize=${_dmx_sorted} -fno-omit-frame-pointer)
if("undefined" IN_LIST _dmx_sanitizers)
  list(APPEND _flags -fno-sanitize-recover=undefined)
endif()
add_compile_options(${_flags})
add_link_options(-fsanitize=${_dmx_sorted})
