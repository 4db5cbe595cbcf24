#!/usr/bin/env bash
# Builds dmx and runs the whole test suite (unit, integration over loopback and between network
# namespaces, CLI). GPU tests skip with their reason on machines without a GPU, and count as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build
cd build
ctest --output-on-failure --timeout 600 -j "$(nproc)"
