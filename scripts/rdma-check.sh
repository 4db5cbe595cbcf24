#!/bin/sh
# rdma-check.sh: dmx's rdma transport beside perftest on the same verbs device, as ratios.
#
#   sh scripts/rdma-check.sh [--device DEV] [--dmx PATH] [--iters N] [--addr IP]
#
# Runs, on this host, over DEV (default: the first device ibv_devices lists), both sides on this
# host (the NIC loops the traffic back; between two hosts run the same commands with --connect to
# the other host, see docs/rdma.md):
#   ib_write_bw  -s 1M   and  dmx bench --transport rdma --op write --sizes 1M   (throughput)
#   ib_write_lat -s 8    and  dmx bench --transport rdma --op send --sizes 8     (half a round trip),
#                        once as dmx sends 8 B (inline on its control stream, by SEND over the
#                        rdma_ctl queue pair), once with that stream on TCP (control_pipe=0: as
#                        before rdma_ctl) and once through the rdma path (eager_limit=0: rendezvous)
# and prints dmx/perftest for both. The targets on a real NIC (issue 41): throughput >= 0.9 of
# ib_write_bw at 1 MiB; half a round trip within 1 us of ib_write_lat at 8 B. On soft-RoCE (rxe)
# both run on an emulated CPU: the ratio then says what dmx's per-operation CPU costs against a
# bare verbs loop, not how fast a NIC is. POSIX sh and awk only, so that it runs in
# scripts/rxe-vm.sh's busybox guest. Exits non-zero when a tool is missing or a run fails.
set -eu
dev="" dmx="${DMX_BIN:-build/tools/dmx/dmx}" iters=200 addr=127.0.0.1
while [ $# -gt 0 ]; do
  case "$1" in
    --device) dev=$2; shift 2 ;;
    --dmx) dmx=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --addr) addr=$2; shift 2 ;;
    *) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
for t in ib_write_bw ib_write_lat ibv_devices; do
  command -v "$t" > /dev/null 2>&1 || { echo "rdma-check: $t not found (Debian: perftest, ibverbs-utils)" >&2; exit 1; }
done
[ -x "$dmx" ] || { echo "rdma-check: no dmx binary at $dmx (--dmx PATH)" >&2; exit 1; }
if [ -z "$dev" ]; then
  dev=$(ibv_devices | awk 'NR > 2 && $1 != "" { print $1; exit }')
  [ -n "$dev" ] || { echo "rdma-check: ibv_devices lists no RDMA device" >&2; exit 1; }
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# perftest: a server in the background, the client against it; prints the client's data line.
perftest() {
  tool=$1; shift
  "$tool" -d "$dev" -F "$@" > "$tmp/server.log" 2>&1 &
  srv=$!
  sleep 1
  "$tool" -d "$dev" -F "$@" "$addr" > "$tmp/client.log" 2>&1 || { cat "$tmp/client.log" >&2; kill $srv 2> /dev/null; return 1; }
  wait $srv || true
  awk '$1 ~ /^[0-9]+$/ && NF >= 5 { line = $0 } END { print line }' "$tmp/client.log" | tee -a "$tmp/raw"
}

