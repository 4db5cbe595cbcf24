#!/usr/bin/env bash
# Runs the whole test suite RUNS times (default 5) while `stress-ng --cpu 4` loads the machine, to
# find tests that judge the machine's speed instead of behaviour (docs/reliability.md, "Tests under
# load"). Not run by CI: it takes RUNS times as long as scripts/test.sh, and more under load.
#
#   bash scripts/stress-suite.sh [RUNS]        STRESS_CPU=N: stress-ng CPU workers (default 4)
#
# stress-ng is not one of dmx's dependencies (scripts/install-deps.sh): this script installs it
# with apt-get when it is missing (as root). Builds like scripts/test.sh. Prints each run's failed
# tests, then all of them with how many runs each failed in; each run's ctest output is kept in
# build/stress-run-N.log. Exits non-zero when any run had a failure.
set -euo pipefail
runs=${1:-5}
cpu=${STRESS_CPU:-4}
cd "$(dirname "$0")/.."
if ! command -v stress-ng >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "stress-suite: stress-ng is missing; install it as root: apt-get install -y stress-ng" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq stress-ng || { apt-get update -qq && apt-get install -y -qq stress-ng; }
fi
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build
cd build

stress-ng --cpu "$cpu" --quiet &
load=$!
trap 'kill "$load" 2>/dev/null || true; wait "$load" 2>/dev/null || true' EXIT

failed_runs=0
all_failed=()
for i in $(seq 1 "$runs"); do
  start=$SECONDS
  status=0
  ctest --output-on-failure --timeout 600 -j "$(nproc)" --output-junit "stress-run-$i.xml" \
    >"stress-run-$i.log" 2>&1 || status=$?
  # Failed or timed-out tests, from ctest's JUnit file.
  mapfile -t failed < <(python3 - "stress-run-$i.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as e:
    print(f"(no result file: {e})")
    sys.exit()
for case in root.iter("testcase"):
    if case.find("failure") is not None or case.get("status") == "fail":
        print(case.get("name"))
PY
  )
  if [ "$status" -ne 0 ] && [ "${#failed[@]}" -eq 0 ]; then failed=("(ctest exited $status; see build/stress-run-$i.log)"); fi
  if [ "${#failed[@]}" -gt 0 ]; then
    failed_runs=$((failed_runs + 1))
    all_failed+=("${failed[@]}")
    echo "run $i/$runs: ${#failed[@]} failed ($((SECONDS - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg)): ${failed[*]}"
  else
    echo "run $i/$runs: all passed ($((SECONDS - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg))"
  fi
done

if [ "$failed_runs" -eq 0 ]; then
  echo "stress-suite: $runs of $runs runs passed under stress-ng --cpu $cpu"
  exit 0
fi
echo "stress-suite: $failed_runs of $runs runs had failures under stress-ng --cpu $cpu; by test (runs failed in):"
printf '%s\n' "${all_failed[@]}" | sort | uniq -c | sort -rn | sed 's/^ */  /'
exit 1
