#!/usr/bin/env bash
# Soak: one `dmx bench --listen` server and SOAK_CLIENTS client processes that, for SOAK_SECONDS,
# connect again and again and move mixed sizes (send, write, read; tcp and auto) with end-to-end
# verification of fresh random data. Prints the server's RSS, open fds and threads at the start
# (after the first round of clients) and at the end, and every failed or unverified run.
# Exits non-zero on any failure, or when the server's fds or threads did not come back.
#   SOAK_SECONDS=600 SOAK_CLIENTS=16 bash scripts/soak.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
DMX=$BUILD/tools/dmx/dmx
SECONDS_TOTAL=${SOAK_SECONDS:-600}
CLIENTS=${SOAK_CLIENTS:-16}
WORK=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
export DMX_AUTH_KEY=dmx-soak-key-0123456789 DMX_LOG_LEVEL=warn

"$DMX" bench --listen tcp://127.0.0.1:0 --option streams=4 2> "$WORK/server.log" &
SERVER=$!
for _ in $(seq 100); do grep -q "serving on" "$WORK/server.log" && break; sleep 0.1; done
ADDR=$(grep -o 'tcp://[0-9.:]*' "$WORK/server.log" | head -1)
[ -n "$ADDR" ] || { echo "soak: the server did not start"; cat "$WORK/server.log"; exit 1; }

sample() {  # rss_kib fds threads of the server
  echo "$(awk '/^VmRSS:/ {print $2}' /proc/$SERVER/status) $(ls /proc/$SERVER/fd | wc -l) $(awk '/^Threads:/ {print $2}' /proc/$SERVER/status)"
}

client() {  # $1: client number
  local i=$1 n=0 ops=(send write read) transports=(tcp auto) sizes=("0,1,4095,65537" "1M,3M" "16M" "8,100003")
  local end=$((SECONDS + SECONDS_TOTAL))
  while [ "$SECONDS" -lt "$end" ]; do
    local op=${ops[$(((i + n) % 3))]} tr=${transports[$((i % 2))]} sz=${sizes[$(((i * 7 + n) % 4))]}
    if ! "$DMX" bench --connect "$ADDR" --mem host --op "$op" --transport "$tr" --sizes "$sz" --iters 20 \
        --streams 4 --verify --json > "$WORK/c$i.out" 2> "$WORK/c$i.err"; then
      echo "FAIL client $i run $n ($op $tr $sz): $(tail -1 "$WORK/c$i.err")" >> "$WORK/failures"
    elif grep -q '"verified":false' "$WORK/c$i.out"; then
      echo "UNVERIFIED client $i run $n ($op $tr $sz)" >> "$WORK/failures"
    fi
    n=$((n + 1))
    echo "$n" > "$WORK/c$i.runs"
  done
}

START=$(date -u +%FT%TZ)
read -r RSSB FDSB THRB <<< "$(sample)"
PIDS=()
for i in $(seq 1 "$CLIENTS"); do client "$i" & PIDS+=($!); done
sleep 15
read -r RSS0 FDS0 THR0 <<< "$(sample)"
wait "${PIDS[@]}"
sleep 3  # the server lets go of the last sessions
read -r RSS1 FDS1 THR1 <<< "$(sample)"
RUNS=$(cat "$WORK"/c*.runs | paste -sd+ | bc)
FAILS=$( [ -f "$WORK/failures" ] && wc -l < "$WORK/failures" || echo 0)
echo "soak: $CLIENTS clients x ${SECONDS_TOTAL}s from $START: $RUNS client runs, $FAILS failed or unverified"
echo "soak: server before: RSS ${RSSB} KiB, ${FDSB} fds, ${THRB} threads; at 15 s: RSS ${RSS0} KiB, ${FDS0} fds, ${THR0} threads; after (idle): RSS ${RSS1} KiB, ${FDS1} fds, ${THR1} threads"
echo "soak: server log lines: $(wc -l < "$WORK/server.log")"
[ "$FAILS" -eq 0 ] || { head -20 "$WORK/failures"; exit 1; }
kill -0 $SERVER || { echo "soak: the server died"; exit 1; }
[ "$FDS1" -le "$FDSB" ] && [ "$THR1" -le "$THRB" ] || { echo "soak: the server kept fds or threads"; exit 1; }
