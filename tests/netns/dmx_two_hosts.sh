#!/usr/bin/env bash
# dmx between two "hosts": network namespaces A and B joined by a veth pair. B serves with
# `dmx bench --listen`, A runs verified transfers (odd sizes, host and simulated-device memory,
# two-sided and one-sided), then B's server is killed mid-run and A must fail promptly, naming B.
# Prints "SKIPPED: reason" and exits 0 where namespaces cannot be made (not root).
set -uo pipefail
# The listener starts in the background: the client waits for it rather than failing at once.
export DMX_CONNECT_RETRY_REFUSED=true
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DMX=${DMX_BIN:-$ROOT/build/tools/dmx/dmx}
NETNS="$ROOT/scripts/netns.sh"
[[ $(id -u) -eq 0 ]] || { echo "SKIPPED: needs root for ip netns"; exit 0; }
[[ -x $DMX ]] || { echo "FAIL: no dmx binary at $DMX"; exit 1; }
suffix="2h$$"
out=$("$NETNS" up "$suffix" 2>&1); rc=$?
if [[ $rc -eq 3 ]]; then echo "SKIPPED: $out"; exit 0; fi
[[ $rc -eq 0 ]] || { echo "FAIL: netns up: $out"; exit 1; }
trap '"$NETNS" down "$suffix" >/dev/null 2>&1' EXIT
addr_b=$("$NETNS" addr "$suffix" b)
export DMX_AUTH_KEY=two-hosts-test-key-0123456789 DMX_LOG_LEVEL=warn
"$NETNS" exec "$suffix" b "$DMX" bench --listen "tcp://$addr_b:7400" &
sleep 1
fail=0
run() {  # name, then dmx bench arguments; every row must say verified
  local name=$1; shift
  local outp
  outp=$(timeout 120 "$NETNS" exec "$suffix" a "$DMX" bench --connect "tcp://$addr_b:7400" --verify --json "$@" 2>&1)
  local rc=$? rows bad
  rows=$(grep -c '"size_bytes"' <<< "$outp")
  bad=$(grep '"size_bytes"' <<< "$outp" | grep -vc '"verified":true')
  if [[ $rc -ne 0 || $rows -eq 0 || $bad -ne 0 ]]; then
    echo "FAIL: $name (exit $rc, $rows rows, $bad unverified)"; echo "$outp" | tail -5; fail=1
  else
    echo "ok: $name ($rows sizes verified)"
  fi
}
run "send host->host" --mem host --peer-mem host --sizes 0,1,4097,67108867 --streams 4 --iters 3
run "send sim->host" --mem sim --peer-mem host --sizes 1,4097,67108867 --streams 2 --iters 3
run "send host->sim" --mem host --peer-mem sim --sizes 1,4097,67108867 --streams 3 --iters 3
run "write host->sim" --op write --mem host --peer-mem sim --sizes 1,4097,16777219 --iters 3
run "read sim<-host" --op read --mem sim --peer-mem host --sizes 1,4097,16777219 --iters 3

# Kill B's server while A is in a long run: A must fail within seconds with an error naming B.
( timeout 60 "$NETNS" exec "$suffix" a "$DMX" bench --connect "tcp://$addr_b:7400" --mem host --sizes 256M \
    --iters 100000 > /tmp/dmx-2h-$$.log 2>&1; echo "exit $?" >> /tmp/dmx-2h-$$.log ) &
watcher=$!
sleep 2
kill -9 $(pgrep -f "bench --listen tcp://$addr_b:7400") 2>/dev/null
start=$(date +%s)
wait $watcher
took=$(( $(date +%s) - start ))
if grep -q "exit 0" /tmp/dmx-2h-$$.log || ! grep -q "$addr_b" /tmp/dmx-2h-$$.log || [[ $took -gt 15 ]]; then
  echo "FAIL: killing the server: the client did not fail promptly naming $addr_b (took ${took}s)"
  tail -3 /tmp/dmx-2h-$$.log; fail=1
else
  echo "ok: server killed, client failed in ${took}s: $(grep -m1 -o 'peer failed[^]]*' /tmp/dmx-2h-$$.log)"
fi
rm -f /tmp/dmx-2h-$$.log
[[ $fail -eq 0 ]] && echo "PASS" || echo "FAIL"
exit $fail
