#!/usr/bin/env bash
# Quick tuning sweep of dmx bench (loopback, one process) over settings, printing one line per run.
# Usage: scripts/perf-sweep.sh [DMX] [all|latency]   (on the GPU machine after gpu-check's build)
set -u
DMX=${1:-build-gpu/tools/dmx/dmx}
MODE=${2:-all}
line() {  # label, then dmx bench args
  local label=$1; shift
  "$DMX" bench --loopback --json "$@" 2>/dev/null | python3 "$(dirname "$0")/../bench/jsonrow.py" "$label"
}
gpu=host; nvidia-smi -L >/dev/null 2>&1 && gpu=cuda:0
line "latency host" --mem host --sizes 8,4K --streams 8
line "latency gpu" --mem $gpu --sizes 8,4K --streams 8
[[ $MODE == latency ]] && exit 0
line "latency host busy_poll=0" --mem host --sizes 8 --streams 8 --option busy_poll=0us
line "latency host busy_poll=200us" --mem host --sizes 8 --streams 8 --option busy_poll=200us
for st in 8 16; do
  for ch in 1M 4M; do
    for sb in 0 8M; do
      line "host s=$st chunk=$ch sockbuf=$sb" --mem host --sizes 1M,256M --streams $st --chunk-size $ch \
        --option socket_buffer=$sb --option staging_slots=4
    done
  done
done
line "gpu s=8 chunk=4M" --mem $gpu --sizes 1M,256M --streams 8 --chunk-size 4M
line "gpu s=16 chunk=1M" --mem $gpu --sizes 1M,256M --streams 16
line "host s=8 busy_poll=0" --mem host --sizes 256M --streams 8 --option busy_poll=0us
