#!/usr/bin/env bash
# The fuzz lane: builds the libFuzzer targets (tests/fuzz) in build-fuzz with clang, ASan and
# UBSan, and runs each for FUZZ_SECONDS (default 30) on a temporary copy of its committed seed
# corpus (tests/fuzz/corpus/<target>; the repository is never written). Prints per target the
# executions, exec/s and final corpus size. Exits non-zero on any crash, leak, timeout or OOM
# (libFuzzer's own exit status), keeping the reproducer and log in FUZZ_KEEP (default
# build-fuzz/findings).
#
#   scripts/fuzz.sh                    all targets, 30 s each
#   FUZZ_SECONDS=180 scripts/fuzz.sh   a longer run
#   scripts/fuzz.sh frame shm_ring     some targets
#   scripts/fuzz.sh --write-seeds      regenerate tests/fuzz/corpus with dmx_fuzz_make_seeds
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${FUZZ_SECONDS:-30}
keep=${FUZZ_KEEP:-$build/findings}
all=(frame hello_join descriptors shm_ring bench_plan mqueue_header metrics_request)

CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S "$root" -B "$build" -G Ninja -DDMX_FUZZ=ON -DDMX_ENABLE_CUDA=OFF \
  -DDMX_BUILD_BENCH=OFF -DDMX_BUILD_TESTS=OFF -DDMX_BUILD_PYTHON=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

if [ "${1:-}" = "--write-seeds" ]; then
  cmake --build "$build" --target dmx_fuzz_make_seeds
  rm -rf "$root/tests/fuzz/corpus"
  "$build/tests/fuzz/dmx_fuzz_make_seeds" "$root/tests/fuzz/corpus"
  exit 0
fi

targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=("${all[@]}")
cmake --build "$build" --target "${targets[@]/#/fuzz_}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$keep"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
summary=()
for t in "${targets[@]}"; do
  corpus=$work/$t
  mkdir -p "$corpus"
  cp -r "$root/tests/fuzz/corpus/$t/." "$corpus/"
  log=$work/$t.log
  echo "== fuzz_$t: ${seconds}s on $(ls "$corpus" | wc -l) seeds"
  set +e
  "$build/tests/fuzz/fuzz_$t" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$keep/$t-" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  files=$(ls "$corpus" | wc -l)
  line=$(printf '%-12s executions %10s  exec/s %7s  corpus files %5s  exit %d' "$t" "${execs:-?}" "${rate:-?}" "$files" "$rc")
  summary+=("$line")
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    cp "$log" "$keep/$t.log"
    tail -n 60 "$log"
  fi
done
echo "== fuzz summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (reproducers and logs in $keep)" >&2
  exit 1
fi
