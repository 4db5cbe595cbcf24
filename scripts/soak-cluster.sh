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
# SOAK_LINKS=2: each host gets a second link (eth1, 10.202.x.x, on a second bridge; etcd is reached
# over it), servers listen on the wildcard so the store lists both addresses and every endpoint
# spreads its streams over both links, and every SOAK_CUT_EVERY seconds (10) one random host's first
# link, the one every control stream of that host starts on, is cut (`ip link set eth0 down`) for
# SOAK_CUT_FOR seconds (5) and brought back: established endpoints move their control stream to the
# other link and go on. A cut is noticed by busy_peer_timeout (SOAK_BUSY_PEER_TIMEOUT, 1500ms here as
# in tests/netns/multilink.sh; off by default, when only peer_timeout would notice). Kills go on
# beside the cuts (SOAK_KILL_EVERY=0: none).
#   SOAK_LINKS=2 SOAK_SECONDS=600 SOAK_HOSTS=8 bash scripts/soak-cluster.sh [build-dir]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
DMX=$BUILD/tools/dmx/dmx
TOTAL=${SOAK_SECONDS:-600}
HOSTS=${SOAK_HOSTS:-8}
EVERY=${SOAK_KILL_EVERY:-30}
SIZES=${SOAK_SIZES:-1,65537,1048577,4194301}
LINKS=${SOAK_LINKS:-1}
CUT_EVERY=${SOAK_CUT_EVERY:-10}
CUT_FOR=${SOAK_CUT_FOR:-5}
source "$ROOT/tests/netns/cluster_lib.sh"
why=$(cl_skip); [[ -z $why ]] || { echo "soak-cluster: cannot run: $why"; exit 2; }
[[ -x $DMX ]] || { echo "soak-cluster: no dmx at $DMX"; exit 2; }
trap 'kill $(jobs -p) 2>/dev/null; cl_down' EXIT
cl_up "$HOSTS" || { echo "soak-cluster: namespaces"; exit 1; }
LISTEN_AT=cl_addr
if [[ $LINKS -eq 2 ]]; then  # the second link: eth1 on br1, and etcd on it, out of the cuts' way
  sw=$(cl_ns sw)
  ip -n "$sw" link add br1 type bridge && ip -n "$sw" link set br1 up || { echo "soak-cluster: br1"; exit 1; }
  CL_STORE_ADDR=10.202.$CL_NET.254; CL_STORE=etcd://$CL_STORE_ADDR:2379
  ip -n "$sw" addr add "$CL_STORE_ADDR/24" dev br1
  for (( i = 0; i < HOSTS; i++ )); do
    ns=$(cl_ns "$i")
    ip -n "$ns" link add eth1 type veth peer name "q$i" netns "$sw" || { echo "soak-cluster: eth1"; exit 1; }
    ip -n "$ns" addr add "10.202.$CL_NET.$(( i + 1 ))/24" dev eth1
    ip -n "$ns" link set eth1 up
    ip -n "$sw" link set "q$i" master br1
    ip -n "$sw" link set "q$i" up
  done
  LISTEN_AT() { echo 0.0.0.0; }; LISTEN_AT=LISTEN_AT
  export DMX_BUSY_PEER_TIMEOUT=${SOAK_BUSY_PEER_TIMEOUT:-1500ms}
fi
cl_etcd_start || exit 1
export DMX_AUTH_KEY=dmx-cluster-soak-key-0123456789 DMX_LOG_LEVEL=${SOAK_LOG_LEVEL:-warn} DMX_STORE=$CL_STORE DMX_STORE_JOB=soak
export DMX_CONNECT_TIMEOUT=10s DMX_STREAMS=2
OUT=$CL_DIR/out; mkdir -p "$OUT"
KEEP=${SOAK_KEEP:-/tmp/soak-cluster-$(date -u +%Y%m%dT%H%M%S)}; mkdir -p "$KEEP"  # failed runs' logs, the tally

serve() {
  DMX_STORE_NAME=w$1 cl_spawn "$1" "$OUT/server$1.log" "$DMX" bench --listen "tcp://$($LISTEN_AT "$1"):7400"
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
      # The error that ended the run: warnings (a stream down, its frames moved) come before it.
      reason=$(grep -v '"size_bytes"' "$log" | grep -v '\[warning\]' |
               grep -E 'error|failed|refused|unavailable|timeout|not found' | tail -1 |
               sed -E 's/^\[[0-9:.]+\] //; s/[0-9]+ ms/N ms/g; s/epoch [0-9]+/epoch N/g; s/pid [0-9]+/pid N/g; s/:[0-9]{4,5}/:P/g; s/\.[0-9]+:P/.N:P/g' |
               cut -c1-220)
      [[ -n $reason ]] || reason="exit $rc: $(tail -1 "$log" | cut -c1-200)"
    fi
    local moved; moved=$(grep -c 'control frames move to stream' "$log")
    echo "$i $j $op rc=$rc rows=$rows differ=$bad bytes=$bytes moved=$moved reason=$reason" >> "$OUT/client$i.txt"
    [[ $rc -eq 0 && $bad -eq 0 && -z ${SOAK_KEEP_ALL:-} ]] && rm -f "$log" || mv "$log" "$KEEP/"
    n=$(( n + 1 )); j=$(( (j + 1) % HOSTS ))
  done
}

