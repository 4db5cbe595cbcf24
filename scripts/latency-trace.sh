#!/usr/bin/env bash
# latency-trace.sh — where an 8-byte ping-pong's microseconds go, on this machine.
#
#   bash scripts/latency-trace.sh            (from the repository root; results under $OUT)
#
# Builds `dmx` with the trace points compiled in (-DDMX_TRACE=ON, build-trace/), runs `dmx bench`
# 8-byte ping-pongs between two processes with DMX_TRACE_FILE set, and prints
# scripts/trace-report.py for each. Cases (LATENCY_TRACE_CASES, default all that the machine has):
#   host      host -> host, transport auto (control pipe + shm)
#   host-tcp  host -> host over TCP, 1 stream
#   ipc       cuda:0 -> cuda:1 (cuda:0 -> cuda:0 with one GPU), transport auto (cuda_ipc)
#   ipc-dst   the same with cuda_ipc_copy_by=destination
#   tcp       cuda:0 -> cuda:1 over TCP (staged through pinned memory), 1 stream
# Extra `dmx bench` arguments: LATENCY_TRACE_ARGS; LATENCY_TRACE_ITERS (default 2000); a command both processes run
# under: LATENCY_TRACE_PREFIX (e.g. "taskset -c 0-7"); LATENCY_TRACE_RECORD=0 measures without
# recording (the points cost a clock read each).
set -u
# The listener starts in the background: the client waits for it rather than failing at once.
export DMX_CONNECT_RETRY_REFUSED=true
ROOT=$(pwd)
OUT=${OUT:-$ROOT/latency-trace-out}
B=$ROOT/build-trace
mkdir -p "$OUT"
exec > >(tee -a "$OUT/latency-trace.log") 2>&1
if [[ ! -x $B/tools/dmx/dmx ]]; then
  if ! cmake -S "$ROOT" -B "$B" -G Ninja -DDMX_TRACE=ON -DDMX_BUILD_TESTS=OFF -DDMX_BUILD_BENCH=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/trace-build.log" 2>&1 ||
    ! cmake --build "$B" --target dmx -j "$(nproc)" >> "$OUT/trace-build.log" 2>&1; then
    tail -n 30 "$OUT/trace-build.log"
    exit 1
  fi
fi
DMX=$B/tools/dmx/dmx
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
peer=cuda:1
[[ ${gpus:-0} -lt 2 ]] && peer=cuda:0
default_cases="host"
[[ ${gpus:-0} -ge 1 ]] && default_cases="host ipc ipc-dst tcp"
port=17000
for c in ${LATENCY_TRACE_CASES:-$default_cases}; do
  case $c in
    host) args=(--mem host --peer-mem host) ;;
    host-tcp) args=(--mem host --peer-mem host --transport tcp --streams 1) ;;
    ipc) args=(--mem cuda:0 --peer-mem "$peer") ;;
    ipc-dst) args=(--mem cuda:0 --peer-mem "$peer" --option cuda_ipc_copy_by=destination) ;;
    tcp) args=(--mem cuda:0 --peer-mem "$peer" --transport tcp --streams 1) ;;
    *) echo "unknown case $c"; continue ;;
  esac
  port=$((port + 1))
  dir=$(mktemp -d)
  listen_opts=()
  [[ $c == ipc-dst ]] && listen_opts=(--option cuda_ipc_copy_by=destination)
  trace_file=$dir/t
  [[ ${LATENCY_TRACE_RECORD:-1} == 0 ]] && trace_file=
  # shellcheck disable=SC2086
  DMX_TRACE_FILE=$trace_file ${LATENCY_TRACE_PREFIX:-} "$DMX" bench --listen tcp://127.0.0.1:$port "${listen_opts[@]}" > "$dir/listen.log" 2>&1 &
  lpid=$!
  sleep 1
  echo "==== case $c: ${LATENCY_TRACE_PREFIX:-} dmx bench ${args[*]} ${LATENCY_TRACE_ARGS:-}"
  # shellcheck disable=SC2086
  DMX_TRACE_FILE=$trace_file timeout 120 ${LATENCY_TRACE_PREFIX:-} "$DMX" bench --connect tcp://127.0.0.1:$port --sizes 8 --iters "${LATENCY_TRACE_ITERS:-2000}" \
    "${args[@]}" ${LATENCY_TRACE_ARGS:-} 2>&1 | grep -v '^#  *[0-9]'
  kill "$lpid" 2> /dev/null; wait "$lpid" 2> /dev/null
  [[ -n $trace_file ]] && python3 "$ROOT/scripts/trace-report.py" "$dir"/t.* > "$dir/report" && cat "$dir/report"
  rm -rf "$dir"
done
