#!/usr/bin/env python3
"""Single-thread host memcpy reference for same-host (shm) benchmarks.

  bench/ref/memcpy_host.py [--sizes 1M,256M] [--iters 20] [--window N]

Copies between two pre-faulted anonymous buffers with libc memmove (ctypes), one thread, and
prints one JSON line per size: {"ref":"memcpy-host","size_bytes":N,"gb_per_s":best,"median_gb_per_s":m,
"window":W} (decimal GB/s, the best and the median of --iters timed copies). This is the ceiling one
CPU core reaches; an shm path that copies once on each side pipelined can approach it.

--window N copies one source into N destinations in turn (at most 1 GiB of them, as `dmx bench`
sizes its window), as `dmx bench` receives a window of operations into as many buffers: at 1 MiB
and N = 64 the destinations no longer stay in the caches that one destination (N = 1) stays in.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refutil  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1M,256M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--window", type=int, default=1, help="destinations copied into in turn (1-64)")
    a = p.parse_args()
    if not 1 <= a.window <= 64:
        p.error("--window must be 1-64")
    sizes = refutil.parse_sizes(a.sizes)
    biggest = max(sizes)
    src = mmap.mmap(-1, biggest)
    window = {n: min(a.window, max(1, (1 << 30) // n)) for n in sizes}
    span = max(n * w for n, w in window.items())
    dst = mmap.mmap(-1, span)
    src.write(os.urandom(min(biggest, 1 << 20)) * (biggest // (1 << 20) or 1) if biggest >= (1 << 20)
              else os.urandom(biggest))
    for _ in range(span // biggest):
        dst.write(b"\x01" * biggest)  # fault every page in before timing
    dst.write(b"\x01" * (span % biggest))
    sp = ctypes.addressof(ctypes.c_char.from_buffer(src))
    dp = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    for n in sizes:
        reps = max(1, (64 << 20) // n)
        rates = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            for r in range(reps):
                ctypes.memmove(dp + (r % window[n]) * n, sp, n)
            dt = time.perf_counter() - t0
            rates.append(n * reps / dt / 1e9)
        print(json.dumps({"ref": "memcpy-host", "size_bytes": n, "gb_per_s": max(rates),
                          "median_gb_per_s": statistics.median(rates), "threads": 1, "window": window[n]}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
