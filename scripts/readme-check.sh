#!/usr/bin/env bash
# Runs every command of the README's "Use" block as written, with `dmx` found on PATH as a user's
# shell finds it, and checks each one's result (exit status and the output it promises). Fails on
# the first command that does not do what the README says, and on a command it has no check for
# (a new README line needs its check here).
#
#   bash scripts/readme-check.sh [DIR]
#
# DIR: a folder holding the dmx to use (an install's bin/), put first on PATH. Without it, the
# dmx on PATH (after scripts/quickstart.sh: /usr/local/bin/dmx), else this checkout's build/.
#
# What is not as written, and why: the README's two-host commands run on loopback here — a
# --listen address 0.0.0.0 becomes 127.0.0.1 (nothing leaves this host) and hostB, the placeholder
# for the other host, becomes 127.0.0.1. A --listen line "serves until ^C": it runs in the
# background until the next --listen line or the end, and gets SIGINT then (it must exit 0). The
# commands run in a temporary folder where bench/ is this checkout's (python3 bench/plot.py), so
# that their files (run.jsonl, PNGs) do not land in the checkout. Commands meant for GPU hosts
# (--cuda-alloc cumem) must, on a host without a usable GPU, refuse with exit status 2 and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if [[ -n ${1:-} ]]; then
  PATH=$(cd "$1" && pwd):$PATH
elif ! command -v dmx >/dev/null 2>&1 && [[ -x build/tools/dmx/dmx ]]; then
  PATH=$root/build/tools/dmx:$PATH
fi
export PATH
command -v dmx >/dev/null || { echo "readme-check: no dmx on PATH (run scripts/quickstart.sh)" >&2; exit 1; }
echo "readme-check: dmx is $(command -v dmx)"

