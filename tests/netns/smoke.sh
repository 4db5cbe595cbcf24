#!/usr/bin/env bash
# Smoke test of scripts/netns.sh: bring two namespaces up, ping across, run iperf3 across for
# 1 s, try netem (reported, not required: some kernels lack sch_netem), tear down, and check
# that nothing is left behind.
# Exit: 0 PASS, or "SKIPPED: reason" when it cannot run here (not root, no ip netns); 1 FAIL.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NETNS=$HERE/../../scripts/netns.sh
SUFFIX=smoke$$

skip() { echo "SKIPPED: $*"; exit 0; }
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "-- $*"; }

[ "$(id -u)" -eq 0 ] || skip "not root (ip netns needs CAP_SYS_ADMIN)"
command -v ip >/dev/null 2>&1 || skip "'ip' (iproute2) not installed"
ip netns list >/dev/null 2>&1 || skip "'ip netns' unavailable: $(ip netns list 2>&1 | head -n1)"

server_pid=""
tmp=$(mktemp -d /tmp/dmx-netns-smoke.XXXXXX)
# shellcheck disable=SC2317  # invoked by trap
cleanup() {
  if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  "$NETNS" down "$SUFFIX" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

step "up $SUFFIX"
rc=0; out=$("$NETNS" up "$SUFFIX" 2>&1 >/dev/null) || rc=$?
[ "$rc" -ne 3 ] || skip "$out"
[ "$rc" -eq 0 ] || fail "netns.sh up failed: $out"
addr_a=$("$NETNS" addr "$SUFFIX" a)
addr_b=$("$NETNS" addr "$SUFFIX" b)
ns_a=$("$NETNS" name "$SUFFIX" a)
ns_b=$("$NETNS" name "$SUFFIX" b)
"$NETNS" list | grep -qx "$ns_a" || fail "$ns_a not listed"
"$NETNS" list | grep -qx "$ns_b" || fail "$ns_b not listed"
ip -n "$ns_a" -4 addr show dev dmx0 | grep -q "inet $addr_a/30" || fail "$ns_a has no $addr_a/30"
ip link show dmx0 >/dev/null 2>&1 && fail "dmx0 leaked into the root namespace"
echo "   $ns_a $addr_a <-> $ns_b $addr_b"

step "second up with the same suffix is refused"
if "$NETNS" up "$SUFFIX" >/dev/null 2>&1; then fail "second up succeeded"; fi

step "ping A -> B"
if command -v ping >/dev/null 2>&1; then
  "$NETNS" exec "$SUFFIX" a ping -c 3 -i 0.2 -W 1 "$addr_b" >"$tmp/ping" || { cat "$tmp/ping"; fail "ping $addr_b from $ns_a"; }
  tail -n1 "$tmp/ping" | sed 's/^/   /'
else
  echo "   ping not installed (iputils-ping); reachability is checked by iperf3 below"
fi

step "iperf3 A -> B, 1 s"
if command -v iperf3 >/dev/null 2>&1; then
  port=5201
  ip netns exec "$ns_b" iperf3 -s -1 -p "$port" -B "$addr_b" >"$tmp/server" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 50); do
    ip netns exec "$ns_b" ss -Hltn "sport = :$port" | grep -q . && break
    sleep 0.1
  done
  timeout -k 2 20 ip netns exec "$ns_a" iperf3 -c "$addr_b" -p "$port" -t 1 -J >"$tmp/client" 2>&1 \
    || { tail -n 5 "$tmp/client"; fail "iperf3 client failed"; }
  gbps=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(round(d["end"]["sum_received"]["bits_per_second"]/8e9,3))' "$tmp/client") \
    || fail "iperf3 output unreadable"
  python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$gbps" || fail "iperf3 measured 0"
  echo "   $gbps GB/s over the veth pair"
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
else
  echo "   iperf3 not installed (scripts/install-deps.sh); iperf3 step skipped"
fi

step "netem (optional)"
if out=$("$NETNS" netem "$SUFFIX" --delay 10ms 2>&1); then
  if command -v ping >/dev/null 2>&1; then
    rtt=$("$NETNS" exec "$SUFFIX" a ping -c 2 -i 0.2 -W 2 "$addr_b" | sed -n 's|.*= [0-9.]*/\([0-9.]*\)/.*|\1|p')
    python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 19 else 1)' "${rtt:-0}" || fail "netem delay 10ms per direction gave rtt ${rtt:-?} ms"
    echo "   delay 10ms per direction: rtt $rtt ms"
  fi
  "$NETNS" netem "$SUFFIX" --clear || fail "netem --clear"
else
  echo "   netem unavailable here: $out"
fi

step "process inside a namespace is ended by down"
ip netns exec "$ns_b" sleep 300 &
sleeper=$!
sleep 0.2
"$NETNS" down "$SUFFIX" >/dev/null 2>&1 || fail "netns.sh down failed"
for _ in $(seq 1 20); do kill -0 "$sleeper" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$sleeper" 2>/dev/null; then kill -KILL "$sleeper"; fail "process in $ns_b survived down"; fi
wait "$sleeper" 2>/dev/null || true

step "down is idempotent and leaves nothing"
"$NETNS" down "$SUFFIX" >/dev/null 2>&1 || fail "second down failed"
"$NETNS" list | grep -q "^dmx-test-$SUFFIX-" && fail "namespaces left behind"
echo "PASS"
