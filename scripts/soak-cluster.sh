#!/usr/bin/env bash
# Cluster soak (issue 43; not in CI): SOAK_HOSTS network namespaces on one switch with Debian's
# etcd beside them; each runs a dmx server registered in the store as w<i> and a client that, for
# SOAK_SECONDS, connects by name to every other in turn and runs verified transfers (fresh random
# data, checked end to end by `dmx bench --verify`); every SOAK_KILL_EVERY seconds one random
# server is killed (SIGKILL) and restarted. Counts runs, transfers (operations), bytes moved,
# failures with their reasons, and transfers whose bytes differed (must be 0). Root only.
#   SOAK_SECONDS=600 SOAK_HOSTS=8 SOAK_KILL_EVERY=30 bash scripts/soak-cluster.sh [build-dir]
# Exit status: 0 when no transfer's bytes differed and every failure is one a kill explains
# (the partner failed naming the peer, or a connect hit the restart), else 1.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
DMX=$BUILD/tools/dmx/dmx
TOTAL=${SOAK_SECONDS:-600}
HOSTS=${SOAK_HOSTS:-8}
EVERY=${SOAK_KILL_EVERY:-30}
SIZES=${SOAK_SIZES:-1,65537,1048577,4194301}
source "$ROOT/tests/netns/cluster_lib.sh"
why=$(cl_skip); [[ -z $why ]] || { echo "soak-cluster: cannot run: $why"; exit 2; }
[[ -x $DMX ]] || { echo "soak-cluster: no dmx at $DMX"; exit 2; }
trap 'kill $(jobs -p) 2>/dev/null; cl_down' EXIT
cl_up "$HOSTS" || { echo "soak-cluster: namespaces"; exit 1; }
cl_etcd_start || exit 1
export DMX_AUTH_KEY=dmx-cluster-soak-key-0123456789 DMX_LOG_LEVEL=warn DMX_STORE=$CL_STORE DMX_STORE_JOB=soak
export DMX_CONNECT_TIMEOUT=10s DMX_STREAMS=2
OUT=$CL_DIR/out; mkdir -p "$OUT"
KEEP=${SOAK_KEEP:-/tmp/soak-cluster-$(date -u +%Y%m%dT%H%M%S)}; mkdir -p "$KEEP"  # failed runs' logs, the tally

serve() {
  DMX_STORE_NAME=w$1 cl_spawn "$1" "$OUT/server$1.log" "$DMX" bench --listen "tcp://$(cl_addr "$1"):7400"
  echo $! > "$OUT/server$1.pid"
}

client() {  # host index: round robin over the others until the end
  local i=$1 j=$(( ($1 + 1) % HOSTS )) end=$(( SECONDS + TOTAL )) n=0 ops=(send write read)
  while (( SECONDS < end )); do
    [[ $j -eq $i ]] && { j=$(( (j + 1) % HOSTS )); continue; }
    local op=${ops[$(( n % 3 ))]} log="$OUT/run.$i.$n"
    timeout 120 env -u DMX_STORE_NAME ip netns exec "$(cl_ns "$i")" "$DMX" bench --connect "dmx://soak/w$j" \
      --op "$op" --sizes "$SIZES" --iters 2 --verify --json > "$log" 2>&1
    local rc=$?
    local rows bad bytes
    # A row with "error" failed (its reason is counted below); one without that is not verified differed.
    rows=$(grep -c '"size_bytes"' "$log")
    bad=$(grep '"size_bytes"' "$log" | grep '"verified":false' | grep -vc '"error"')
    bytes=$(grep -o '"size_bytes":[0-9]*' "$log" | awk -F: '{s += $2 * 2} END {print s + 0}')
    local reason=""
    if [[ $rc -ne 0 ]]; then
      reason=$(grep -v '"size_bytes"' "$log" | grep -m1 -E 'error|failed|refused|unavailable|timeout|not found' |
               sed -E 's/[0-9]+ ms/N ms/g; s/epoch [0-9]+/epoch N/g; s/pid [0-9]+/pid N/g; s/:[0-9]{4,5}/:P/g' | cut -c1-220)
      [[ -n $reason ]] || reason="exit $rc: $(tail -1 "$log" | cut -c1-200)"
    fi
    echo "$i $j $op rc=$rc rows=$rows differ=$bad bytes=$bytes reason=$reason" >> "$OUT/client$i.txt"
    [[ $rc -eq 0 && $bad -eq 0 ]] && rm -f "$log" || mv "$log" "$KEEP/"
    n=$(( n + 1 )); j=$(( (j + 1) % HOSTS ))
  done
}

for (( i = 0; i < HOSTS; i++ )); do serve "$i"; done
sleep 3
clients=()
for (( i = 0; i < HOSTS; i++ )); do client "$i" & clients+=($!); done
kills=0; end=$(( SECONDS + TOTAL ))
while (( SECONDS + EVERY < end )); do
  sleep "$EVERY"
  v=$(( RANDOM % HOSTS ))
  kill -9 "$(cat "$OUT/server$v.pid")" 2>/dev/null
  serve "$v"; kills=$(( kills + 1 ))
  echo "$(date -u +%T) killed and restarted w$v" >> "$OUT/kills.txt"
done
wait "${clients[@]}"
sleep 1
cat "$OUT"/client*.txt > "$OUT/all.txt"; cp "$OUT/all.txt" "$OUT/kills.txt" "$KEEP/" 2>/dev/null
echo "soak-cluster: logs of failed runs and the tally in $KEEP"
runs=$(wc -l < "$OUT/all.txt")
okruns=$(grep -c ' rc=0 ' "$OUT/all.txt")
ops=$(awk '{split($5, a, "="); s += a[2] * 2} END {print s + 0}' "$OUT/all.txt")
differ=$(awk '{split($6, a, "="); s += a[2]} END {print s + 0}' "$OUT/all.txt")
bytes=$(awk '{split($7, a, "="); s += a[2]} END {print s + 0}' "$OUT/all.txt")
echo "soak-cluster: $HOSTS hosts, ${TOTAL}s, $kills kills (one every ${EVERY}s), sizes $SIZES"
echo "  runs $runs (ok $okruns, failed $(( runs - okruns ))), verified transfers $ops, bytes moved $bytes"
echo "  transfers whose bytes differed: $differ"
echo "  failures by reason:"
grep -v ' rc=0 ' "$OUT/all.txt" | sed 's/.*reason=//' | sort | uniq -c | sort -rn | head -20 | sed 's/^/    /'
unexplained=$(grep -v ' rc=0 ' "$OUT/all.txt" | grep -vcE 'peer failed|lost the peer|refused|not found|timeout|unavailable|closed')
echo "  failures no kill explains: $unexplained"
[[ $differ -eq 0 && $unexplained -eq 0 ]]
