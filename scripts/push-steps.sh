#!/usr/bin/env bash
# push-steps.sh — where the microseconds of an 8-byte GPU0 -> GPU1 message go, push off and on,
# over staged TCP and cuda_ipc (docs/gpu-push.md, "Where the time goes"). On the GPU machine.
#
#   bash scripts/push-steps.sh            (from the repository root; about 1 minute after the build)
#
# Builds a trace build (-DDMX_TRACE=ON: the trace points of src/core/trace.h compiled in; normal
# builds have none) of `dmx` only, in PUSH_TRACE_BUILD_DIR (default build-push-trace); then for each
# transport and gpu_push setting runs a `dmx bench` pair (8 B send ping-pong, window 1) with
# DMX_TRACE_FILE set on both sides, and prints scripts/push-steps.py's table of each step's p50.
# Results under $OUT (default ./gpu-push-out): steps-<transport>-<push>.txt, bench-steps.jsonl.
#
# Environment: PUSH_JOBS (nproc), PUSH_CUDA_ARCH (90), PUSH_SKIP_BUILD=1, STEPS_SIZE (8), STEPS_ITERS (2000),
# STEPS_TRANSPORTS ("tcp cuda_ipc"), STEPS_PUSH ("off on").
set -u
set -o pipefail
ROOT=$(pwd)
if [[ ! -f "$ROOT/CMakeLists.txt" || ! -f "$ROOT/scripts/push-steps.py" ]]; then
  echo "push-steps: run me from the dmx repository root" >&2
  exit 2
fi
OUT=${OUT:-$ROOT/gpu-push-out}
mkdir -p "$OUT"
# shellcheck source=scripts/trace-build.sh
source "$ROOT/scripts/trace-build.sh"
# shellcheck source=scripts/bench-pair.sh
source "$ROOT/scripts/bench-pair.sh"
port=7951
rc=0
for t in ${STEPS_TRANSPORTS:-tcp cuda_ipc}; do
  for p in ${STEPS_PUSH:-off on}; do
    port=$((port + 1))
    prefix=$OUT/trace-$t-$p
    rm -f "$prefix".*
    (export DMX_GPU_PUSH=$p DMX_TRACE_FILE=$prefix
     timeout 60 bash -c "$(declare -f bench_pair); bench_pair '$OUT/bench-steps.jsonl' '\"gpu_push\":\"$p\",\"phase\":\"steps\",' \
       '$DMX' $port --mem cuda:0 --peer-mem cuda:1 --transport $t --sizes ${STEPS_SIZE:-8} --window 1 --iters ${STEPS_ITERS:-2000}") \
      > /dev/null || rc=1
    {
      echo "=== $t, gpu_push=$p: ${STEPS_SIZE:-8} B GPU0 -> GPU1 send ping-pong, each step's p50"
      python3 "$ROOT/scripts/push-steps.py" "$prefix".*
    } | tee "$OUT/steps-$t-$p.txt"
    rm -f "$prefix".*  # 32 MiB per process
  done
done
exit $rc
