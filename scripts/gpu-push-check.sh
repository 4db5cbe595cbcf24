#!/usr/bin/env bash
# gpu-push-check.sh — GPU push and kernel-initiated operations (docs/gpu-push.md) on the GPU
# machine (2 GPUs: nvidia-h200-x2): builds only what it needs, runs the GPU tests, the ordering and
# memory-ordering tests under compute-sanitizer racecheck and synccheck, the conformance suite with
# push forced on, and the benches (push on and off side by side in one run). About 5 minutes.
#
#   bash scripts/gpu-push-check.sh            (from the repository root)
#
# Results under $OUT (default ./gpu-push-out): gpu-push-check.log (everything), bench.jsonl
# (dmx bench rows, tagged "gpu_push" and "phase"), device_put.jsonl (the kernel-clock bench),
# topo.txt, and a summary table at the end of the log.
#
# Environment: PUSH_BUILD_DIR (default build-push), PUSH_JOBS (default nproc), PUSH_CUDA_ARCH (90),
# PUSH_SKIP_BUILD=1 (reuse the build), PUSH_ONLY="tests,sanitizer,conformance,bench,device_put,topo",
# PUSH_SANITIZER_FILTER (gtest filter for the sanitizer runs; default every DeviceApiGpu and
# DeviceDirectGpu test). PUSH_ONLY=steps runs scripts/push-steps.sh (a trace build; each step's time).
# compute-sanitizer: from PATH, else /usr/local/cuda/bin; the step is skipped, saying so, without it.
set -u
set -o pipefail

ROOT=$(pwd)
if [[ ! -f "$ROOT/CMakeLists.txt" || ! -d "$ROOT/src/device" ]]; then
  echo "gpu-push-check: run me from the dmx repository root" >&2
  exit 2
fi
OUT=${OUT:-$ROOT/gpu-push-out}
mkdir -p "$OUT"
B=${PUSH_BUILD_DIR:-$ROOT/build-push}
JOBS=${PUSH_JOBS:-$(nproc)}
ARCH=${PUSH_CUDA_ARCH:-90}
ONLY=${PUSH_ONLY:-tests,sanitizer,conformance,bench,device_put,topo}
exec > >(tee -a "$OUT/gpu-push-check.log") 2>&1
echo "gpu-push-check: $(date -u +%Y-%m-%dT%H:%M:%SZ) host $(hostname) cpus $(nproc) commit $(git rev-parse --short HEAD 2> /dev/null)"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | sed 's/^/  gpu: /'

SUMMARY=()
stage() {  # stage NAME TIMEOUT_S CMD...: runs, times and records
  local name=$1 limit=$2 t0 rc
  shift 2
  echo
  echo "=== $name: $*"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  SUMMARY+=("$(printf '%-34s %-6s %4ss' "$name" "$([[ $rc == 0 ]] && echo ok || echo "rc=$rc")" $(($(date +%s) - t0)))")
  return $rc
}
want() { [[ ",$ONLY," == *",$1,"* ]]; }

if [[ ${PUSH_SKIP_BUILD:-0} != 1 ]]; then
  stage configure 300 cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMX_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DDMX_BUILD_TESTS=ON -DDMX_BUILD_BENCH=ON -DDMX_BUILD_PYTHON=OFF > "$OUT/configure.log" 2>&1 \
    || { tail -30 "$OUT/configure.log"; exit 1; }
  stage build 600 ninja -C "$B" -j "$JOBS" dmx_cli dmx_device_tests dmx_device_gpu_tests dmx_topo_tests \
    dmx_conformance_tests device_put_bench > "$OUT/build.log" 2>&1 || { grep -B2 -A20 'FAILED\|error' "$OUT/build.log" | head -80; exit 1; }
fi
DMX=$B/tools/dmx/dmx
GT=$B/tests/device/dmx_device_gpu_tests

if want tests; then
  stage "unit (channel, advisor)" 120 bash -c "'$B/tests/device/dmx_device_tests' && '$B/tests/topo/dmx_topo_tests' --gtest_filter='GpuPush*'"
  stage "gpu tests" 300 "$GT"
fi

