#!/usr/bin/env bash
# Several NICs, measured: two namespaces joined by two veth links, each shaped with tbf
# (tests/netns/links_lib.sh), 256 MiB sends from A to B. Prints a markdown table for
# docs/performance.md, then the time a frozen peer (SIGSTOP) takes to be noticed. Sets up, runs and
# tears down; needs root.
#
#   scripts/multinic-bench.sh [RATE] [ITERS] [DETECT_RUNS]   (defaults 1gbit 6 5)
#   DETECT_ONLY=1 scripts/multinic-bench.sh ...               the detection runs only
#
# Rows, all in the same run:
#   one link            DMX_NICS=ml0: every data stream on link 1 (rate RATE)
#   two links           both links at RATE: target >= 1.8x one link
#   two links, 1 + 1/4  link 2 shaped to RATE/4: target >= 0.9 of the sum (1.25 RATE)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DMX=${DMX_BIN:-$ROOT/build/tools/dmx/dmx}
source "$ROOT/tests/netns/links_lib.sh"
RATE=${1:-1gbit}
ITERS=${2:-6}
RUNS=${3:-5}
STREAMS=${STREAMS:-4}
[[ -x $DMX ]] || { echo "no dmx binary at $DMX" >&2; exit 1; }
s="b$$"
out=$(links_up "$s" 2>&1) || { links_down "$s"; echo "links up failed: $out" >&2; exit 1; }
trap 'links_down "$s"' EXIT
A=$(links_ns "$s" a); B=$(links_ns "$s" b)
addr_b=$(links_addr "$s" 1 b)
export DMX_AUTH_KEY=multinic-bench-key-0123456789 DMX_LOG_LEVEL=warn DMX_CONNECT_RETRY_REFUSED=true
ip netns exec "$B" "$DMX" bench --listen "tcp://0.0.0.0:7600" > /dev/null 2>&1 &
sleep 1
mbit() {  # tc rate -> Mbit/s
  local r=$1
  case $r in *gbit) echo $(( ${r%gbit} * 1000 ));; *mbit) echo "${r%mbit}";; *) echo 0;; esac
}
rate_mb=$(mbit "$RATE")
quarter="$((rate_mb / 4))mbit"
run() {  # label, expected Mbit/s sum of the links, env...
  local label=$1 sum=$2; shift 2
  local row gbps
  row=$(env "$@" timeout 300 ip netns exec "$A" "$DMX" bench --connect "tcp://$addr_b:7600" --mem host --sizes 256M \
        --iters "$ITERS" --streams "$STREAMS" --json 2>&1 | grep '"size_bytes"' | tail -1)
  gbps=$(sed -n 's/.*"gb_per_s":\([0-9.e+-]*\).*/\1/p' <<< "$row")
  [[ -n $gbps ]] || { echo "| $label | failed | | |"; return; }
  # gb_per_s is GB/s (10^9 bytes): Mbit/s = GB/s * 8000.
  awk -v l="$label" -v g="$gbps" -v s="$sum" -v one="$ONE" 'BEGIN {
    m = g * 8000; printf "| %s | %.0f Mbit/s | %.2f of the links'"'"' sum (%d Mbit/s) | %s |\n", l, m, m / s, s,
      (one > 0 ? sprintf("%.2fx one link", m / one) : "reference") }'
  [[ $label == "one link" ]] && ONE=$(awk -v g="$gbps" 'BEGIN { print g * 8000 }')
}
ONE=0
links_shape "$s" ml0 "$RATE" && links_shape "$s" ml1 "$RATE" || { echo "tc tbf failed" >&2; exit 1; }
echo "date $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r); tbf rate $RATE per link; $STREAMS data streams; 256 MiB sends, $ITERS iterations"
echo
echo "| links | rate | of the shaped sum | against one link |"
echo "|---|---|---|---|"
[[ ${DETECT_ONLY:-0} == 1 ]] || run "one link" "$rate_mb" DMX_NICS=ml0
[[ ${DETECT_ONLY:-0} == 1 ]] || run "two links, equal" "$((2 * rate_mb))"
links_shape "$s" ml1 "$quarter"
[[ ${DETECT_ONLY:-0} == 1 ]] || run "two links, 1 + 1/4" "$((rate_mb + rate_mb / 4))"
links_shape "$s" ml1 "$RATE"

# Dead peer: B frozen mid-transfer; how long until A's pending send fails naming it.
echo
export DMX_BUSY_PEER_TIMEOUT=${DMX_BUSY_PEER_TIMEOUT:-1500ms}  # off by default
echo "frozen peer (SIGSTOP) noticed after, seconds (busy_peer_timeout $DMX_BUSY_PEER_TIMEOUT):"
for i in $(seq 1 "$RUNS"); do
  log=$(mktemp)
  ip netns exec "$A" "$DMX" bench --connect "tcp://$addr_b:7600" --mem host --sizes 256M --iters 1000 \
      --streams "$STREAMS" > "$log" 2>&1 & pid=$!
  links_wait_rx "$B" $((64 << 20))  # sends in flight: operations pending (idle endpoints keep peer_timeout)
  server=$(ip netns pids "$B" | head -1)
  kill -STOP "$server"
  start=$(date +%s.%N)
  wait $pid
  took=$(echo "$(date +%s.%N) - $start" | bc)
  kill -CONT "$server"
  printf '  %.2f  %s\n' "$took" "$(grep -o 'peer sent nothing[^)]*)' "$log" | head -1)"
  rm -f "$log"
  sleep 1
done
