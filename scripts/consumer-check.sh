#!/usr/bin/env bash
# Checks dmx the way a user consumes it: installs it into a temporary prefix, builds examples/
# against that prefix with find_package (dmx::dmx, then dmx::dmx_static) and with pkg-config (the
# examples' CMake option and a bare compiler line), and runs every example; then runs the README's
# Use block with the installed dmx (scripts/readme-check.sh). Fails on any error.
#
#   bash scripts/consumer-check.sh [BUILD_DIR]
#
# BUILD_DIR: an existing dmx build to install from (it is built first). Without it, build-consumer/
# is configured with CUDA off and only what is installed is built (incremental on later runs).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-}
if [[ -z $build ]]; then
  build=$root/build-consumer
  # -Werror: the Release build (what users install) stays free of warnings, LTO's included.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDMX_ENABLE_CUDA=OFF \
    -DDMX_BUILD_TESTS=OFF -DDMX_BUILD_BENCH=OFF -DDMX_WERROR=ON >/dev/null
fi
cmake --build "$build" --target dmx_shared dmx_static dmx_cli

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
echo "== installed into $prefix:"
(cd "$prefix" && find . -type f -o -type l | sort | sed 's/^/   /')

# The public headers include only the standard library and each other.
if grep -rhE '^#include <[^>]*[./][^>]*>' "$prefix/include/dmx"; then
  echo "error: an installed header includes a non-standard header (above)" >&2
  exit 1
fi
"$prefix/bin/dmx" probe >/dev/null

run_examples() {  # $1: examples build dir
  for example in send_recv write_read gpu_to_gpu; do
    "$1/$example"
  done
  # Built only where a CUDA compiler was found (examples/CMakeLists.txt).
  if [[ -x $1/device_put ]]; then "$1/device_put"; fi
}
build_examples() {  # $1: name, rest: cmake options
  local dir=$tmp/examples-$1
  shift
  echo "== examples via $(basename "$dir" | sed 's/examples-//')"
  cmake -S examples -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir" >/dev/null
  run_examples "$dir"
}
build_examples find_package -DCMAKE_PREFIX_PATH="$prefix"
build_examples find_package-static -DCMAKE_PREFIX_PATH="$prefix" -DDMX_EXAMPLES_STATIC=ON
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
build_examples pkg-config -DDMX_EXAMPLES_PKGCONFIG=ON

echo "== a bare compiler line with pkg-config"
# shellcheck disable=SC2046  # pkg-config's output is meant to be split
c++ -std=c++20 examples/send_recv.cc $(pkg-config --cflags --libs dmx) -Wl,-rpath,"$prefix/lib" \
  -o "$tmp/send_recv_pc"
"$tmp/send_recv_pc"

echo "== the README's Use block, as written, with the installed dmx"
bash scripts/readme-check.sh "$prefix/bin"
echo "consumer-check: ok"