for (( i = 0; i < HOSTS; i++ )); do serve "$i"; done
sleep 3
clients=()
for (( i = 0; i < HOSTS; i++ )); do client "$i" & clients+=($!); done
cutter() {  # one random host's first link down for CUT_FOR seconds, every CUT_EVERY seconds
  local end=$(( SECONDS + TOTAL )) v
  while (( SECONDS + CUT_EVERY < end )); do
    sleep "$CUT_EVERY"
    v=$(( RANDOM % HOSTS ))
    ip -n "$(cl_ns "$v")" link set eth0 down
    echo "$(date -u +%T) cut eth0 of h$v" >> "$OUT/cuts.txt"
    sleep "$CUT_FOR"
    ip -n "$(cl_ns "$v")" link set eth0 up
  done
}
[[ $LINKS -eq 2 && $CUT_EVERY -gt 0 ]] && { cutter & clients+=($!); }
kills=0; end=$(( SECONDS + TOTAL ))
while (( EVERY > 0 && SECONDS + EVERY < end )); do
  sleep "$EVERY"
  v=$(( RANDOM % HOSTS ))
  pid=$(cat "$OUT/server$v.pid")
  kill -9 "$pid" 2>/dev/null
  # Gone before its successor binds the same port (a dying process still holds its listener).
  for (( t = 0; t < 100; t++ )); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  wait "$pid" 2>/dev/null
  serve "$v"; kills=$(( kills + 1 ))
  echo "$(date -u +%T) killed and restarted w$v" >> "$OUT/kills.txt"
done
wait "${clients[@]}"
sleep 1
cat "$OUT"/client*.txt > "$OUT/all.txt"; cp "$OUT/all.txt" "$OUT/kills.txt" "$OUT/cuts.txt" "$KEEP/" 2>/dev/null
cat "$OUT"/server*.log > "$KEEP/servers.log" 2>/dev/null
echo "soak-cluster: logs of failed runs and the tally in $KEEP"
runs=$(wc -l < "$OUT/all.txt")
okruns=$(grep -c ' rc=0 ' "$OUT/all.txt")
ops=$(awk '{split($5, a, "="); s += a[2] * 2} END {print s + 0}' "$OUT/all.txt")
differ=$(awk '{split($6, a, "="); s += a[2]} END {print s + 0}' "$OUT/all.txt")
bytes=$(awk '{split($7, a, "="); s += a[2]} END {print s + 0}' "$OUT/all.txt")
echo "soak-cluster: $HOSTS hosts, $LINKS link(s) each, ${TOTAL}s, $kills kills (one every ${EVERY}s), sizes $SIZES"
if [[ $LINKS -eq 2 ]]; then
  cuts=$(wc -l < "$OUT/cuts.txt" 2>/dev/null || echo 0)
  cmoved=$(awk '{split($8, a, "="); s += a[2]} END {print s + 0}' "$OUT/all.txt")
  smoved=$(cat "$OUT"/server*.log | grep -c 'control frames move to stream')
  echo "  $cuts cuts of a host's first link (${CUT_FOR}s each, one every ${CUT_EVERY}s); control streams moved:" \
       "$cmoved logged by clients, $smoved by servers"
fi
echo "  runs $runs (ok $okruns, failed $(( runs - okruns ))), verified transfers $ops, bytes moved $bytes"
echo "  transfers whose bytes differed: $differ"
echo "  server starts that failed: $(cat "$OUT"/server*.log | grep -c 'dmx bench: .*error')"
echo "  failures by reason:"
grep -v ' rc=0 ' "$OUT/all.txt" | sed 's/.*reason=//' | sort | uniq -c | sort -rn | head -20 | sed 's/^/    /'
unexplained=$(grep -v ' rc=0 ' "$OUT/all.txt" | grep -vcE 'peer failed|lost the peer|refused|not found|timeout|unavailable|closed|unreachable|is down')
echo "  failures no kill explains: $unexplained"
[[ $differ -eq 0 && $unexplained -eq 0 ]]
