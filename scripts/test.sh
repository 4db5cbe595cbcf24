#!/usr/bin/env bash
# Builds dmx and runs the whole test suite (unit, integration over loopback and between network
# namespaces, CLI). GPU tests skip with their reason on machines without a GPU, and count as skipped;
# the last line counts the skips by cause (scripts/skips.py). Extra arguments go to ctest (-R REGEX).
# Exits with ctest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build
cd build
status=0
ctest --output-on-failure --timeout 600 -j "$(nproc)" --output-junit ctest-junit.xml "$@" || status=$?
python3 ../scripts/skips.py ctest-junit.xml || echo "skips: could not read ctest-junit.xml"
exit "$status"
