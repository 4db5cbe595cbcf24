#!/usr/bin/env bash
# Several NICs between two "hosts": namespaces A and B joined by two veth links (links_lib.sh).
# B serves with `dmx bench --listen` on the wildcard address, so its HELLO lists its other
# address; A connects to B's link-1 address and spreads its data streams over both links.
#  1. both links: verified transfers, and A's log says it runs over 2 links;
#  2. link 2 cut mid-transfer (ip link set down, in A): the transfer completes, verified;
#  2b. link 1, which carries the control stream (stream 0), cut mid-transfer: the control stream
#     moves to link 2 and the transfer completes, verified;
#  3. one link (nics=ml0 on A) cut mid-transfer: A fails cleanly, naming B, within a bound;
#  4. B frozen (SIGSTOP) mid-transfer: A fails naming B; prints how long it took.
#  5. reconnect_timeout on both sides, both links down for 3 s mid-transfer, then up: A dials B
#     again until a link is back, rejoins, and the transfer completes, verified.
# Bounds are generous (a loaded 2-core machine runs this); scripts/multinic-bench.sh measures.
# Prints "SKIPPED: reason" and exits 0 where namespaces cannot be made (not root).
set -uo pipefail
export DMX_CONNECT_RETRY_REFUSED=true
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DMX=${DMX_BIN:-$ROOT/build/tools/dmx/dmx}
source "$ROOT/tests/netns/links_lib.sh"
[[ -x $DMX ]] || { echo "FAIL: no dmx binary at $DMX"; exit 1; }
s="t$$"
out=$(links_up "$s" 2>&1); rc=$?
if [[ $rc -eq 3 ]]; then links_down "$s"; echo "SKIPPED: $out"; exit 0; fi
[[ $rc -eq 0 ]] || { links_down "$s"; echo "FAIL: links up: $out"; exit 1; }
trap 'links_down "$s"; rm -f /tmp/dmx-ml-$$-*.log' EXIT
A=$(links_ns "$s" a); B=$(links_ns "$s" b)
addr_b=$(links_addr "$s" 1 b)
export DMX_AUTH_KEY=multilink-test-key-0123456789 DMX_LOG_LEVEL=info
# Rates low enough that a 256 MiB message takes seconds, so a cut lands mid-transfer.
links_shape "$s" ml0 400mbit && links_shape "$s" ml1 400mbit || { echo "FAIL: tc tbf"; exit 1; }
ip netns exec "$B" "$DMX" bench --listen "tcp://0.0.0.0:7500" > /tmp/dmx-ml-$$-server.log 2>&1 &
sleep 1
fail=0
export DMX_BUSY_PEER_TIMEOUT=${DMX_BUSY_PEER_TIMEOUT:-1500ms}  # off by default; these scripts measure it
client() {  # log file, then dmx bench arguments
  local log=$1; shift
  timeout 180 ip netns exec "$A" "$DMX" bench --connect "tcp://$addr_b:7500" --mem host --verify --json "$@" > "$log" 2>&1
}
verified() {  # log: every row verified, at least one
  local rows bad
  rows=$(grep -c '"size_bytes"' "$1"); bad=$(grep '"size_bytes"' "$1" | grep -vc '"verified":true')
  [[ $rows -gt 0 && $bad -eq 0 ]]
}

log=/tmp/dmx-ml-$$-1.log
client "$log" --sizes 1,4097,16777219,67108867 --streams 4 --iters 2; rc=$?
if [[ $rc -ne 0 ]] || ! verified "$log" || ! grep -q "over 2 links" "$log"; then
  echo "FAIL: two links (exit $rc)"; tail -5 "$log"; fail=1
else
  echo "ok: two links: $(grep -o '[0-9]* data streams over 2 links: .*' "$log" | head -1)"
fi

# A link cut mid-transfer: the chunks on it move to the other; every byte arrives once.
log=/tmp/dmx-ml-$$-2.log
client "$log" --sizes 256M --streams 4 --iters 3 & pid=$!
links_wait_rx "$B" $((64 << 20))  # mid-transfer
ip -n "$A" link set ml1 down
wait $pid; rc=$?
ip -n "$A" link set ml1 up
# Either side may notice first (the receiver, with its receives pending, often does).
if [[ $rc -ne 0 ]] || ! verified "$log" || ! grep -q "is down" "$log" /tmp/dmx-ml-$$-server.log; then
  echo "FAIL: link 2 cut mid-transfer (exit $rc)"; grep -v '^{' "$log" | tail -5; fail=1
