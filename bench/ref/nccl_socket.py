#!/usr/bin/env python3
"""NCCL reference for dmx bench: GPU0 -> GPU1 point-to-point through PyTorch.

  bench/ref/nccl_socket.py [--socket] [--socket-tuned] [--p2p] [--sizes 8,1M,256M]
                           [--iters 20] [--warmup 5] [--burst auto|N] [--rtt-iters 1000]
                           [--timeout 300] [--keep-logs DIR]

Two processes (rank 0 on cuda:0 sends, rank 1 on cuda:1 receives, dist.send/dist.recv),
one pair per mode, because NCCL reads its environment once per process:

  --socket        NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_IB_DISABLE=1
                  NCCL_SOCKET_IFNAME=lo   -> ref "nccl-socket"
  --socket-tuned  the same plus NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4
                                          -> ref "nccl-socket-tuned"
  --p2p           NCCL defaults (NVLink / PCIe P2P)   -> ref "nccl-p2p"
  (no mode flag = all three)

NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are forced in every mode (a
workplace rule: NVLink multicast can break the shared host). NCCL_SOCKET_IFNAME=lo is set in
every mode so that bootstrap stays on loopback.

Timing: after --warmup samples, --iters samples; each sample is a burst of B back-to-back
ops between two synchronisation points (tiny all_reduce + cuda synchronize), timed with CUDA
events on the receiver's stream; per-op time = sample / B. B ("burst") is 1 for sizes of
64 MiB and more, else enough ops to move about 64 MiB (at most 64). Per size, one line:
  {"ref":"nccl-socket","size_bytes":S,"gb_per_s":S/median,"lat_p50_us":median,
   "lat_p99_us":p99,"burst":B,"verified":true,"nccl_path":["NET/Socket/0"],...}
plus one 8-byte ping-pong line per mode ("metric":"half_rtt"): lat_p50_us is the median of
per-round-trip times / 2 (events on rank 0, host launch cost included, as a user sees it);
half_rtt_burst_us is the time of --rtt-iters back-to-back round trips / iters / 2.
gb_per_s is decimal (1e9 bytes/s). nccl_path lists the "via ..." transports NCCL logged, so
a mode that silently fell back to another transport is visible.

Without torch, CUDA or two GPUs it prints one {"ref":..., "skipped": "<reason>"} line per mode
and exits 0. Exit 1 when a measurement failed (an "error" line says why), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refutil  # noqa: E402

refutil.apply_safety_env()  # before anything can import torch / load NCCL

MARK = "DMXREF "
MODES = {
    "socket": ("nccl-socket", {
        "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket",
        "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}),
    "socket-tuned": ("nccl-socket-tuned", {
        "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket",
        "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"}),
    "p2p": ("nccl-p2p", {"NCCL_SOCKET_IFNAME": "lo"}),
}
# NCCL variables inherited from the caller would change what a mode means; they are removed
# unless --inherit-nccl-env is given.
_SAFE_INHERITED = set(refutil.SAFETY_ENV)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", action="store_true")
    p.add_argument("--socket-tuned", action="store_true")
    p.add_argument("--p2p", action="store_true")
    p.add_argument("--sizes", default="8,1M,256M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--burst", default="auto")
    p.add_argument("--rtt-iters", type=int, default=1000)
    p.add_argument("--timeout", type=int, default=300, help="seconds per mode")
    p.add_argument("--keep-logs", metavar="DIR", help="copy NCCL logs and worker stderr here")
    p.add_argument("--inherit-nccl-env", action="store_true",
                   help="keep NCCL_* variables from the caller's environment")
    p.add_argument("--check", action="store_true",
                   help="only say whether this machine can run the reference (skip line or ok line)")
    # internal: worker process
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="socket", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.size_list = refutil.parse_sizes(args.sizes)
    except ValueError as e:
        p.error(str(e))
    if args.iters < 1 or args.warmup < 0 or args.rtt_iters < 1:
        p.error("--iters and --rtt-iters must be >= 1, --warmup >= 0")
    if args.burst != "auto":
        try:
            if int(args.burst) < 1:
                raise ValueError
        except ValueError:
            p.error("--burst wants auto or a positive number")
    return args


def burst_for(size: int, burst: str) -> int:
    if burst != "auto":
        return int(burst)
    return max(1, min(64, -(-(64 << 20) // size)))


# ---------------------------------------------------------------------------------------
# worker (one per rank)


def worker(args) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    peer = 1 - rank
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    init = dict(backend="nccl", rank=rank, world_size=2,
                init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                timeout=timedelta(seconds=args.timeout))
    try:
        dist.init_process_group(device_id=dev, **init)
    except TypeError:  # torch < 2.3 has no device_id
        dist.init_process_group(**init)

    flag = torch.zeros(1, device=dev)  # stays 0: the all_reduce is only a rendezvous

    def sync():
        dist.all_reduce(flag)
        torch.cuda.synchronize(dev)

    def p2p(buf, sending):
        if sending:
            dist.send(buf, dst=peer)
        else:
            dist.recv(buf, src=peer)

    def pattern(size):
        reps = -(-size // 251)
        return torch.arange(251, dtype=torch.int32, device=dev).to(torch.uint8).repeat(reps)[:size]

    nv = torch.cuda.nccl.version()
    ref = MODES[args.mode][0]
    common = {"ref": ref, "mode": args.mode, "op": "send",
              "torch_version": torch.__version__,
              "nccl_version": ".".join(map(str, nv)) if isinstance(nv, tuple) else str(nv),
              "gpu": torch.cuda.get_device_name(dev), "src": "cuda:0", "dst": "cuda:1"}

    # Connection set-up is not measured.
    p2p(torch.zeros(8, dtype=torch.uint8, device=dev), rank == 0)
    sync()

    for size in args.size_list:
        buf = torch.empty(size, dtype=torch.uint8, device=dev)
        if rank == 0:
            buf.copy_(pattern(size))
        else:
            buf.zero_()
        b = burst_for(size, args.burst)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        per_op_us = []
        for i in range(args.warmup + args.iters):
            sync()
            start.record()
            for _ in range(b):
                p2p(buf, rank == 0)
            end.record()
            end.synchronize()
            if i >= args.warmup:
                per_op_us.append(start.elapsed_time(end) * 1000.0 / b)
        sync()
        if rank == 1:
            verified = bool(torch.equal(buf, pattern(size)))
            med = statistics.median(per_op_us)
            line = dict(common, size_bytes=size, gb_per_s=round(size / (med * 1e-6) / 1e9, 4),
                        lat_p50_us=round(med, 2), lat_p99_us=round(refutil.percentile(per_op_us, 99), 2),
                        iters=args.iters, burst=b, verified=verified, timed_on="receiver")
            print(MARK + json.dumps(line), flush=True)
        del buf
        torch.cuda.empty_cache()

    # 8-byte ping-pong: rank 0 sends then receives, rank 1 receives then sends.
    small = torch.zeros(8, dtype=torch.uint8, device=dev)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    rtts = []
    n_single = min(args.rtt_iters, 200)
    for i in range(args.warmup + n_single):
        if rank == 0:
            start.record()
            p2p(small, True)
            p2p(small, False)
            end.record()
            end.synchronize()
            if i >= args.warmup:
                rtts.append(start.elapsed_time(end) * 1000.0)
        else:  # no host sync here: the next recv is already posted when rank 0 sends
            p2p(small, False)
            p2p(small, True)
    sync()
    start.record()
    for _ in range(args.rtt_iters):
        p2p(small, rank == 0)
        p2p(small, rank != 0)
    end.record()
    end.synchronize()
    burst_half_us = start.elapsed_time(end) * 1000.0 / args.rtt_iters / 2
    sync()
    if rank == 0:
        line = dict(common, metric="half_rtt", size_bytes=8,
                    lat_p50_us=round(statistics.median(rtts) / 2, 2),
                    lat_p99_us=round(refutil.percentile(rtts, 99) / 2, 2),
                    half_rtt_burst_us=round(burst_half_us, 2), iters=n_single,
                    burst_iters=args.rtt_iters, timed_on="sender")
        print(MARK + json.dumps(line), flush=True)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------
# launcher


def skip_reason() -> str | None:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        return f"torch not importable: {type(e).__name__}: {e}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__}: CUDA not available"
    n = torch.cuda.device_count()
    if n < 2:
        return f"needs 2 GPUs, found {n}"
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return f"torch {torch.__version__} built without NCCL"
    return None


def nccl_paths(log_text: str) -> list[str]:
    """The distinct transports NCCL logged in 'Channel ... via X' lines."""
    return sorted(set(re.findall(r"Channel \S+ : .*? via (\S+)", log_text)))


def nccl_env_seen(log_text: str) -> dict:
    """NCCL's own 'X set by environment to Y' lines, to show the env was applied."""
    return dict(re.findall(r"(NCCL_[A-Z_]+) set by environment to (\S+)", log_text))


