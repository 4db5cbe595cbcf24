#!/usr/bin/env bash
# Host TCP reference for dmx bench: kernel TCP throughput measured by iperf3.
#
#   bench/ref/iperf3.sh [--streams 1,2,4,8] [--time SECONDS] [--omit SECONDS]
#                       [--mode auto|parallel|procs] [--host ADDR] [--len BYTES]
#                       [--netns SUFFIX|auto] [--zerocopy]
#
# For each stream count N, starts a one-shot server (`iperf3 -s -1`) on a free port, runs a
# client for --time seconds and prints one JSON line on stdout:
#   {"ref":"iperf3","streams":N,"gb_per_s":...,"threads":T,"mode":"parallel",
#    "iperf3_version":"3.12","multithreaded":false,"path":"loopback",...}
# gb_per_s is bytes received per second / 1e9 (decimal GB/s, the unit dmx bench uses).
#
# Threading matters: iperf3 >= 3.16 runs one thread per stream, so `-P N` uses N cores;
# older iperf3 (3.12 in Debian 12) runs all N streams in ONE thread, so `-P N` is capped
# by one core and is a weak reference for a multi-threaded sender. Modes:
#   parallel  one client `-P N` (threads = N on >= 3.16, 1 on older versions)
#   procs     N client processes `-P 1` against N servers, summed (threads = N on any version)
#   auto      parallel on a multi-threaded iperf3, procs on an older one (the default)
# Every line says which mode ran and how many threads carried the streams.
#
# --netns SUFFIX runs the server in namespace B and the client in A of scripts/netns.sh;
# --netns auto brings up its own pair (suffix iperfPID) and tears it down on exit.
# Bounded: each run is killed after time+omit+20 s; servers are killed on exit.
# Exit status: 0 all runs measured; 1 a run failed (a JSON line with "error" says why);
# 2 usage; 3 iperf3 missing.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NETNS_SH=$HERE/../../scripts/netns.sh

streams=1,2,4,8
seconds=3
omit=1
mode=auto
host=""
len=""
netns=""
zerocopy=0

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --streams) streams=${2:?}; shift 2 ;;
    --time) seconds=${2:?}; shift 2 ;;
    --omit) omit=${2:?}; shift 2 ;;
    --mode) mode=${2:?}; shift 2 ;;
    --host) host=${2:?}; shift 2 ;;
    --len) len=${2:?}; shift 2 ;;
    --netns) netns=${2:?}; shift 2 ;;
    --zerocopy) zerocopy=1; shift ;;
    -h|--help) usage ;;
    *) echo "iperf3.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ "$streams" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "iperf3.sh: --streams wants N[,N...]" >&2; exit 2; }
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ] || [ "$seconds" -gt 600 ]; then
  echo "iperf3.sh: --time wants 1..600" >&2; exit 2
fi
[[ "$omit" =~ ^[0-9]+$ ]] || { echo "iperf3.sh: --omit wants whole seconds" >&2; exit 2; }
case "$mode" in auto|parallel|procs) ;; *) echo "iperf3.sh: --mode auto|parallel|procs" >&2; exit 2 ;; esac