# The Use block: the first ```sh block after "## Use".
mapfile -t lines < <(awk '/^## Use$/ {use = 1; next}
  use && /^```sh$/ {inblock = 1; next}
  inblock && /^```$/ {exit}
  inblock && NF {print}' README.md)
[[ ${#lines[@]} -gt 0 ]] || { echo "readme-check: no \`\`\`sh block under '## Use' in README.md" >&2; exit 1; }

tmp=$(mktemp -d)
server=""
stop_server() {
  [[ -n $server ]] || return 0
  kill -INT "$server" 2>/dev/null || true
  local rc=0
  wait "$server" || rc=$?
  server=""
  if [[ $rc -ne 0 ]]; then
    echo "readme-check: the --listen server exited with $rc after SIGINT:" >&2
    cat "$tmp/server.log" >&2
    exit 1
  fi
}
cleanup() {
  [[ -n $server ]] && kill -KILL "$server" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
ln -s "$root/bench" "$tmp/bench"
cd "$tmp"
# The README's python3 is the one scripts/install-deps.sh gave matplotlib (Debian's). Where another
# python3 comes first on PATH without it (a pyenv, as on CI's machine), the check uses Debian's.
if ! python3 -c 'import matplotlib' 2>/dev/null && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  mkdir -p "$tmp/python"
  ln -s /usr/bin/python3 "$tmp/python/python3"
  PATH=$tmp/python:$PATH
  echo "readme-check: python3 on PATH has no matplotlib; using /usr/bin/python3 (scripts/install-deps.sh's)"
fi

gpu=0  # a GPU this dmx can use: its default memory is then cuda:0
dmx probe --json --no-devmem 2>/dev/null | python3 -c '
import json, sys
caps = json.load(sys.stdin)
sys.exit(0 if any(c["name"].startswith("cuda") and c["available"] for c in caps) else 1)' && gpu=1
echo "readme-check: GPU usable: $([[ $gpu == 1 ]] && echo yes || echo no)"

fail() {
  echo "readme-check: FAILED: $cmd" >&2
  echo "readme-check: $*" >&2
  echo "--- its output:" >&2
  cat "$tmp/out.log" >&2
  exit 1
}
expect() {  # $1: regular expression the output must contain
  grep -qE -- "$1" "$tmp/out.log" || fail "expected output matching '$1'"
}
rows() {  # $1: file of JSON lines; prints how many rows have a size and no error
  python3 -c '
import json, sys
n = 0
for line in open(sys.argv[1]):
    if line.startswith("{"):
        j = json.loads(line)
        if "error" in j or not j.get("size_bytes"):
            sys.exit("row with an error or no size: " + line)
        n += 1
print(n)' "$1"
}

for line in "${lines[@]}"; do
  cmd=${line%%#*}                   # the comment goes; the command stays as written
  cmd=${cmd%"${cmd##*[![:space:]]}"}
  [[ -n $cmd ]] || continue
  run=${cmd//tcp:\/\/0.0.0.0:/tcp://127.0.0.1:}
  run=${run//hostB/127.0.0.1}
  echo "=== $cmd"
  if [[ $cmd == *"--listen "* ]]; then
    stop_server
    bash -c "exec $run" >"$tmp/server.log" 2>&1 &
    server=$!
    for _ in $(seq 300); do
      grep -q "serving on" "$tmp/server.log" && break
      kill -0 "$server" 2>/dev/null || break
      sleep 0.1
    done
    cp "$tmp/server.log" "$tmp/out.log"
    grep -q "serving on" "$tmp/server.log" || fail "the server did not start serving in 30 s"
    if [[ $cmd == *"--metrics-port "* ]]; then
      port=$(sed -n 's|.*metrics on http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$tmp/server.log")
      [[ -n $port ]] || fail "no 'metrics on http://127.0.0.1:PORT/metrics' line"
      python3 -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
        "http://127.0.0.1:$port/metrics" >"$tmp/out.log" 2>&1 || fail "GET /metrics failed"
      expect '^# TYPE dmx_'
    fi
    continue
  fi
  rc=0
  timeout 900 bash -c "$run" >"$tmp/out.log" 2>&1 || rc=$?
  case $cmd in
    "dmx bench --loopback --sizes "*"--verify"*)
      [[ $rc -eq 0 ]] || fail "exit status $rc"
      expect '^# streams: '
      [[ $(grep -cE ' yes$' "$tmp/out.log") -eq $(($(tr -cd , <<<"${cmd#*--sizes }" | wc -c) + 1)) ]] ||
        fail "not every size verified"
      ;;
    "dmx bench --loopback -b "*"--json > "*)
      [[ $rc -eq 0 ]] || fail "exit status $rc"
      out=${cmd##*> }
      n=$(rows "$out") || fail "bad rows in $out"
      want=$(python3 -c '
import sys
a = sys.argv[1].split()
size = lambda t: int(t.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(t[-1], 0)
lo, hi, f = size(a[a.index("-b") + 1]), size(a[a.index("-e") + 1]), int(a[a.index("-f") + 1])
n = 0
while lo <= hi:
    n, lo = n + 1, lo * f
print(n)' "$cmd")
      [[ $n -eq $want ]] || fail "$n rows in $out, expected $want (one per size of the range)"
      ;;
    "python3 bench/plot.py -o "*)
      [[ $rc -eq 0 ]] || fail "exit status $rc"
      prefix=$(sed 's/.* -o \([^ ]*\).*/\1/' <<<"$cmd")
      [[ -s ${prefix}_gbps.png && -s ${prefix}_p50.png ]] || fail "no ${prefix}_gbps.png and ${prefix}_p50.png"
      ;;
    "dmx bench --connect "*)
      [[ $rc -eq 0 ]] || fail "exit status $rc"
      [[ -n $server ]] || fail "no --listen line before it"
      [[ $cmd != *--json* ]] || [[ $(rows "$tmp/out.log") -gt 0 ]] || fail "no JSON rows"
      ;;
    curl\ *)  # the README's scrape of a --metrics-port server
      [[ $rc -eq 0 ]] || fail "exit status $rc"
      expect '^# TYPE dmx_'
      ;;
    "dmx bench --loopback --cuda-alloc cumem"*)
      if [[ $gpu == 1 ]]; then
        [[ $rc -eq 0 ]] || fail "exit status $rc"
        expect 'cuMem blocks of'
      else
        [[ $rc -eq 2 ]] || fail "exit status $rc on a host without a GPU, expected 2 (refused)"
        expect 'cumem needs GPU memory'
      fi
      ;;
    "dmx probe --config")
      [[ $rc -eq 0 ]] || fail "exit status $rc"
      expect '^log_level +'
      expect '^transport +'
      ;;
    "dmx probe")
      [[ $rc -eq 0 ]] || fail "exit status $rc"
      expect ' (available|unavailable): '
      ;;
    "dmx topo")
      [[ $rc -eq 0 ]] || fail "exit status $rc"
      ;;
    "dmx --version")
      [[ $rc -eq 0 ]] || fail "exit status $rc"
      expect '^dmx [0-9]'
      expect '^git revision: '
      expect '^build: '
      ;;
    *) fail "no check for this README command: add one to scripts/readme-check.sh" ;;
  esac
done
stop_server
echo "readme-check: ok (${#lines[@]} commands)"
