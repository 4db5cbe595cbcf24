#!/usr/bin/env bash
# Installs what dmx needs (Debian 12 / Ubuntu 24.04, as root), builds it, and runs the main job:
# a loopback transfer benchmark (GPU memory when a GPU is present, else host memory), verified.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build --target dmx_cli
build/tools/dmx/dmx bench --loopback --verify "$@"