command -v iperf3 >/dev/null 2>&1 || { echo '{"ref":"iperf3","error":"iperf3 not installed (scripts/install-deps.sh installs it)"}'; exit 3; }
version=$(iperf3 --version 2>/dev/null | head -n1 | sed -n 's/^iperf \([0-9][0-9.]*\).*/\1/p')
[ -n "$version" ] || version=unknown
vmaj=${version%%.*}; vrest=${version#*.}; vmin=${vrest%%.*}
multithreaded=false
if [[ "$vmaj" =~ ^[0-9]+$ ]] && [[ "$vmin" =~ ^[0-9]+$ ]]; then
  if [ "$vmaj" -gt 3 ] || { [ "$vmaj" -eq 3 ] && [ "$vmin" -ge 16 ]; }; then multithreaded=true; fi
fi
if [ "$mode" = auto ]; then
  if [ "$multithreaded" = true ]; then mode=parallel; else mode=procs; fi
fi
echo "iperf3.sh: iperf3 $version is $([ "$multithreaded" = true ] && echo "multi-threaded (one thread per stream)" || echo "single-threaded (all -P streams in one thread)"); mode $mode" >&2

# --- where the two ends run ---------------------------------------------------------------
tmp=$(mktemp -d /tmp/dmx-iperf3.XXXXXX)
server_pids=()
client_pids=()
own_netns=""
# shellcheck disable=SC2317  # invoked by trap
cleanup() {
  local p
  for p in "${client_pids[@]}" "${server_pids[@]}"; do
    kill -TERM "$p" 2>/dev/null || true
  done
  for p in "${client_pids[@]}" "${server_pids[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  [ -z "$own_netns" ] || "$NETNS_SH" down "$own_netns" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

server_ns=()
client_ns=()
path=loopback
if [ -n "$netns" ]; then
  if [ "$netns" = auto ]; then
    own_netns=iperf$$
    "$NETNS_SH" up "$own_netns" >/dev/null
    netns=$own_netns
  fi
  server_ns=(ip netns exec "$("$NETNS_SH" name "$netns" b)")
  client_ns=(ip netns exec "$("$NETNS_SH" name "$netns" a)")
  [ -n "$host" ] || host=$("$NETNS_SH" addr "$netns" b)
  path="netns-veth"
fi
[ -n "$host" ] || host=127.0.0.1

listening() {  # port -> 0 when a TCP socket listens on it in the server's namespace
  if command -v ss >/dev/null 2>&1; then
    "${server_ns[@]}" ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
  else  # images without iproute2 (the GPU machine): LISTEN sockets are state 0A in /proc/net/tcp*
    local hex
    hex=$(printf '%04X' "$1")
    "${server_ns[@]}" cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" {f=1} END {exit !f}'
  fi
}

pick_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
    listening "$p" || { echo "$p"; return 0; }
  done
  echo "iperf3.sh: no free port found" >&2; return 1
}

start_server() {  # port -> starts one-shot server, waits until it listens
  local port=$1
  "${server_ns[@]}" iperf3 -s -1 -p "$port" -B "$host" >"$tmp/server.$port.log" 2>&1 &
  server_pids+=($!)
  for _ in $(seq 1 50); do
    listening "$port" && return 0
    kill -0 "${server_pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "iperf3.sh: server on $host:$port did not start: $(tail -n2 "$tmp/server.$port.log" | tr '\n' ' ')" >&2
  return 1
}

extra=()
[ -z "$len" ] || extra+=(-l "$len")
[ "$zerocopy" -eq 0 ] || extra+=(-Z)

limit=$((seconds + omit + 20))

# Summarises the client JSON files given as arguments into one JSON line.
summarise() {
  python3 - "$@" <<'PY'
import json, os, sys
n, threads, mode, version, mt, path, secs = (os.environ[k] for k in (
    "R_STREAMS", "R_THREADS", "R_MODE", "R_VERSION", "R_MT", "R_PATH", "R_SECONDS"))
out = {"ref": "iperf3", "streams": int(n), "gb_per_s": None, "threads": int(threads),
       "mode": mode, "iperf3_version": version, "multithreaded": mt == "true",
       "path": path, "seconds": int(secs)}
bps = 0.0; retr = 0; cpu_s = 0.0; cpu_r = 0.0; errors = []
for f in sys.argv[1:]:
    text = ""
    try:
        with open(f) as fh:
            text = fh.read()
        d = json.loads(text)
    except (OSError, ValueError) as e:
        err = ""
        try:
            with open(f[:-5] + ".err") as fh:
                err = fh.read()[-200:]
        except OSError:
            pass
        errors.append(f"unreadable iperf3 output ({e}): {text[-200:]!r} {err!r}")
        continue
    if d.get("error"):
        errors.append(d["error"]); continue
    end = d.get("end", {})
    bps += end.get("sum_received", {}).get("bits_per_second", 0.0)
    retr += end.get("sum_sent", {}).get("retransmits", 0) or 0
    cpu = end.get("cpu_utilization_percent", {})
    cpu_s += cpu.get("host_total", 0.0); cpu_r += cpu.get("remote_total", 0.0)
if errors:
    out["error"] = "; ".join(errors)
else:
    out["gb_per_s"] = round(bps / 8 / 1e9, 4)
    out["retransmits"] = retr
    out["cpu_sender_pct"] = round(cpu_s, 1)
    out["cpu_receiver_pct"] = round(cpu_r, 1)
print(json.dumps(out))
sys.exit(1 if errors else 0)
PY
}

failed=0
IFS=, read -r -a stream_list <<<"$streams"
for n in "${stream_list[@]}"; do
  [ "$n" -ge 1 ] || { echo "iperf3.sh: stream count must be >= 1" >&2; exit 2; }
  server_pids=(); client_pids=(); files=()
  ok=1
  if [ "$mode" = parallel ]; then
    procs=1; per=$n
    if [ "$multithreaded" = true ]; then threads=$n; else threads=1; fi
  else
    procs=$n; per=1; threads=$n
  fi
  ports=()
  for _ in $(seq 1 "$procs"); do
    if ! port=$(pick_port) || ! start_server "$port"; then ok=0; break; fi
    ports+=("$port")
  done
  if [ "$ok" -eq 1 ]; then
    for port in "${ports[@]}"; do
      timeout -k 2 "$limit" "${client_ns[@]}" iperf3 -c "$host" -p "$port" -P "$per" -t "$seconds" \
        -O "$omit" -J "${extra[@]}" >"$tmp/client.$port.json" 2>"$tmp/client.$port.err" &
      client_pids+=($!)
      files+=("$tmp/client.$port.json")
    done
    for p in "${client_pids[@]}"; do wait "$p" || true; done
  fi
  client_pids=()
  # One-shot servers exit after their client; make sure none outlives this stream count.
  for p in "${server_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  server_pids=()
  if [ "$ok" -eq 1 ]; then
    R_STREAMS=$n R_THREADS=$threads R_MODE=$mode R_VERSION=$version R_MT=$multithreaded \
      R_PATH=$path R_SECONDS=$seconds summarise "${files[@]}" || failed=1
  else
    printf '{"ref":"iperf3","streams":%s,"gb_per_s":null,"error":"server did not start"}\n' "$n"
    failed=1
  fi
done
exit "$failed"
