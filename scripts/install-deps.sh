#!/usr/bin/env bash
# Installs what dmx needs to build, test and benchmark on Debian 12 / Ubuntu 24.04 (run as root).
# Idempotent: packages already present are left alone; nothing is downloaded outside the distribution.
set -euo pipefail
pkgs=(
  # scripts/rxe-vm.sh: a qemu guest with soft-RoCE (its kernel comes from apt-get download)
  qemu-system-x86 busybox-static cpio xz-utils
  build-essential cmake ninja-build pkg-config git
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev
  iproute2 iperf3 python3 python3-matplotlib
  pybind11-dev python3-dev python3-numpy python3-pytest python3-setuptools python3-pip python3-wheel python3-venv
  clang libclang-rt-14-dev
  curl ccache
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # the rdma transport (libibverbs, the rxe provider) and scripts/rdma-check.sh (perftest)
  libibverbs-dev rdma-core ibverbs-providers ibverbs-utils perftest
  # the store (src/store): etcd's JSON gateway through cpp-httplib; etcd for its tests (tests/store, tests/netns)
  libcpp-httplib-dev etcd-server etcd-client
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
