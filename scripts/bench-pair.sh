# shellcheck shell=bash
# bench-pair.sh — sourced by scripts that run `dmx bench` as two processes on this host.
#
# bench_pair OUT TAGS DMX PORT CONNECT_ARGS...
#   Starts `DMX bench --listen tcp://127.0.0.1:PORT`, runs `DMX bench --connect ... CONNECT_ARGS
#   --json` against it, prefixes each JSON line with TAGS (e.g. '"mode":"on",') and appends it to
#   OUT (and prints it), then stops the listener. Settings for both processes: export DMX_* before
#   calling (in a subshell). Returns the client's exit status.
bench_pair() {
  local out=$1 tags=$2 dmx=$3 port=$4 srv rc
  shift 4
  "$dmx" bench --listen "tcp://127.0.0.1:$port" > /dev/null 2>&1 &
  srv=$!
  sleep 1
  DMX_CONNECT_RETRY_REFUSED=true "$dmx" bench --connect "tcp://127.0.0.1:$port" "$@" --json 2> /dev/null | sed "s/^{/{$tags/" | tee -a "$out"
  rc=${PIPESTATUS[0]}
  kill "$srv" 2> /dev/null
  wait "$srv" 2> /dev/null
  return "$rc"
}
