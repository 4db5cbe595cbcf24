#!/usr/bin/env python3
"""Single-thread host memcpy reference for same-host (shm) benchmarks.

  bench/ref/memcpy_host.py [--sizes 1M,256M] [--iters 20]

Copies between two pre-faulted anonymous buffers with libc memmove (ctypes), one thread, and
prints one JSON line per size: {"ref":"memcpy-host","size_bytes":N,"gb_per_s":best,"median_gb_per_s":m}
(decimal GB/s, the best and the median of --iters timed copies). This is the ceiling one CPU core
reaches; an shm path that copies once on each side pipelined can approach it.
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
    a = p.parse_args()
    sizes = refutil.parse_sizes(a.sizes)
    biggest = max(sizes)
    src = mmap.mmap(-1, biggest)
    dst = mmap.mmap(-1, biggest)
    src.write(os.urandom(min(biggest, 1 << 20)) * (biggest // (1 << 20) or 1) if biggest >= (1 << 20)
              else os.urandom(biggest))
    dst.write(b"\x01" * biggest)  # fault every page in before timing
    sp = ctypes.addressof(ctypes.c_char.from_buffer(src))
    dp = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    for n in sizes:
        reps = max(1, (64 << 20) // n)
        rates = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            for _ in range(reps):
                ctypes.memmove(dp, sp, n)
            dt = time.perf_counter() - t0
            rates.append(n * reps / dt / 1e9)
        print(json.dumps({"ref": "memcpy-host", "size_bytes": n, "gb_per_s": max(rates),
                          "median_gb_per_s": statistics.median(rates), "threads": 1}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
