# dmx_find_optional(<prefix> <header> <library> <option> <doc> <debian package>): finds <header>
# and <library> into <prefix>_INCLUDE_DIR and <prefix>_LIBRARY and defines <option>, ON by default
# when both are found; forcing it ON without them is a configure error that names the package.
macro(dmx_find_optional prefix header library option doc package)
  find_path(${prefix}_INCLUDE_DIR ${header})
  find_library(${prefix}_LIBRARY ${library})
  set(_dmx_optional_default OFF)
  if(${prefix}_INCLUDE_DIR AND ${prefix}_LIBRARY)
    set(_dmx_optional_default ON)
  endif()
  option(${option} "${doc}" ${_dmx_optional_default})
  if(${option} AND (NOT ${prefix}_INCLUDE_DIR OR NOT ${prefix}_LIBRARY))
    message(FATAL_ERROR "${option}=ON but ${library} was not found (header ${header}: ${${prefix}_INCLUDE_DIR}, "
                        "library: ${${prefix}_LIBRARY}); install ${package} (scripts/install-deps.sh) or turn "
                        "${option} off")
  endif()
endmacro()
