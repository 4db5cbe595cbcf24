#!/usr/bin/env bash
# Builds dmx with a sanitizer and runs the whole CPU test suite under it.
#   scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer (build-asan)
#   scripts/sanitize.sh tsan   ThreadSanitizer (build-tsan)
# Exits non-zero when the build fails, a test fails, or a sanitizer reports anything (every
# report aborts the process that made it, so the test that caused it fails). CUDA and the
# benchmarks are off: there is no GPU to check here, and no test runs a benchmark binary (the
# CLI tests run `dmx`, which is built). The Python module is built in the asan lane only, for one
# test (python.asan_plain_data: its plain-data tests with the ASan runtime preloaded into the
# uninstrumented interpreter); scripts/test.sh runs the whole Python suite. Compiler: gcc, as in the normal build, so the lanes check
# the code the release build ships (CC/CXX choose another for a new build directory).
set -euo pipefail
cd "$(dirname "$0")/.."
lane="${1:-}"
case "$lane" in
  asan) sanitize="address,undefined"; python=ON ;;
  tsan) sanitize="thread"; python=OFF ;;
  *) echo "usage: $0 asan|tsan" >&2; exit 2 ;;
esac
build="build-$lane"
jobs="$(nproc)"
start=$(date +%s)

# The compiler comes from CC/CXX at the first configure (naming it on the command line of a later
# one makes CMake wipe the cache and drop the other -D settings of that run).
# -O1 -g1, as the sanitizers' docs advise: line tables for the reports, and a third less compile
# time than -O2 -g on CI's two cores.
opt="-O1 -g1 -DNDEBUG"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMX_SANITIZE="$sanitize" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt" \
  -DDMX_ENABLE_CUDA=OFF -DDMX_BUILD_BENCH=OFF -DDMX_BUILD_PYTHON=$python
# A lane that silently built without its sanitizer would pass everything.
grep -qx "DMX_SANITIZE:STRING=$sanitize" "$build/CMakeCache.txt" ||
  { echo "sanitize.sh: $build is not configured with DMX_SANITIZE=$sanitize" >&2; exit 2; }
cmake --build "$build" -j "$jobs"
built=$(date +%s)

supp="$PWD/scripts/sanitizers"
# halt_on_error / exitcode: any report ends the process with a failure, never a log line only.
# Children forked by tests inherit these through the environment.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1:exitcode=66"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=67"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
# die_after_fork=0: tests fork peer processes after threads exist (docs/threading.md).
# second_deadlock_stack: both stacks of a lock-order report.
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:die_after_fork=0:second_deadlock_stack=1:suppressions=$supp/tsan.supp"

cd "$build"
# Sanitized code runs 2-15x slower: the per-test timeout grows accordingly.
status=0
ctest --output-on-failure --timeout 900 -j "$jobs" || status=$?
end=$(date +%s)
echo "sanitize.sh $lane: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s, ctest exit $status"
exit "$status"
