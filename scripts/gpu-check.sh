#!/usr/bin/env bash
# gpu-check.sh — build dmx with CUDA, run the test suite and the benchmark sections on a GPU machine.
#
#   bash scripts/gpu-check.sh            (from the repository root)
#
# Results go to $OUT (default ./gpu-check-out), flat, at most 8 files (the device tool brings back
# no more): gpu-check.log (everything printed), build.log, ctest.log, ctest-junit.xml and one
# NAME.log per section. If more files exist at the end, all but gpu-check.log and ctest-junit.xml
# are packed into logs.tar.gz. The last thing printed is a short summary table.
#
# Environment:
#   GPU_CHECK_ONLY=a,b      run only these sections ("ctest" is a section too); default: all
#   GPU_CHECK_SKIP=a,b      run all sections but these
#   GPU_CHECK_SKIP_BUILD=1  reuse an existing build in $GPU_CHECK_BUILD_DIR, no configure/build
#   GPU_CHECK_BUILD_DIR=d   build directory (default build-gpu; wiped first unless SKIP_BUILD)
#   GPU_CHECK_TARGETS="t1 t2"  build only these targets (default: all, with -k 0)
#   GPU_CHECK_CTEST_ARGS="-R Cuda"  extra ctest arguments (a filter, say)
#   GPU_CHECK_JOBS=16       build parallelism;  GPU_CHECK_CTEST_JOBS=8  test parallelism
#   GPU_CHECK_SECTION_TIMEOUT=600  seconds before a section is killed
#   GPU_CHECK_SIZES=8,64K,1M,16M,256M  sizes of the bench-gpu and same-host sections (e.g. up to 1G)
#   GPU_CHECK_CUDA_ARCH=90  CMAKE_CUDA_ARCHITECTURES (Hopper: H100, H200)
#
# Examples:
#   GPU_CHECK_ONLY=cuda-memory GPU_CHECK_TARGETS=dmx_memory_tests bash scripts/gpu-check.sh
#   GPU_CHECK_ONLY=ctest GPU_CHECK_CTEST_ARGS='-R Cuda' bash scripts/gpu-check.sh
#   GPU_CHECK_SKIP_BUILD=1 GPU_CHECK_ONLY=devmem bash scripts/gpu-check.sh   (same machine, again)
#
# Never stops at the first failure: every stage is timed and reported, failures included.
set -u
set -o pipefail

ROOT=$(pwd)
if [[ ! -f "$ROOT/CMakeLists.txt" || ! -d "$ROOT/src/memory" ]]; then
  echo "gpu-check: run me from the dmx repository root (bash scripts/gpu-check.sh)" >&2
  exit 2
