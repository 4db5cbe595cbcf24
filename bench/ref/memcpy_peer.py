#!/usr/bin/env python3
"""Same-host copy references for dmx bench: GPU<->GPU peer copies and pinned/pageable
host<->GPU copies, through PyTorch (no NCCL).

  bench/ref/memcpy_peer.py [--sizes 1M,256M] [--iters 20] [--warmup 5] [--burst auto|N]
                           [--pair 0,1] [--device 0] [--no-peer] [--no-host]

Lines (decimal GB/s; lat_p50_us is the median per-copy time, a sample being a burst of B
back-to-back copies, B = 1 from 64 MiB up, else enough to move about 64 MiB, at most 64):
  {"ref":"memcpy-peer","method":"cudaMemcpyPeerAsync","src":"cuda:0","dst":"cuda:1",...}
      cudaMemcpyPeerAsync called through ctypes on the source device's torch stream, timed
      with CUDA events on that stream; peer access enabled first where possible. Best effort:
      when libcudart cannot be loaded or the call fails, the line says "skipped" and why.
  {"ref":"memcpy-peer","method":"torch.copy_",...}
      dst.copy_(src): what a PyTorch user gets, including torch's cross-device stream
      barriers and launch overhead; timed by wall clock between device synchronisations.
      At small sizes this is launch-bound; the cudaMemcpyPeerAsync line is the reference
      for the copy itself. Both directions (0->1 and 1->0) are measured.
  {"ref":"h2d-pinned"|"d2h-pinned"|"h2d-pageable"|"d2h-pageable","src":...,"dst":...}
      host<->device copies with torch (non_blocking for pinned), wall clock timed.
Each line carries "peer_access" (torch.cuda.can_device_access_peer) where it applies.

Without torch/CUDA every reference prints {"ref":..., "skipped": "<reason>"} and the script
exits 0; with one GPU the peer references are skipped and the host ones still run.
NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are forced (workplace rule).
Exit 1 when a measurement failed ("error" line), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refutil  # noqa: E402

refutil.apply_safety_env()

HOST_REFS = ("h2d-pinned", "d2h-pinned", "h2d-pageable", "d2h-pageable")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1M,256M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--burst", default="auto")
    p.add_argument("--pair", default="0,1", help="the two GPUs for peer copies")
    p.add_argument("--device", type=int, default=0, help="GPU for host<->device copies")
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--no-host", action="store_true")
    args = p.parse_args(argv)
    try:
        args.size_list = refutil.parse_sizes(args.sizes)
        args.pair_list = [int(x) for x in args.pair.split(",")]
        if len(args.pair_list) != 2 or args.pair_list[0] == args.pair_list[1] or min(args.pair_list) < 0:
            raise ValueError(f"--pair wants two different GPU indices, got {args.pair!r}")
        if args.burst != "auto" and int(args.burst) < 1:
            raise ValueError("--burst wants auto or a positive number")
    except ValueError as e:
        p.error(str(e))
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1, --warmup >= 0")
    return args


def burst_for(size: int, burst: str) -> int:
    if burst != "auto":
        return int(burst)
    return max(1, min(64, -(-(64 << 20) // size)))


def summarise(ref, size, per_op_us, **extra):
    med = statistics.median(per_op_us)
    out = {"ref": ref, "size_bytes": size, "gb_per_s": round(size / (med * 1e-6) / 1e9, 4),
           "lat_p50_us": round(med, 2), "lat_p99_us": round(refutil.percentile(per_op_us, 99), 2)}
    out.update(extra)
    return out


def wall_timed(torch, devices, fn, burst, warmup, iters):
    """Per-op microseconds of fn() run burst times between synchronisations of devices."""
    times = []
    for i in range(warmup + iters):
        for d in devices:
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        for d in devices:
            torch.cuda.synchronize(d)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e6 / burst)
    return times


class Cudart:
    """The few CUDA runtime calls torch does not expose, through ctypes."""

    def __init__(self, torch):
        self.lib = None
        self.why = None
        if getattr(torch, "_dmx_fake", False):
            self.why = "fake torch (bench/ref/testing): no CUDA runtime"
            return
        candidates = []
        tdir = os.path.dirname(torch.__file__)
        candidates += sorted(glob.glob(os.path.join(tdir, "lib", "libcudart.so*")))
        site = os.path.dirname(tdir)
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib", "libcudart.so*")))
        candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
        errors = []
        for c in candidates:
            try:
                self.lib = ctypes.CDLL(c)
                self.path = c
                break
            except OSError as e:
                errors.append(str(e))
        if self.lib is None:
            self.why = "libcudart not found (" + "; ".join(errors[-2:]) + ")"
            return
        L = self.lib
        L.cudaMemcpyPeerAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                          ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
        L.cudaSetDevice.argtypes = [ctypes.c_int]
        L.cudaDeviceEnablePeerAccess.argtypes = [ctypes.c_int, ctypes.c_uint]
        L.cudaGetErrorString.argtypes = [ctypes.c_int]
        L.cudaGetErrorString.restype = ctypes.c_char_p

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: cuda error {rc} {self.lib.cudaGetErrorString(rc).decode()}")

    def enable_peer(self, src, dst):
        self.check(self.lib.cudaSetDevice(src), f"cudaSetDevice({src})")
        rc = self.lib.cudaDeviceEnablePeerAccess(dst, 0)
        if rc not in (0, 704):  # 704: cudaErrorPeerAccessAlreadyEnabled
            self.check(rc, f"cudaDeviceEnablePeerAccess({src}->{dst})")
        self.lib.cudaGetLastError()  # clear the sticky "already enabled" status

    def memcpy_peer_async(self, dst_ptr, dst_dev, src_ptr, src_dev, n, stream):
        self.check(self.lib.cudaMemcpyPeerAsync(dst_ptr, dst_dev, src_ptr, src_dev, n, stream),
                   "cudaMemcpyPeerAsync")


def event_timed(torch, stream, fn, burst, warmup, iters):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(warmup + iters):
        stream.synchronize()
        start.record(stream)
        for _ in range(burst):
            fn()
        end.record(stream)
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) * 1000.0 / burst)
    return times


def run_peer(torch, args, rc_box):
    a, b = args.pair_list
    if torch.cuda.device_count() <= max(a, b):
        reason = f"needs GPUs {a} and {b}, found {torch.cuda.device_count()}"
        refutil.emit({"ref": "memcpy-peer", "skipped": reason})
        return
    cudart = Cudart(torch)
    for src, dst in ((a, b), (b, a)):
        peer = bool(torch.cuda.can_device_access_peer(src, dst))
        base = {"src": f"cuda:{src}", "dst": f"cuda:{dst}", "peer_access": peer,
                "iters": args.iters, "gpu": torch.cuda.get_device_name(src)}
        for size in args.size_list:
            burst = burst_for(size, args.burst)
            s = torch.arange(251, dtype=torch.int32, device=f"cuda:{src}").to(torch.uint8).repeat(-(-size // 251))[:size]
            d = torch.empty(size, dtype=torch.uint8, device=f"cuda:{dst}")
            try:
                t = wall_timed(torch, [src, dst], lambda: d.copy_(s, non_blocking=True),
                               burst, args.warmup, args.iters)
                refutil.emit(summarise("memcpy-peer", size, t, method="torch.copy_", burst=burst, **base))
            except Exception as e:  # noqa: BLE001 - report and go on with the next reference
                refutil.emit({"ref": "memcpy-peer", "method": "torch.copy_", "size_bytes": size,
                              "error": f"{type(e).__name__}: {e}", **base})
                rc_box[0] = 1
            if cudart.lib is None:
                refutil.emit({"ref": "memcpy-peer", "method": "cudaMemcpyPeerAsync",
                              "size_bytes": size, "skipped": cudart.why, **base})
            else:
                try:
                    d.zero_()
                    if peer:
                        current = torch.cuda.current_device()
                        cudart.enable_peer(src, dst)
                        torch.cuda.set_device(current)  # cudart may be torch's own instance
                    stream = torch.cuda.current_stream(src)
                    sp, dp, h = s.data_ptr(), d.data_ptr(), stream.cuda_stream
                    t = event_timed(torch, stream,
                                    lambda: cudart.memcpy_peer_async(dp, dst, sp, src, size, h),
                                    burst, args.warmup, args.iters)
                    torch.cuda.synchronize(dst)
                    ok = bool(torch.equal(d, s.to(d.device)))
                    refutil.emit(summarise("memcpy-peer", size, t, method="cudaMemcpyPeerAsync",
                                           burst=burst, verified=ok, cudart=cudart.path, **base))
                except Exception as e:  # noqa: BLE001 - best effort: torch.copy_ still stands
                    refutil.emit({"ref": "memcpy-peer", "method": "cudaMemcpyPeerAsync",
                                  "size_bytes": size, "skipped": f"{type(e).__name__}: {e}", **base})
                    print(f"memcpy_peer.py: cudaMemcpyPeerAsync through ctypes failed: {e}",
                          file=sys.stderr)
            del s, d
            torch.cuda.empty_cache()


def run_host(torch, args, rc_box):
    dev = args.device
    if torch.cuda.device_count() <= dev:
        for r in HOST_REFS:
            refutil.emit({"ref": r, "skipped": f"no GPU {dev} (found {torch.cuda.device_count()})"})
        return
    for size in args.size_list:
        burst = burst_for(size, args.burst)
        g = torch.empty(size, dtype=torch.uint8, device=f"cuda:{dev}")
        for pinned in (True, False):
            h = torch.empty(size, dtype=torch.uint8, pin_memory=pinned).fill_(3)
            kind = "pinned" if pinned else "pageable"
            for ref, fn, src, dst in (
                    (f"h2d-{kind}", lambda: g.copy_(h, non_blocking=pinned), kind, f"cuda:{dev}"),
                    (f"d2h-{kind}", lambda: h.copy_(g, non_blocking=pinned), f"cuda:{dev}", kind)):
                try:
                    t = wall_timed(torch, [dev], fn, burst, args.warmup, args.iters)
                    refutil.emit(summarise(ref, size, t, method="torch.copy_", src=src, dst=dst,
                                           burst=burst, iters=args.iters,
                                           gpu=torch.cuda.get_device_name(dev)))
                except Exception as e:  # noqa: BLE001
                    refutil.emit({"ref": ref, "size_bytes": size, "error": f"{type(e).__name__}: {e}"})
                    rc_box[0] = 1
            del h
        del g
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    refs = ([] if args.no_peer else ["memcpy-peer"]) + ([] if args.no_host else list(HOST_REFS))
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        reason = f"torch not importable: {type(e).__name__}: {e}"
        torch = None
    else:
        reason = None if torch.cuda.is_available() else f"torch {torch.__version__}: CUDA not available"
    if reason:
        for r in refs:
            refutil.emit({"ref": r, "skipped": reason})
        print(f"memcpy_peer.py: SKIPPED: {reason}", file=sys.stderr)
        return 0
    rc_box = [0]
    if not args.no_peer:
        run_peer(torch, args, rc_box)
    if not args.no_host:
        run_host(torch, args, rc_box)
    return rc_box[0]


if __name__ == "__main__":
    sys.exit(main())
