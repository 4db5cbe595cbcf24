#!/usr/bin/env bash
# Installs what dmx needs (Debian 12 / Ubuntu 24.04, as root), builds it, and runs the main job:
# a loopback transfer benchmark (GPU memory when a GPU is present, else host memory), verified.
# CUDA is found on PATH or where toolkits install (CUDAToolkit_ROOT, CUDA_HOME, /usr/local/cuda*);
# with a GPU present, the build targets that GPU's architecture. The build's summary says which.
# `dmx` goes on PATH as /usr/local/bin/dmx, a link to build/tools/dmx/dmx (the README's commands
# call it so); without write access there, it says what to add to PATH instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
arch=()
gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -n1 || true)
  cap=${gpu##*, }
  if [[ $cap =~ ^[0-9]+\.[0-9]+$ ]]; then
    arch=(-DCMAKE_CUDA_ARCHITECTURES="${cap/./}")
  fi
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${arch[@]}"
cmake --build build --target dmx_cli
echo
bin=$PWD/build/tools/dmx/dmx
if [[ -w /usr/local/bin ]]; then
  ln -sfn "$bin" /usr/local/bin/dmx
  hash -r
  found=$(command -v dmx || true)
  if [[ $(readlink -f "$found") != "$bin" ]]; then
    echo "quickstart: error: the shell finds dmx at '$found', not this build's $bin (earlier on PATH?)" >&2
    exit 1
  fi
  echo "quickstart: dmx is on PATH: /usr/local/bin/dmx -> $bin"
else
  echo "quickstart: /usr/local/bin is not writable: run export PATH=\"$(dirname "$bin"):\$PATH\" to call dmx"
  PATH=$(dirname "$bin"):$PATH
fi
dmx --version | sed 's/^/quickstart: /'
if [[ -n $gpu ]]; then
  echo "quickstart: GPU present: $gpu${arch:+ (built for its architecture)}"
  dmx --version | grep -q 'without CUDA' &&
    echo "quickstart: this build cannot use it: see the build line above (set CUDAToolkit_ROOT to the toolkit)"
else
  echo "quickstart: no GPU found (nvidia-smi absent or silent): the benchmark uses host memory"
fi
echo
dmx bench --loopback --verify "$@"
