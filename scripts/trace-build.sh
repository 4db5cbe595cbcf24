# trace-build.sh — sourced by push-steps.sh and stage-times.sh: builds `dmx` with the trace points
# compiled in (-DDMX_TRACE=ON; src/core/trace.h) into PUSH_TRACE_BUILD_DIR (build-push-trace), unless
# PUSH_SKIP_BUILD=1, and sets DMX to it. Needs ROOT and OUT; PUSH_JOBS (nproc), PUSH_CUDA_ARCH (90).
B=${PUSH_TRACE_BUILD_DIR:-$ROOT/build-push-trace}
if [[ ${PUSH_SKIP_BUILD:-0} != 1 ]]; then
  cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMX_ENABLE_CUDA=ON -DDMX_TRACE=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${PUSH_CUDA_ARCH:-90}" -DDMX_BUILD_TESTS=OFF -DDMX_BUILD_BENCH=OFF \
    -DDMX_BUILD_PYTHON=OFF > "$OUT/configure-trace.log" 2>&1 || { tail -30 "$OUT/configure-trace.log"; exit 1; }
  ninja -C "$B" -j "${PUSH_JOBS:-$(nproc)}" dmx_cli > "$OUT/build-trace.log" 2>&1 \
    || { grep -B2 -A20 'FAILED\|error' "$OUT/build-trace.log" | head -60; exit 1; }
fi
DMX=$B/tools/dmx/dmx