def run_mode(args, mode: str) -> int:
    ref, mode_env = MODES[mode]
    env = dict(os.environ)
    if not args.inherit_nccl_env:
        for k in list(env):
            if k.startswith("NCCL_") and k not in _SAFE_INHERITED:
                del env[k]
    env.update(mode_env)
    refutil.apply_safety_env(env)
    logdir = tempfile.mkdtemp(prefix=f"dmx-nccl-{mode}-")
    env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET,P2P",
                "NCCL_DEBUG_FILE": os.path.join(logdir, "nccl.%h.%p.log"),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(refutil.free_port()),
                "WORLD_SIZE": "2"})
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
           "--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--burst", args.burst, "--rtt-iters", str(args.rtt_iters),
           "--timeout", str(args.timeout)]
    procs, errs = [], []
    for rank in (0, 1):
        e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        err = open(os.path.join(logdir, f"rank{rank}.stderr"), "w+")
        errs.append(err)
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=err, text=True))
    deadline = time.monotonic() + args.timeout
    outs, failed = ["", ""], None
    for rank, pr in enumerate(procs):
        try:
            outs[rank], _ = pr.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            failed = f"timed out after {args.timeout}s"
            break
        if pr.returncode != 0 and failed is None:
            errs[rank].seek(0)
            tail = errs[rank].read()[-1500:]
            failed = f"rank {rank} exited {pr.returncode}: {tail}"
    for pr in procs:  # our own children only
        if pr.poll() is None:
            pr.kill()
            pr.wait()
    log_text = ""
    for f in glob.glob(os.path.join(logdir, "nccl.*.log")):
        with open(f, errors="replace") as fh:
            log_text += fh.read()
    paths, seen = nccl_paths(log_text), nccl_env_seen(log_text)
    for err in errs:
        err.close()
    if args.keep_logs:
        os.makedirs(args.keep_logs, exist_ok=True)
        for f in os.listdir(logdir):
            with open(os.path.join(logdir, f), "rb") as src, \
                 open(os.path.join(args.keep_logs, f"{mode}.{f}"), "wb") as dst:
                dst.write(src.read())
    for f in os.listdir(logdir):
        os.unlink(os.path.join(logdir, f))
    os.rmdir(logdir)
    lines = refutil.json_lines("\n".join(l[len(MARK):] for l in (outs[0] + outs[1]).splitlines()
                                         if l.startswith(MARK)))
    warning = None
    if mode == "p2p" and paths and not all(p.startswith("P2P") for p in paths):
        warning = f"NCCL defaults did not give P2P on this machine: {paths}"
        print(f"nccl_socket.py: warning: {warning}", file=sys.stderr)
    for obj in lines:
        obj["nccl_path"] = paths
        if warning:
            obj["warning"] = warning
        obj["env"] = {k: v for k, v in env.items() if (k.startswith("NCCL_") and not k.startswith("NCCL_DEBUG"))
                      or k in refutil.SAFETY_ENV}
        obj["nccl_env_seen"] = seen
        obj.setdefault("iters", args.iters)
        refutil.emit(obj)
    if failed is None and mode != "p2p" and paths and not all(p.startswith("NET/Socket") for p in paths):
        failed = f"NCCL did not use the socket transport: {paths}"
    if failed is None and not any(o.get("metric") == "half_rtt" for o in lines):
        failed = "workers printed no results"
    if failed:
        refutil.emit({"ref": ref, "mode": mode, "error": failed})
        return 1
    return 0


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        return worker(args)
    modes = [m for m, on in (("socket", args.socket), ("socket-tuned", args.socket_tuned),
                             ("p2p", args.p2p)) if on] or list(MODES)
    reason = skip_reason()
    if args.check and not reason:
        refutil.emit({"ref": "nccl", "ok": True})
        return 0
    if reason:
        for m in modes:
            refutil.emit({"ref": MODES[m][0], "mode": m, "skipped": reason})
        print(f"nccl_socket.py: SKIPPED: {reason}", file=sys.stderr)
        return 0
    rc = 0
    for m in modes:
        rc |= run_mode(args, m)
    return rc


if __name__ == "__main__":
    sys.exit(main())