# dmx bench between two processes here, rdma forced on this device; prints its JSON line.
dmxbench() {
  port=$(( 20000 + $$ % 20000 ))
  env DMX_TRANSPORT=rdma DMX_RDMA_DEVICE=$dev ${DMX_EAGER:+DMX_EAGER_LIMIT=$DMX_EAGER} ${DMX_CP:+DMX_CONTROL_PIPE=$DMX_CP} "$dmx" bench --listen "tcp://$addr:$port" > "$tmp/dmx-server.log" 2>&1 &
  srv=$!
  sleep 1
  env DMX_TRANSPORT=rdma DMX_RDMA_DEVICE=$dev DMX_CONNECT_RETRY_REFUSED=true ${DMX_EAGER:+DMX_EAGER_LIMIT=$DMX_EAGER} ${DMX_CP:+DMX_CONTROL_PIPE=$DMX_CP} \
    "$dmx" bench --connect "tcp://$addr:$port" --mem host --transport rdma --iters "$iters" --json "$@" \
    > "$tmp/dmx.json" 2> "$tmp/dmx-client.log" || { cat "$tmp/dmx-client.log" >&2; kill $srv 2> /dev/null; return 1; }
  kill $srv 2> /dev/null || true
  wait $srv 2> /dev/null || true
  tail -1 "$tmp/dmx.json"
}
# A number field of a one-line JSON object.
field() { printf '%s\n' "$2" | sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p"; }

echo "rdma-check: device $dev, dmx $dmx, $iters iterations"
bw=$(perftest ib_write_bw -s 1048576 -n "$iters")
lat=$(perftest ib_write_lat -s 8 -n "$iters")
jbw=$(dmxbench --op write --sizes 1M)
jlat=$(dmxbench --op send --sizes 8)
jpath=$(DMX_EAGER=0 dmxbench --op send --sizes 8)
jtcp=$(DMX_CP=0 dmxbench --op send --sizes 8)
echo "perftest client lines (ib_write_bw, ib_write_lat):"
sed 's/^/  /' "$tmp/raw"
# ib_write_bw: "#bytes #iterations BW-peak BW-average MsgRate" in MiB/s; ib_write_lat: t_typical
# (column 5) is half a round trip in us. dmx: gb_per_s (1e9 B/s); p50_us of a send ping-pong is
# already half a round trip (bench_client.cc halves each sample).
pbw=$(printf '%s\n' "$bw" | awk '{ printf "%.4f", $4 * 1048576 / 1e9 }')
plat=$(printf '%s\n' "$lat" | awk '{ print $5 }')
dbw=$(field gb_per_s "$jbw")
dlat=$(field p50_us "$jlat" | awk '{ printf "%.3f", $1 }')
dpath=$(field p50_us "$jpath" | awk '{ printf "%.3f", $1 }')
dtcp=$(field p50_us "$jtcp" | awk '{ printf "%.3f", $1 }')
conduit=$(printf '%s\n' "$jlat" | sed -n 's/.*"control_stream":"\([^"]*\)".*/\1/p')
[ -n "$pbw" ] && [ -n "$plat" ] && [ -n "$dbw" ] && [ -n "$dlat" ] && [ -n "$dpath" ] && [ -n "$dtcp" ] || {
  echo "rdma-check: could not read a result (perftest: '$bw' / '$lat'; dmx: '$jbw' / '$jlat')" >&2
  exit 1
}
echo "dmx: write 1 MiB: transport $(printf '%s\n' "$jbw" | sed -n 's/.*"transport":"\([^"]*\)".*/\1/p'), $(field peer_path_chunks_received "$jbw") chunks by a path at the peer; send 8 B by the path: $(field peer_path_chunks_received "$jpath") chunks by a path"
echo "ib_write_bw  1 MiB: $pbw GB/s    dmx write 1 MiB: $dbw GB/s    ratio $(awk -v a="$dbw" -v b="$pbw" 'BEGIN { printf "%.3f", a / b }') (target >= 0.9 on a NIC)"
echo "ib_write_lat 8 B:   $plat us     dmx send 8 B half RTT (stream 0 on $conduit): $dlat us    ratio $(awk -v a="$dlat" -v b="$plat" 'BEGIN { printf "%.2f", a / b }'), difference $(awk -v a="$dlat" -v b="$plat" 'BEGIN { printf "%+.2f", a - b }') us (target <= +1 us on a NIC)"
echo "ib_write_lat 8 B:   $plat us     dmx send 8 B by the rdma path (eager_limit=0) half RTT: $dpath us    ratio $(awk -v a="$dpath" -v b="$plat" 'BEGIN { printf "%.2f", a / b }')"
echo "ib_write_lat 8 B:   $plat us     dmx send 8 B half RTT, stream 0 on TCP (control_pipe=0): $dtcp us    ratio $(awk -v a="$dtcp" -v b="$plat" 'BEGIN { printf "%.2f", a / b }')"
case "$plat" in *inf*|*nan*) echo "rdma-check: perftest's clock gave $plat here (its cycle counter; common in emulated guests): its ratios mean nothing" ;; esac