else
  echo "ok: link 2 cut mid-transfer: $(grep -c '"verified":true' "$log") verified rows; $(grep -ho 'stream [0-9] ([^)]*) is down' "$log" /tmp/dmx-ml-$$-server.log | head -1)"
fi

# The link of stream 0 (the control stream) cut mid-transfer: control moves to the other link and
# every byte still arrives once. Small messages (eager, on the control stream) ride beside the big
# ones.
log=/tmp/dmx-ml-$$-2b.log
client "$log" --sizes 1,4097,256M --streams 4 --iters 3 & pid=$!
links_wait_rx "$B" $((64 << 20))  # mid-transfer
ip -n "$A" link set ml0 down
wait $pid; rc=$?
ip -n "$A" link set ml0 up
if [[ $rc -ne 0 ]] || ! verified "$log" || ! grep -q "control frames move to stream" "$log" /tmp/dmx-ml-$$-server.log; then
  echo "FAIL: link 1 (control stream) cut mid-transfer (exit $rc)"; grep -v '^{' "$log" | tail -5; fail=1
else
  echo "ok: link 1 (control stream) cut mid-transfer: $(grep -c '"verified":true' "$log") verified rows; $(grep -ho 'control stream 0 is down; control frames move to stream [0-9]* ([^)]*)' "$log" | head -1)"
fi

# One link, cut: a clean failure naming the peer, in bounded time.
log=/tmp/dmx-ml-$$-3.log
DMX_NICS=ml0 client "$log" --sizes 256M --streams 4 --iters 100 & pid=$!
links_wait_rx "$B" $((64 << 20))  # sends in flight: operations pending (idle endpoints keep peer_timeout)
ip -n "$A" link set ml0 down
start=$(date +%s.%N)
wait $pid; rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
ip -n "$A" link set ml0 up
if [[ $rc -eq 0 ]] || ! grep -q "$addr_b" "$log" || (( $(echo "$took > 30" | bc) )); then
  echo "FAIL: one link cut: exit $rc after ${took}s"; grep -v '^{' "$log" | tail -5; fail=1
else
  echo "ok: one link cut: failed after ${took}s: $(grep -o 'lost the peer[^]]*' "$log" | head -1)"
fi

# The peer frozen: noticed after busy_peer_timeout (1.5 s, set below; off by default) and a look or two; bounded at 15 s here
# (a loaded machine; scripts/multinic-bench.sh measures).
log=/tmp/dmx-ml-$$-4.log
client "$log" --sizes 256M --streams 4 --iters 100 & pid=$!
links_wait_rx "$B" $((64 << 20))  # sends in flight: operations pending
server=$(ip netns pids "$B" | head -1)
kill -STOP $server
start=$(date +%s.%N)
wait $pid; rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
kill -CONT $server
if [[ $rc -eq 0 ]] || ! grep -q "$addr_b" "$log" || (( $(echo "$took > 15" | bc) )); then
  echo "FAIL: frozen peer: exit $rc after ${took}s"; grep -v '^{' "$log" | tail -5; fail=1
else
  echo "ok: frozen peer noticed after ${took}s: $(grep -o 'lost the peer[^]]*' "$log" | head -1)"
fi
# Reconnect: every link down for 3 s, then up; the endpoint rejoins and the transfer completes.
DMX_RECONNECT_TIMEOUT=60s ip netns exec "$B" "$DMX" bench --listen "tcp://0.0.0.0:7501" > /tmp/dmx-ml-$$-server5.log 2>&1 &
server5=$!
sleep 1
log=/tmp/dmx-ml-$$-5.log
DMX_NICS=ml0 DMX_RECONNECT_TIMEOUT=60s timeout 180 ip netns exec "$A" "$DMX" bench --connect "tcp://$addr_b:7501" \
  --mem host --verify --json --sizes 4097,256M --streams 4 --iters 2 > "$log" 2>&1 & pid=$!
links_wait_rx "$B" $((64 << 20))
ip -n "$A" link set ml0 down; ip -n "$A" link set ml1 down
sleep 3
ip -n "$A" link set ml0 up; ip -n "$A" link set ml1 up
wait $pid; rc=$?
kill $server5 2>/dev/null
if [[ $rc -ne 0 ]] || ! verified "$log" || ! grep -q "reconnected after" "$log"; then
  echo "FAIL: reconnect after 3 s without links (exit $rc)"; grep -v '^{' "$log" | tail -5; fail=1
else
  echo "ok: reconnect: $(grep -c '"verified":true' "$log") verified rows; $(grep -o 'reconnected after [0-9]* ms' "$log" | head -1)"
fi
[[ $fail -eq 0 ]] && echo "PASS" || echo "FAIL"
exit $fail