if want sanitizer; then
  # racecheck (shared-memory hazards) and synccheck (barriers not reached by every thread) over the
  # device API's GPU tests, every path; --target-processes all follows the forked peers.
  CS=$(command -v compute-sanitizer 2> /dev/null)
  [[ -z $CS && -x /usr/local/cuda/bin/compute-sanitizer ]] && CS=/usr/local/cuda/bin/compute-sanitizer
  F=${PUSH_SANITIZER_FILTER:-'Paths/DeviceApiGpu.*:DeviceDirectGpu.*'}
  if [[ -z $CS ]]; then
    echo "compute-sanitizer: skipped: not on PATH and no /usr/local/cuda/bin/compute-sanitizer"
    SUMMARY+=("$(printf '%-34s %-6s' "compute-sanitizer" "skipped (not installed)")")
  else
    for tool in racecheck synccheck; do
      stage "compute-sanitizer $tool" 300 "$CS" --tool "$tool" --target-processes all --error-exitcode 99 "$GT" \
        --gtest_filter="$F"
    done
  fi
fi

if want conformance; then
  stage "conformance, push forced on" 300 "$B/tests/transport/dmx_conformance_tests" \
    --gtest_filter='Transports/Conformance.*/cudaIpcPush:Transports/Conformance.*/tcpGpuPush'
fi

if want topo; then
  "$DMX" topo > "$OUT/topo.txt" 2>&1
  sed -n '/^GPU push/,$p' "$OUT/topo.txt"
fi

if want bench; then
  # shellcheck source=scripts/bench-pair.sh
  source "$ROOT/scripts/bench-pair.sh"
  port=7901
  bench_all() {
    for t in cuda_ipc tcp; do
      for p in off on; do
        # Required rows: 8 B latency, and no regression at 1 MiB and 256 MiB (push off above the threshold).
        port=$((port + 1))
        (export DMX_GPU_PUSH=$p; bench_pair "$OUT/bench.jsonl" "\"gpu_push\":\"$p\",\"phase\":\"main\"," "$DMX" "$port" \
          --mem cuda:0 --peer-mem cuda:1 --transport "$t" --sizes 8,1M,256M)
        # The threshold sweep (push on pushes up to 1 MiB; off never): where on stops winning.
        port=$((port + 1))
        (export DMX_GPU_PUSH=$p; bench_pair "$OUT/bench.jsonl" "\"gpu_push\":\"$p\",\"phase\":\"sweep\"," "$DMX" "$port" \
          --mem cuda:0 --peer-mem cuda:1 --transport "$t" --sizes 64,1K,4K,16K,64K,256K --iters 1000)
      done
    done
  }
  stage "dmx bench, push off/on" 420 bash -c "$(declare -f bench_pair bench_all); OUT='$OUT' DMX='$DMX' port=$port bench_all"
  python3 - "$OUT/bench.jsonl" << 'EOF' || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("\n8-byte half round trip and throughput, GPU0 -> GPU1 (p50 us | GB/s), push off vs on")
print(f"{'transport':10} {'size':>9} {'off p50':>9} {'on p50':>9} {'off GB/s':>9} {'on GB/s':>9} {'pushes(on)':>10}")
key = lambda r: (r.get("transport"), r.get("size_bytes"))
by = {}
for r in rows:
    by.setdefault(key(r), {})[r.get("gpu_push")] = r
for (t, size), d in sorted(by.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
    off, on = d.get("off", {}), d.get("on", {})
    print(f"{str(t):10} {size:>9} {off.get('p50_us', float('nan')):>9.1f} {on.get('p50_us', float('nan')):>9.1f} "
          f"{off.get('gb_per_s', float('nan')):>9.2f} {on.get('gb_per_s', float('nan')):>9.2f} {on.get('gpu_pushes', '-'):>10}")
EOF
fi

if want device_put; then
  stage "device_put_bench" 240 bash -c "'$B/bench/device_put_bench' --iters 2000 | tee '$OUT/device_put.jsonl'"
fi

if want steps; then  # not in the default list: it makes a second (trace) build
  stage "step times (trace build)" 900 env OUT="$OUT" PUSH_JOBS="$JOBS" PUSH_CUDA_ARCH="$ARCH" bash "$ROOT/scripts/push-steps.sh"
fi

echo
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
