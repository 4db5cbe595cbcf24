#!/usr/bin/env bash
# stage-times.sh — where staged GPU0 -> GPU1 loses against host -> host at 8 TCP streams: each
# stage's time on the throughput path (issue 46). On the GPU machine.
#
#   bash scripts/stage-times.sh            (from the repository root; under a minute after the build)
#
# Builds (or, with PUSH_SKIP_BUILD=1, reuses) the trace build of `dmx` as scripts/push-steps.sh does
# (-DDMX_TRACE=ON, in PUSH_TRACE_BUILD_DIR, default build-push-trace); then runs `dmx bench --loopback`
# of STAGES_SIZE (256M) with STAGES_STREAMS (8) streams, (a) host -> host over tcp and (b) cuda:0 ->
# cuda:1 over staged tcp, with DMX_TRACE_FILE set, and prints scripts/stage-times.py's table of each
# stage's time in the throughput phase, beside each run's GB/s.
# Results under $OUT (default ./stage-times-out): stages.txt, stage-<run>.json (the bench's line).
#
# Environment: PUSH_JOBS (nproc), PUSH_CUDA_ARCH (90), PUSH_SKIP_BUILD=1, PUSH_TRACE_BUILD_DIR,
# STAGES_SIZE (256M), STAGES_STREAMS (8), STAGES_ITERS (8: throughput operations, and as many
# latency samples), STAGES_KEEP=1 keeps the trace files (32 MiB each).
set -u
set -o pipefail
ROOT=$(pwd)
if [[ ! -f "$ROOT/CMakeLists.txt" || ! -f "$ROOT/scripts/stage-times.py" ]]; then
  echo "stage-times: run me from the dmx repository root" >&2
  exit 2
fi
OUT=${OUT:-$ROOT/stage-times-out}
mkdir -p "$OUT"
# shellcheck source=scripts/trace-build.sh
source "$ROOT/scripts/trace-build.sh"
rc=0
args=()
for run in "host:host host" "gpu:cuda:0 cuda:1"; do
  label=${run%%:*}
  read -r mem peer <<< "${run#*:}"
  prefix=$OUT/stage-$label
  rm -f "$prefix".*
  DMX_TRACE_FILE=$prefix timeout 120 "$DMX" bench --loopback --mem "$mem" --peer-mem "$peer" --transport tcp \
    --streams "${STAGES_STREAMS:-8}" --sizes "${STAGES_SIZE:-256M}" --iters "${STAGES_ITERS:-8}" --json \
    > "$prefix.json" 2> "$prefix.err" || { echo "stage-times: the $label run failed:"; tail -5 "$prefix.err"; rc=1; }
  args+=("$label=$prefix")
done
python3 "$ROOT/scripts/stage-times.py" "${args[@]}" | tee "$OUT/stages.txt" || rc=1
[[ ${STAGES_KEEP:-0} == 1 ]] || for a in "${args[@]}"; do rm -f "${a#*=}".[0-9]*; done
exit $rc