fi
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
B=${GPU_CHECK_BUILD_DIR:-$ROOT/build-gpu}
[[ "$B" = /* ]] || B="$ROOT/$B"
JOBS=${GPU_CHECK_JOBS:-16}
CTEST_JOBS=${GPU_CHECK_CTEST_JOBS:-8}
SECTION_TIMEOUT=${GPU_CHECK_SECTION_TIMEOUT:-600}
CUDA_ARCH=${GPU_CHECK_CUDA_ARCH:-90}
ONLY=${GPU_CHECK_ONLY:-}
SKIP=${GPU_CHECK_SKIP:-}
SIZES=${GPU_CHECK_SIZES:-8,64K,1M,16M,256M}
DMX="$B/tools/dmx/dmx"   # the CLI, for sections
export ROOT OUT B DMX JOBS SIZES

# Everything printed also lands in $OUT/gpu-check.log.
exec > >(tee -a "$OUT/gpu-check.log") 2>&1

# ---- bookkeeping -----------------------------------------------------------------------------
STAGE_NAMES=()
STAGE_RESULTS=()
STAGE_SECS=()
STAGE_NOTES=()
T_START=$(date +%s.%N)

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
banner() { printf '\n==== %s ==== %s\n' "$1" "$(date -u +%H:%M:%S)"; }
record() {  # record NAME RESULT SECONDS NOTE
  STAGE_NAMES+=("$1"); STAGE_RESULTS+=("$2"); STAGE_SECS+=("$3"); STAGE_NOTES+=("$4")
}
in_list() {  # in_list NAME "a,b,c"
  local IFS=,
  local x
  for x in $2; do [[ "$x" == "$1" ]] && return 0; done
  return 1
}
section_enabled() {
  local name=$1
  if [[ -n "$ONLY" ]] && ! in_list "$name" "$ONLY"; then return 1; fi
  if [[ -n "$SKIP" ]] && in_list "$name" "$SKIP"; then return 1; fi
  return 0
}

# The note for a finished section: gtest counts when its log has them, else its last line.
log_note() {
  local log=$1
  if grep -q '^\[==========\] [0-9]* tests\? from .* ran' "$log"; then
    local ran passed skipped failed
    ran=$(grep -o '^\[==========\] [0-9]* tests\? from' "$log" | tail -n 1 | grep -o '[0-9]*')
    passed=$(grep -o '^\[  PASSED  \] [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
    skipped=$(grep -o '^\[  SKIPPED \] [0-9]* tests\?,' "$log" | tail -n 1 | grep -o '[0-9]*')
    failed=$(grep -o '^\[  FAILED  \] [0-9]* tests\?,' "$log" | tail -n 1 | grep -o '[0-9]*')
    echo "gtest: ${ran} ran, ${passed:-0} passed, ${skipped:-0} skipped, ${failed:-0} failed"
  else
    tail -n 1 "$log" | cut -c1-80
  fi
}

# run_section NAME CMD [ARGS...]
#   Runs CMD (a program or a shell function) with stdout+stderr to $OUT/NAME.log, under a timeout,
#   timed; a failure is recorded and the script goes on. Skipped when GPU_CHECK_ONLY/SKIP say so.
#   CMD sees $ROOT, $B (build dir), $DMX (the dmx CLI), $OUT, $JOBS and $SIZES (exported). A shell
#   function runs in a child bash: export -f any helper it calls. Keep NAME to [A-Za-z0-9._-].
run_section() {
  local name=$1; shift
  if ! section_enabled "$name"; then
    record "$name" "skipped" "0.0" "not selected (GPU_CHECK_ONLY/SKIP)"
    return 0
  fi
  banner "section $name: $*"
  local log="$OUT/$name.log" t0 t1 rc
  t0=$(now)
  if declare -F "$1" > /dev/null; then
    # A shell function runs in a child bash under the same timeout as a program; it sees exported
    # variables and functions only (this script exports its own; export -f your helpers).
    # shellcheck disable=SC2163  # exports the function named by $1
    export -f "$1"
    timeout --kill-after=10 "$SECTION_TIMEOUT" bash -c '"$@"' run_section "$@" > "$log" 2>&1
  else
    timeout --kill-after=10 "$SECTION_TIMEOUT" "$@" > "$log" 2>&1
  fi
  rc=$?
  t1=$(now)
  local secs; secs=$(elapsed "$t0" "$t1")
  if [[ $rc -eq 0 ]]; then
    echo "section $name: ok in ${secs}s (log: $name.log)"
    record "$name" "ok" "$secs" "$(log_note "$log")"
  else
    local why="exit $rc"
    [[ $rc -eq 124 || $rc -eq 143 ]] && why="timed out after ${SECTION_TIMEOUT}s (exit $rc)"
    echo "section $name: FAILED ($why) in ${secs}s; last lines of $name.log:"
    tail -n 25 "$log" | sed 's/^/  | /'
    record "$name" "FAILED" "$secs" "$why; $(log_note "$log")"
  fi
  return 0
}

# ---- stage: machine ----------------------------------------------------------------------------
banner "machine"
t0=$(now)
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  kernel: $(uname -r)  cpus: $(nproc)"
echo "tree: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git metadata') $(git -C "$ROOT" status --short 2>/dev/null | wc -l | awk '{ if ($1 > 0) print "(+" $1 " uncommitted)" }')"
machine_note="no GPU seen"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id,compute_cap --format=csv 2>&1
  nvidia-smi -L 2>&1 | head -n 8
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  machine_note="${gpu_count}x ${gpu_name}, driver ${driver}"
  nvidia-smi topo -m 2>&1 | head -n 12
else
  echo "nvidia-smi: not found"
fi
# Open or proprietary kernel module: dmabuf export needs the open one.
if [[ -r /proc/driver/nvidia/version ]]; then head -n 1 /proc/driver/nvidia/version; fi
command -v nvcc > /dev/null && nvcc --version | tail -n 2 | head -n 1
command -v cmake > /dev/null && cmake --version | head -n 1
command -v "${CXX:-g++}" > /dev/null && "${CXX:-g++}" --version | head -n 1
record "machine" "ok" "$(elapsed "$t0" "$(now)")" "$machine_note"

# ---- stage: configure + build ----------------------------------------------------------------
build_ok=0
if [[ "${GPU_CHECK_SKIP_BUILD:-0}" == 1 ]]; then
  if [[ -f "$B/CMakeCache.txt" ]]; then
    record "build" "skipped" "0.0" "GPU_CHECK_SKIP_BUILD=1, using $B"
    build_ok=1
  else
    record "build" "FAILED" "0.0" "GPU_CHECK_SKIP_BUILD=1 but no build in $B"
  fi
else
  banner "configure ($B, CUDA arch $CUDA_ARCH)"
  t0=$(now)
  rm -rf "$B"
  gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  if cmake -S "$ROOT" -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMX_ENABLE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" > "$OUT/build.log" 2>&1; then
    record "configure" "ok" "$(elapsed "$t0" "$(now)")" "$(grep -m1 'dmx: CUDA' "$OUT/build.log" | sed 's/^-- //')"
    banner "build (-j$JOBS, targets: ${GPU_CHECK_TARGETS:-all})"
    t0=$(now)
    keep_going=(-k 0)
    [[ ${#gen[@]} -eq 0 ]] && keep_going=(-k)
    targets=()
    for t in ${GPU_CHECK_TARGETS:-}; do targets+=(--target "$t"); done
    echo "---- build ----" >> "$OUT/build.log"
    cmake --build "$B" -j "$JOBS" "${targets[@]}" -- "${keep_going[@]}" >> "$OUT/build.log" 2>&1
    rc=$?
    secs=$(elapsed "$t0" "$(now)")
    if [[ $rc -eq 0 ]]; then
      record "build" "ok" "$secs" "${GPU_CHECK_TARGETS:-all targets}"
      build_ok=1
    else
      # Which outputs failed (ninja: "FAILED: <output>"; make: "*** [<target>] Error").
      failed=$(grep -E '^FAILED: |\*\*\* \[' "$OUT/build.log" | sed -E 's/^FAILED: //; s/.*\*\*\* \[([^]]*)\].*/\1/' |
               awk '{print $1}' | sed -E 's#^.*/CMakeFiles/([^/]*)\.dir/.*#\1#' | sort -u | tr '\n' ' ')
      echo "build FAILED (exit $rc); failed targets/objects: $failed"
      grep -E -m 20 'error:|FAILED:' "$OUT/build.log" | sed 's/^/  | /'
      record "build" "FAILED" "$secs" "failed: ${failed:-see build.log}"
      build_ok=1   # -k 0: whatever did build can still be tested
    fi
  else
    echo "configure FAILED; last lines of build.log:"
    tail -n 30 "$OUT/build.log" | sed 's/^/  | /'
    record "configure" "FAILED" "$(elapsed "$t0" "$(now)")" "see build.log"
  fi
fi

# ---- section: ctest --------------------------------------------------------------------------
ctest_section() {
  # shellcheck disable=SC2086  # GPU_CHECK_CTEST_ARGS is a list of arguments on purpose
  ctest --test-dir "$B" --output-on-failure --no-tests=error -j "$CTEST_JOBS" --timeout 300 \
    --output-junit "$OUT/ctest-junit.xml" ${GPU_CHECK_CTEST_ARGS:-}
  local rc=$?
  # One line for the summary: "N passed, N failed, N skipped of N"
  local total failed skipped
  # "N tests failed out of M", or when all pass "100% tests passed out of M" (no failed count).
  total=$(grep -Eo 'tests (failed|passed) out of [0-9]+' "$OUT/ctest.log" | grep -Eo '[0-9]+$' | tail -n 1)
  failed=$(grep -Eo '[0-9]+ tests failed out of' "$OUT/ctest.log" | grep -Eo '^[0-9]+' | tail -n 1)
  [[ -z "$failed" ]] && grep -q '100% tests passed' "$OUT/ctest.log" && failed=0
  skipped=$(grep -c '(Skipped)' "$OUT/ctest.log")
  echo "ctest: ${total:-?} tests, ${failed:-?} failed, ${skipped} skipped (skips listed above with reasons in the test output)"
  return $rc
}

# When ctest cannot even read its test list (a CMake error in a generated *_tests.cmake, as
# seen with CMake 4.4 and gtest_discover_tests), show the offending lines and run the gtest
# binaries directly instead, so that the tests still run and still report skips.
ctest_fallback() {
  local f line
  grep -Eo '/[^ :]*_tests\.cmake:[0-9]+' "$OUT/ctest.log" | sort -u | while IFS= read -r f; do
    line=${f##*:}; f=${f%:*}
    echo "---- $f, lines $((line > 2 ? line - 2 : 1))-$((line + 1)) (cut at 400 chars):"
    sed -n "$((line > 2 ? line - 2 : 1)),$((line + 1))p" "$f" | cut -c1-400
  done
  echo "---- running the gtest binaries directly"
  mkdir -p "$OUT/gtest-xml"
  local bin rc=0 brc bad=""
  while IFS= read -r bin; do
    echo "==== $bin"
    timeout --kill-after=10 300 "$bin" --gtest_color=no --gtest_output="xml:$OUT/gtest-xml/$(basename "$bin").xml"
    brc=$?
    if [[ $brc -ne 0 ]]; then
      rc=1
      # exit 1 is gtest's "some test failed"; anything else (139 = SIGSEGV, 124 = timeout) means
      # the binary died and its own counts are incomplete.
      [[ $brc -ne 1 ]] && bad+=" $(basename "$bin")(exit $brc)"
    fi
  done < <(find "$B/tests" -maxdepth 3 -type f -name '*_tests' -perm -u+x | sort)
  # One junit file instead of one per binary (the device tool brings back at most 8 files).
  if command -v python3 > /dev/null; then
    python3 - "$OUT/gtest-xml" "$OUT/ctest-junit.xml" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
root = ET.Element("testsuites", name="gtest-fallback")
for f in sorted(glob.glob(sys.argv[1] + "/*.xml")):
    try:
        for suite in ET.parse(f).getroot():
            root.append(suite)
    except ET.ParseError as e:
        print(f"{f}: {e}")
ET.ElementTree(root).write(sys.argv[2], encoding="utf-8", xml_declaration=True)
PY
    rm -rf "$OUT/gtest-xml"
  fi
  local passed failed skipped
  passed=$(grep -ho '^\[  PASSED  \] [0-9]*' "$OUT/ctest.log" | awk '{ s += $4 } END { print s + 0 }')
  skipped=$(grep -ho '^\[  SKIPPED \] [0-9]* tests\?,' "$OUT/ctest.log" | awk '{ s += $4 } END { print s + 0 }')
  failed=$(grep -ho '^\[  FAILED  \] [0-9]* tests\?,' "$OUT/ctest.log" | awk '{ s += $4 } END { print s + 0 }')
  echo "ctest: list unreadable; gtest binaries run directly: ${passed} passed, ${failed} failed, ${skipped} skipped${bad:+; died:$bad}"
  return $rc
}

# ---- section: cuda-memory --------------------------------------------------------------------
# The CUDA memory tests with their own output (facts: device count, dmabuf mapping, copy times),
# which ctest hides for passing tests.
cuda_memory_section() {
  local bin="$B/tests/memory/dmx_memory_tests"
  [[ -x "$bin" ]] || { echo "no $bin (build failed?)"; return 1; }
  "$bin" --gtest_filter='Cuda*:HostMemory*' --gtest_color=no
}

if [[ $build_ok -eq 1 ]]; then
  if section_enabled ctest; then
    banner "section ctest"
    t0=$(now)
    ctest_section > "$OUT/ctest.log" 2>&1
    rc=$?
    if grep -q 'CMake Error at .*_tests\.cmake' "$OUT/ctest.log"; then
      echo "ctest could not read its test list (CMake error in a generated file); see ctest.log"
      ctest_fallback >> "$OUT/ctest.log" 2>&1
      rc=1   # the broken test list stays a failure to fix, even when every test passed
      grep -A3 -- '^---- .*_tests\.cmake' "$OUT/ctest.log" | head -n 12 | cut -c1-300 | sed 's/^/  | /'
    fi
    summary_line=$(tail -n 1 "$OUT/ctest.log")
    echo "$summary_line"
    if [[ $rc -eq 0 ]]; then
      record "ctest" "ok" "$(elapsed "$t0" "$(now)")" "${summary_line#ctest: }"
    else
      grep -E '\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run' "$OUT/ctest.log" | head -n 30 | sed 's/^/  | /'
      record "ctest" "FAILED" "$(elapsed "$t0" "$(now)")" "${summary_line#ctest: }"
    fi
  else
    record "ctest" "skipped" "0.0" "not selected (GPU_CHECK_ONLY/SKIP)"
  fi
  run_section cuda-memory cuda_memory_section

  # ============================================================================================
  # SECTIONS — other engineers append theirs here, one `run_section NAME CMD...` each.
  #   NAME becomes $OUT/NAME.log; keep the total under 8 files (see the header).
  #   CMD may be a shell function defined just above its run_section line.
  #   Available: $ROOT $B $DMX $OUT $JOBS.  A failing section never stops the script.
  # ============================================================================================

  # ---- lead: dmx bench (staged TCP, copy engine) ----
  # Reference tools the image lacks (iperf3) travel as Debian packages in .carry/debs (ignored by
  # git; `apt-get download iperf3 libiperf0 libsctp1` there) and are unpacked under /tmp.
  if compgen -G "$ROOT/.carry/debs/*.deb" > /dev/null; then
    for f in "$ROOT"/.carry/debs/*.deb; do dpkg -x "$f" /tmp/carry-root; done
    export PATH=/tmp/carry-root/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/carry-root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  fi
  export DMX_BIN=$DMX
  bench_host_section() {  # dmx host->host loopback vs iperf3 at the same stream counts
    python3 "$ROOT/bench/compare.py" host-loopback --streams "${GPU_CHECK_STREAMS:-1,2,4,8}" --sizes 1M,256M \
      --verify --json "$OUT/bench-host.json"
  }
  run_section bench-host bench_host_section
  bench_gpu_section() {  # GPU memory over the staged path, two processes; NCCL socket alongside
    local n
    n=$(nvidia-smi -L | wc -l)
    if [[ $n -ge 2 ]]; then
      python3 "$ROOT/bench/compare.py" gpu-staged --streams "${GPU_CHECK_STREAMS:-4,8}" --sizes "$SIZES" \
        --verify --json "$OUT/bench-gpu.json"
    else  # one GPU: both processes on it (no NCCL reference: it needs two GPUs)
      "$DMX" bench --listen tcp://127.0.0.1:7811 & local srv=$! rc=0 st
      sleep 1
      for st in ${GPU_CHECK_STREAMS:-4 8}; do
        DMX_CONNECT_RETRY_REFUSED=true "$DMX" bench --connect tcp://127.0.0.1:7811 --mem cuda:0 --peer-mem cuda:0 --streams "${st//,/ }" \
          --sizes "$SIZES" --verify --json | tee -a "$OUT/bench-gpu.jsonl" || rc=1
      done
      kill $srv; wait $srv 2>/dev/null
      return $rc
    fi
  }
  run_section bench-gpu bench_gpu_section
  bench_big_section() {  # sizes past 4 GiB, verified: 16 GiB host->host, 5 GiB GPU0->GPU1 (or GPU0->GPU0)
    local peer=cuda:0
    [[ $(nvidia-smi -L | wc -l) -ge 2 ]] && peer=cuda:1
    "$DMX" bench --loopback --mem host --peer-mem host --sizes 16G --iters 1 --verify &&
      "$DMX" bench --loopback --mem cuda:0 --peer-mem $peer --sizes 5G --iters 2 --verify
  }
  run_section bench-big bench_big_section
  probe_topo_section() {  # what dmx sees on the real GPU machine; a capture of its sysfs for fixtures
    "$DMX" probe && "$DMX" topo && "$DMX" topo --capture /tmp/topo-capture >/dev/null &&
      tar -C /tmp -czf "$OUT/topo-capture.tgz" topo-capture && bash "$ROOT/scripts/perf-sweep.sh" "$DMX" latency
  }
  run_section probe-topo probe_topo_section
  same_host_section() {  # the engine's same-host paths (two processes) vs memcpy / cudaMemcpyPeer / NCCL p2p
    local rc=0
    if [[ $(nvidia-smi -L | wc -l) -ge 2 ]]; then
      python3 "$ROOT/bench/compare.py" same-host --streams 1 --sizes "$SIZES" --verify \
        --same-host-target 0.95 --nccl-p2p-target 2.0 --json "$OUT/same-host.json" || rc=1
    else  # one GPU: both processes on it (cuda_ipc within one GPU); no peer-copy reference
      "$DMX" bench --listen tcp://127.0.0.1:7812 & local srv=$!
      sleep 1
      DMX_CONNECT_RETRY_REFUSED=true "$DMX" bench --connect tcp://127.0.0.1:7812 --mem cuda:0 --peer-mem cuda:0 --sizes "$SIZES" \
        --verify --json | tee -a "$OUT/same-host.jsonl" || rc=1
      kill $srv; wait $srv 2>/dev/null
    fi
    python3 "$ROOT/bench/compare.py" shm-host --streams 1 --sizes 8,64K,1M,256M --verify --shm-target 0.70 \
      --json "$OUT/shm-host.json" || rc=1
    "$B/bench/shm_bench" && "$B/bench/cuda_ipc_bench" || rc=1  # the layers alone
    return $rc
  }
  run_section same-host same_host_section
  small_lane_section() {  # 8 B .. 16 KiB half round trips: cuda_ipc's small-chunk lane on, off, and on with copy_by=destination
    local peer=cuda:0 i mode rc=0
    [[ $(nvidia-smi -L | wc -l) -ge 2 ]] && peer=cuda:1
    # shellcheck source=scripts/bench-pair.sh
    source "$ROOT/scripts/bench-pair.sh"
    for i in 1 2 3; do
      for mode in on off on-dst; do
        echo "lane $mode, round $i"
        (
          export DMX_CUDA_IPC_INLINE_RX=16K DMX_CUDA_IPC_COPY_BY=source
          [[ $mode == off ]] && export DMX_CUDA_IPC_INLINE_RX=0
          [[ $mode == on-dst ]] && export DMX_CUDA_IPC_COPY_BY=destination
          bench_pair "$OUT/small-lane.jsonl" "\"mode\":\"$mode\"," "$DMX" 7813 --mem cuda:0 --peer-mem "$peer" \
            --streams 1 --sizes 8,4K,16K --verify
        ) || rc=1
      done
    done
    python3 "$ROOT/bench/latency_table.py" "$OUT/small-lane.jsonl" size_bytes mode
    return $rc
  }
  run_section small-lane small_lane_section
  cumem_section() {  # GPU0->GPU1 between two processes from cudaMalloc vs cuMem memory (PyTorch's expandable segments), cudaMemcpyPeerAsync alongside
    local peer=cuda:0 i alloc rc=0
    [[ $(nvidia-smi -L | wc -l) -ge 2 ]] && peer=cuda:1
    # shellcheck source=scripts/bench-pair.sh
    source "$ROOT/scripts/bench-pair.sh"
    for i in 1 2; do
      for alloc in cudamalloc cumem:20M cumem:2M; do
        echo "alloc $alloc, round $i"
        bench_pair "$OUT/cumem.jsonl" "\"alloc\":\"$alloc\"," "$DMX" 7815 --mem cuda:0 --peer-mem "$peer" \
          --sizes 8,1M,64M,256M --verify --cuda-alloc "$alloc" || rc=1
      done
    done
    python3 "$ROOT/bench/ref/memcpy_peer.py" --sizes 1M,64M,256M --no-host || rc=1
    python3 - "$OUT/cumem.jsonl" <<'PY'
import collections, json, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    j = json.loads(line)
    rows[(j["size_bytes"], j["alloc"])].append(j)
print(f"{'size':>10} {'alloc':>11}  GB/s per round        p50 us per round     verified")
for (size, alloc), js in sorted(rows.items()):
    rates = " ".join("%8.2f" % j["gb_per_s"] for j in js)
    lats = " ".join("%7.2f" % j["p50_us"] for j in js)
    print(f"{size:>10} {alloc:>11}  {rates:20}  {lats:20} {all(j['verified'] for j in js)}")
PY
    return $rc
  }
  run_section cumem cumem_section
  shm_slots_section() {  # host->host 256 MiB vs memcpy in the same run: the shm link alone at five ring shapes
    local cfg
    for cfg in 65536:32 262144:16 524288:16 1048576:8 4194304:8; do
      "$B/bench/shm_bench" --min-size 268435456 --max-size 268435456 --slot-size "${cfg%%:*}" --slots "${cfg##*:}" \
        | grep host_to_host || return 1
    done
  }
  run_section shm-slots shm_slots_section
  small_copy_section() {  # what an 8-byte device<->host copy costs by method (small-message latency)
    "$B/bench/small_copy_probe" --iters 2000
    "$B/bench/copy_issue_probe" --iters 2000
  }
  run_section small-copy small_copy_section

  # ---- devmem (owner: devmem) ----
  # devmem tests with their output (bind errors and the kernel's extack text on this machine's
  # NICs, dmabuf export facts, gather correctness) and the gather benchmark as JSON.
  devmem_section() {
    local rc=0 bin
    for bin in dmx_devmem_gpu_tests dmx_devmem_kernel_tests; do
      if [[ -x "$B/tests/devmem/$bin" ]]; then
        "$B/tests/devmem/$bin" --gtest_color=no || rc=1
      else
        echo "no $B/tests/devmem/$bin (build failed?)"; rc=1
      fi
    done
    return $rc
  }
  run_section devmem devmem_section
  devmem_gather_section() {
    "$B/bench/dmx_bench_devmem_gather" --size-mib 256 --iters 20 --json "$OUT/devmem_gather.json"
  }
  run_section devmem-gather devmem_gather_section

  # ==== end of SECTIONS ====
else
  record "sections" "skipped" "0.0" "nothing was built"
fi

# ---- what comes back ---------------------------------------------------------------------------
nfiles=$(find "$OUT" -type f | wc -l)
if [[ $nfiles -gt 8 ]]; then
  # The device tool returns at most 8 files: pack all but the main log and the junit report.
  ( cd "$OUT" && find . -maxdepth 1 -type f ! -name gpu-check.log ! -name ctest-junit.xml ! -name logs.tar.gz \
      -printf '%P\n' | tar -czf logs.tar.gz -T - --remove-files )
  echo "note: $nfiles files in \$OUT; packed into logs.tar.gz to stay within 8"
fi

# ---- summary (last) ----------------------------------------------------------------------------
total_secs=$(elapsed "$T_START" "$(now)")
nfail=0
banner "summary (${total_secs}s total)"
printf '%-16s %-8s %8s  %s\n' "stage" "result" "seconds" "note"
for i in "${!STAGE_NAMES[@]}"; do
  [[ "${STAGE_RESULTS[$i]}" == FAILED ]] && nfail=$((nfail + 1))
  printf '%-16s %-8s %8s  %s\n' "${STAGE_NAMES[$i]}" "${STAGE_RESULTS[$i]}" "${STAGE_SECS[$i]}" "${STAGE_NOTES[$i]:0:120}"
done
echo "gpu-check: $nfail stage(s) failed; logs in $OUT"
[[ $nfail -eq 0 ]]
