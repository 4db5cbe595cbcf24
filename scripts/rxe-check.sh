#!/usr/bin/env bash
# CI lane: the rdma tests on soft-RoCE, in a qemu guest (scripts/rxe-vm.sh, docs/rdma.md "Soft-RoCE
# guest"). Builds, in build/ (configured as scripts/test.sh does, so the README's suite reuses
# it), only the test targets of the table below, and runs each one's cases under its gtest filter
# in one guest. A target that does not exist or lists no case under its filter is skipped with
# the reason; when nothing is left, the lane says so and runs perftest as a smoke test of the
# guest instead. A guest that does not boot, a failing case or a deadline passed fails the lane.
#   RXE_TESTS="target:filter ..."  replaces the table (the filter is everything after the first ':')
#   RXE_TIMEOUT=S                  the guest's deadline, boot included (default 480: the lane
#                                  stays well inside 15 minutes of CI's 90 with its build)
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
# The rdma transport's own tests, and the conformance suite's rdma instances (its multi-GiB case
# would take minutes at rxe's tens of MB/s under an emulated CPU). Also usable_cpus against a real
# cgroup v2 CPU quota, which the guest lets a test set (the CI host binds cpu to cgroup v1).
default_tests="dmx_rdma_tests:* dmx_conformance_tests:*rdma*:-*MultiGiB* dmx_core_tests:UsableCpus.*"
read -r -a table <<<"${RXE_TESTS:-$default_tests}"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >build-rxe-configure.log 2>&1 ||
  { cat build-rxe-configure.log; exit 1; }
rm -f build-rxe-configure.log
rdma=$(sed -n 's/^DMX_ENABLE_RDMA:BOOL=//p' build/CMakeCache.txt)
[[ -n $rdma ]] && rdma="DMX_ENABLE_RDMA=$rdma" || rdma="no rdma transport in this tree"
echo "rxe-check: rdma in this build: $rdma"

targets=$(ninja -C build -t targets all 2>/dev/null | sed -n 's/^\([A-Za-z0-9_]*\): phony$/\1/p')
cmds=() skipped=()
fixtures="$PWD/tests/fixtures"
for entry in "${table[@]}"; do
  target=${entry%%:*} filter=${entry#*:}
  if ! grep -qx "$target" <<<"$targets"; then
    skipped+=("$target: no such target in this tree")
    continue
  fi
  cmake --build build --target "$target"
  bin=$(find build -path build/rxe-vm -prune -o -type f -name "$target" -perm -u+x -print -quit)
  [[ -n $bin ]] || { echo "rxe-check: built $target but found no binary" >&2; exit 1; }
  n=$("$bin" --gtest_list_tests --gtest_filter="$filter" | grep -c '^  ' || true)
  if [[ $n -eq 0 ]]; then
    skipped+=("$target: no case matches $filter")
    continue
  fi
  echo "rxe-check: $target: $n cases under $filter"
  cmds+=(-- DMX_TEST_FIXTURES="$fixtures" "$bin" --gtest_filter="$filter")
done
for s in ${skipped[@]+"${skipped[@]}"}; do echo "rxe-check: skipped $s"; done

opts=(--timeout "${RXE_TIMEOUT:-480}")
if [[ ${#cmds[@]} -eq 0 ]]; then
  echo "rxe-check: no rdma tests to run (see above): the guest runs perftest as a smoke test instead"
  opts+=(--perftest)
else
  # What the tests reach besides their binary: the fixtures and the dmx CLI that some tests run.
  opts+=(--file "$fixtures")
  [[ ! -x build/tools/dmx/dmx ]] || opts+=(--file "$PWD/build/tools/dmx/dmx")
  opts+=(-- ibv_devinfo -d rxe0)
fi
built=$SECONDS
rc=0
bash scripts/rxe-vm.sh "${opts[@]}" "${cmds[@]}" || rc=$?
echo "rxe-check: build $((built - t0)) s, guest $((SECONDS - built)) s, rc $rc"
exit "$rc"
