#!/usr/bin/env bash
# two-gpu-runs.sh — the runs of issue 23 and the GPU checks of the Python module, the NCCL plugin
# and devmem, on a machine with two GPUs, in two steps that each fit the device tool's 10 minutes.
#
#   bash scripts/two-gpu-runs.sh build       configure and build (Python module included), then the
#                                            GPU tests: pytest, the NCCL harness, devmem, the plugin
#                                            loaded into PyTorch's NCCL, and run 4 (collectives)
#   bash scripts/two-gpu-runs.sh measure     run 5 (Python vs C++ vs NCCL send/recv), and Python's
#                                            overhead on host memory
#   bash scripts/two-gpu-runs.sh runs        runs 1-3: scripts/gpu-check.sh sections bench-gpu,
#                                            same-host and small-copy on the build of the first step
#
# Results under $OUT (default two-gpu-out). NVLink multicast stays off (NCCL_NVLS_ENABLE=0 ...).
set -u
OUT=${OUT:-$PWD/two-gpu-out}
mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=${B:-build-gpu}
PY=$(command -v python3)
step() { printf '\n==== %s ==== %s\n' "$1" "$(date -u +%H:%M:%S)"; }
rc=0
case "${1:-}" in
  build)
    step configure
    nvidia-smi -L
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DDMX_PYTHON="$PY" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" > "$OUT/configure.log" 2>&1 ||
      { tail -30 "$OUT/configure.log"; exit 1; }
    step build
    cmake --build "$B" -j "$(nproc)" --target dmx_cli _dmx dmx_nccl_plugin dmx_nccl_tests dmx_devmem_tests \
      dmx_devmem_kernel_tests dmx_devmem_gpu_tests shm_bench cuda_ipc_bench small_copy_probe copy_issue_probe \
      > "$OUT/build.log" 2>&1 || { grep -B3 -A15 "error" "$OUT/build.log" | head -60; exit 1; }
    if [[ -z "${TWO_GPU_SKIP_TESTS:-}" ]]; then  # TWO_GPU_SKIP_TESTS=1: build, plugin check and run 4 only
    step pytest
    PYTHONPATH=$B/python timeout 300 "$PY" -m pytest -q -rs -p no:cacheprovider tests/python 2>&1 | tail -6 || rc=1
    step "nccl harness (host and CUDA pointers)"
    timeout 300 "$B/tests/nccl/dmx_nccl_tests" --gtest_color=no 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Skipped|tests ran" || rc=1
    step devmem
    for t in dmx_devmem_tests dmx_devmem_kernel_tests dmx_devmem_gpu_tests; do
      timeout 300 "$B/tests/devmem/$t" --gtest_color=no > "$OUT/$t.log" 2>&1 || rc=1
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/$t.log" | head -8
    done
    fi
    step "plugin loaded into PyTorch's NCCL"
    bash scripts/nccl-plugin-check.sh "$B" 2>&1 | tail -12 || rc=1
    step "run 4: collectives through the plugin vs NCCL socket"
    # TWO_GPU_RUN4_ENV="DMX_NCCL_STREAMS=8 ..." sets the plugin's settings for this run only.
    timeout 420 env ${TWO_GPU_RUN4_ENV:-} "$PY" bench/ref/nccl_collectives.py --plugin-dir "$B/lib" \
      --sizes "${TWO_GPU_RUN4_SIZES:-1M,16M,256M,1G}" --iters 5 \
      --warmup 2 --timeout 300 --kill-test --keep-logs "$OUT/nccl-logs" | tee "$OUT/collectives.jsonl" | cut -c1-260 || rc=1
    ;;
  measure)
    step "run 5: Python CUDA tensors cuda:0 -> cuda:1 vs C++ vs torch.distributed"
    PYTHONPATH=$B/python timeout 300 "$PY" bench/python_overhead.py --dmx "$B/tools/dmx/dmx" --mem cuda:0 \
      --peer-mem cuda:1 --sizes 8,65536,1048576,16777216,268435456 --repeat 3 --nccl-p2p \
      > "$OUT/python-gpu.jsonl" 2>&1 || rc=1
    grep "^#" "$OUT/python-gpu.jsonl"
    step "python overhead, host memory (quiet machine)"
    PYTHONPATH=$B/python timeout 200 "$PY" bench/python_overhead.py --dmx "$B/tools/dmx/dmx" --repeat 3 \
      > "$OUT/python-host.jsonl" 2>&1 || rc=1
    grep "^#" "$OUT/python-host.jsonl"
    ;;
  runs)
    step "runs 1-3"
    OUT=$OUT/gpu-check GPU_CHECK_SKIP_BUILD=1 GPU_CHECK_BUILD_DIR="$B" GPU_CHECK_STREAMS=8 \
      GPU_CHECK_ONLY=bench-gpu,same-host,small-copy GPU_CHECK_SECTION_TIMEOUT=200 timeout 420 \
      bash scripts/gpu-check.sh > /dev/null 2>&1 || rc=1
    tail -40 "$OUT/gpu-check/gpu-check.log"
    ;;
  *) echo "usage: two-gpu-runs.sh build|measure|runs" >&2; exit 2 ;;
esac
exit $rc
