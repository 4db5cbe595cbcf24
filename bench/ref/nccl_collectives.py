#!/usr/bin/env python3
"""NCCL collectives through a network plugin: dmx's NCCL net plugin against NCCL's socket transport.

  bench/ref/nccl_collectives.py --plugin-dir DIR [--modes dmx,socket] [--sizes 1M,16M,256M,1G]
                                [--ranks 2] [--iters 10] [--warmup 3] [--timeout 600]
                                [--kill-test] [--keep-logs DIR]

--ranks ranks (default 2; rank r on cuda:r, so as many GPUs), torch.distributed with the NCCL
backend, one set of processes per mode, because NCCL reads its environment once per process.
Every mode sets
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo, so that traffic
between the GPUs goes through the network transport:

  dmx     NCCL_NET_PLUGIN=dmx NCCL_NET=dmx (libnccl-net-dmx.so found in --plugin-dir)
  socket  NCCL_NET=Socket (NCCL's own)

A mode may add NCCL settings to try them side by side in one run: `dmx+NCCL_NET_GDR_LEVEL=SYS`
is the dmx mode with that variable set (several: `dmx+A=1+B=2`). `+apart` gives each rank its own
NCCL_HOSTID, so that NCCL sees one rank per host, as between hosts ("nNodes 2" in its log).

NCCL_NVLS_ENABLE=0 and the other multicast-off variables are forced (refutil.SAFETY_ENV).

Per mode, op and size, one JSON line: all_reduce (float32 sum), all_gather, send/recv
(rank 0 -> rank 1, the other ranks idle) and, with more than two ranks, ring (every rank sends
to rank+1 and receives from rank-1 at once), each result checked against values every rank
derives from fresh random seeds; time per op is the median over --iters samples, each the
slowest rank's (CUDA events between barriers; a send can finish on its GPU before the last byte
lands, so the sender's time alone flatters send/recv); busbw as nccl-tests defines it
(all_reduce: algbw * 2(n-1)/n; all_gather: algbw * (n-1)/n; send/recv and ring: algbw, per rank).
nccl_path lists the "via ..." transports NCCL logged, and a mode whose path is not its network (a
silent fallback) fails.

--kill-test (dmx mode): rank 1 kills itself with SIGKILL in the middle of a run of 256 MiB
all_reduces; rank 0 must end (an error, not a hang) within 150 s, and the plugin must have
reported the lost peer to NCCL. One line {"test":"rank_killed", ...} says how long it took, how
rank 0 ended and what the plugin reported.

Without torch, CUDA or --ranks GPUs it prints {"skipped": "<reason>"} and exits 0; exit 1 when a
measurement or check failed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refutil  # noqa: E402

refutil.apply_safety_env()

MARK = "DMXREF "
COMMON_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1",
              "NCCL_SOCKET_IFNAME": "lo"}
MODES = {
    "dmx": ("nccl-dmx-plugin", {"NCCL_NET_PLUGIN": "dmx", "NCCL_NET": "dmx"}),
    "socket": ("nccl-socket", {"NCCL_NET": "Socket", "NCCL_NET_PLUGIN": "none"}),
}
OPS = ("all_reduce", "all_gather", "send_recv", "ring")


def ops_for(world: int) -> tuple[str, ...]:
    return OPS if world > 2 else OPS[:3]  # with two ranks a ring is a send/recv both ways


def mode_parts(mode: str) -> tuple[str, dict]:
    """'dmx+NCCL_BUFFSIZE=8388608+apart' -> ('dmx', {'NCCL_BUFFSIZE': '8388608', 'apart': ''})."""
    base, *extra = mode.split("+")
    return base, dict((kv.split("=", 1) if "=" in kv else (kv, "")) for kv in extra)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plugin-dir", default="", help="directory holding libnccl-net-dmx.so")
    p.add_argument("--modes", default="dmx,socket")
    p.add_argument("--sizes", default="1M,16M,256M,1G")
    p.add_argument("--ranks", type=int, default=2, help="ranks, one GPU each (2 or more)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=int, default=600, help="seconds per mode")
    p.add_argument("--kill-test", action="store_true")
    p.add_argument("--keep-logs", metavar="DIR")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="dmx", help=argparse.SUPPRESS)
    p.add_argument("--kill", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.size_list = refutil.parse_sizes(args.sizes)
    args.mode_list = [m for m in args.modes.split(",") if m]
    if args.ranks < 2:
        p.error("--ranks must be at least 2")
    for m in args.mode_list:
        base, extra = mode_parts(m)
        if base not in MODES:
            p.error(f"unknown mode {m!r} (have {', '.join(MODES)}, each optionally +NAME=VALUE... or +apart)")
        if any(k != "apart" and not k.startswith(("NCCL_", "DMX_")) for k in extra):
            p.error(f"mode {m!r}: only NCCL_* and DMX_* settings, or apart")
    return args


# ---------------------------------------------------------------------------------------
# worker (one per rank)


def worker(args) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group(backend="nccl", rank=rank, world_size=world, device_id=dev,
                            init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            timeout=timedelta(seconds=args.timeout if not args.kill else 60))
    seed0 = int(os.environ["DMX_SEED"])

    def data(r, n):  # small integers in float32: sums are exact
        g = torch.Generator(device=dev).manual_seed(seed0 * 7 + r)
        return torch.randint(-1000, 1000, (n,), generator=g, device=dev, dtype=torch.int32).float()

    def barrier():
        dist.all_reduce(torch.zeros(1, device=dev))
        torch.cuda.synchronize(dev)

    if args.kill:  # rank 1 dies in the middle of a run of all_reduces
        x = data(rank, (256 << 20) // 4)
        barrier()
        t0 = time.monotonic()
        try:
            for i in range(1000):
                if rank == 1 and i == 5:
                    torch.cuda.synchronize(dev)
                    os.kill(os.getpid(), signal.SIGKILL)
                dist.all_reduce(x)
                torch.cuda.synchronize(dev)
            outcome = "completed (the peer did not die?)"
        except Exception as e:  # noqa: BLE001 - any error is the expected outcome
            outcome = f"error: {type(e).__name__}: {str(e)[:300]}"
        print(MARK + json.dumps({"test": "rank_killed", "rank0_outcome": outcome,
                                 "rank0_seconds": round(time.monotonic() - t0, 2)}), flush=True)
        os._exit(0)  # destroy_process_group could wait on the dead peer

    common = {"ref": MODES[mode_parts(args.mode)[0]][0], "mode": args.mode, "ranks": world,
              "torch_version": torch.__version__, "gpu": torch.cuda.get_device_name(dev)}
    # Connections are made by the first operation: not measured.
    dist.all_reduce(torch.ones(1024, device=dev))
    barrier()
    failed = False
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for size in args.size_list:
        n = size // 4
        mine = data(rank, n)
        for op in ops_for(world):
            if op == "all_reduce":
                buf = mine.clone()
                run = lambda: dist.all_reduce(buf)  # noqa: E731
            elif op == "all_gather":
                out = torch.empty(world * n, device=dev)
                run = lambda: dist.all_gather_into_tensor(out, mine)  # noqa: E731
            elif op == "send_recv":
                buf = mine.clone() if rank == 0 else torch.zeros(n, device=dev)
                if rank == 0:
                    run = lambda: dist.send(buf, dst=1)  # noqa: E731
                elif rank == 1:
                    run = lambda: dist.recv(buf, src=0)  # noqa: E731
                else:
                    run = lambda: None  # noqa: E731
            else:
                buf = torch.zeros(n, device=dev)

                def run():
                    ops = [dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, buf, prv)]
                    for req in dist.batch_isend_irecv(ops):
                        req.wait()
            times = []
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for i in range(args.warmup + args.iters):
                if op == "all_reduce":
                    buf.copy_(mine)  # every sample reduces the same inputs
                barrier()
                start.record()
                run()
                end.record()
                end.synchronize()
                if i >= args.warmup:
                    times.append(start.elapsed_time(end) * 1e-3)
            if op == "all_reduce":
                ok = torch.equal(buf, sum(data(r, n) for r in range(world)))
            elif op == "all_gather":
                ok = all(torch.equal(out[r * n:(r + 1) * n], data(r, n)) for r in range(world))
            elif op == "send_recv":
                ok = rank != 1 or torch.equal(buf, data(0, n))
            else:
                ok = torch.equal(buf, data(prv, n))
            slowest = torch.tensor(times, device=dev, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            t = statistics.median(slowest.tolist())
            algbw = (world * size if op == "all_gather" else size) / t / 1e9
            busbw = algbw * {"all_reduce": 2 * (world - 1) / world,
                             "all_gather": (world - 1) / world, "send_recv": 1.0, "ring": 1.0}[op]
            flags = torch.tensor([1.0 if ok else 0.0], device=dev)
            dist.all_reduce(flags)
            ok_both = flags.item() == world
            failed |= not ok_both
            if rank == 0:
                print(MARK + json.dumps(dict(common, op=op, size_bytes=size, time_us=round(t * 1e6, 1),
                                             algbw_gb_per_s=round(algbw, 3), busbw_gb_per_s=round(busbw, 3),
                                             iters=args.iters, verified=ok_both)), flush=True)
            del run
            torch.cuda.empty_cache()
    dist.destroy_process_group()
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------
# launcher


def skip_reason(ranks: int) -> str | None:
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch not importable: {type(e).__name__}: {e}"
    if not torch.cuda.is_available() or torch.cuda.device_count() < ranks:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return f"needs {ranks} GPUs with CUDA ({have} visible)"
    if not torch.distributed.is_nccl_available():
        return "torch built without NCCL"
    return None


def run_pair(args, mode: str, kill: bool) -> tuple[list[dict], str | None, str]:
    base, extra = mode_parts(mode)
    ref, mode_env = MODES[base]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(COMMON_ENV)
    env.update(mode_env)
    apart = extra.pop("apart", None) is not None
    env.update(extra)
    refutil.apply_safety_env(env)
    if args.plugin_dir:
        env["LD_LIBRARY_PATH"] = os.path.abspath(args.plugin_dir) + ":" + env.get("LD_LIBRARY_PATH", "")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", mode)  # a file name, whatever settings the mode adds
    logdir = tempfile.mkdtemp(prefix=f"dmx-coll-{safe}-")
    env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET",
                "NCCL_DEBUG_FILE": os.path.join(logdir, "nccl.%h.%p.log"),
                "MASTER_PORT": str(refutil.free_port()), "DMX_SEED": str(int.from_bytes(os.urandom(3), "little")),
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--sizes", args.sizes,
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--timeout", str(args.timeout),
           "--ranks", str(args.ranks)]
    if kill:
        cmd.append("--kill")
    procs, errs = [], []
    for rank in range(args.ranks):
        err = open(os.path.join(logdir, f"rank{rank}.stderr"), "w+")
        errs.append(err)
        rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.ranks))
        if apart:
            rank_env["NCCL_HOSTID"] = f"dmx-bench-host-{rank}"
        procs.append(subprocess.Popen(cmd, env=rank_env,
                                      stdout=subprocess.PIPE, stderr=err, text=True))
    deadline = time.monotonic() + (150 if kill else args.timeout)
    outs, failed = [""] * args.ranks, None
    for rank, pr in enumerate(procs):
        try:
            outs[rank], _ = pr.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            failed = f"rank {rank} still running at the deadline: a hang"
            break
        if pr.returncode != 0 and failed is None and not kill:
            errs[rank].seek(0)
            failed = f"rank {rank} exited {pr.returncode}: {errs[rank].read()[-1500:]}"
    for pr in procs:
        if pr.poll() is None:
            pr.kill()
            pr.wait()
    log_text = ""
    for f in glob.glob(os.path.join(logdir, "nccl.*.log")):
        with open(f, errors="replace") as fh:
            log_text += fh.read()
    for err in errs:
        err.close()
    if args.keep_logs:
        os.makedirs(args.keep_logs, exist_ok=True)
        for f in os.listdir(logdir):
            os.replace(os.path.join(logdir, f), os.path.join(args.keep_logs, f"{safe}{'-kill' if kill else ''}.{f}"))
    for f in os.listdir(logdir):
        os.unlink(os.path.join(logdir, f))
    os.rmdir(logdir)
    lines = refutil.json_lines("\n".join(l[len(MARK):] for l in "".join(outs).splitlines()
                                         if l.startswith(MARK)))
    return lines, failed, log_text


def main(argv) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    why = skip_reason(args.ranks)
    if why:
        refutil.emit({"skipped": why})
        return 0
    rc = 0
    for mode in args.mode_list:
        lines, failed, log = run_pair(args, mode, kill=False)
        paths = sorted(set(re.findall(r"Channel \S+ : .*? via (\S+)", log)))
        want = "NET/" + ("dmx" if mode_parts(mode)[0] == "dmx" else "Socket")
        loaded = sorted(set(re.findall(r"(?:NET/Plugin|Initialized NET plugin|Assigned NET plugin)[^\n]*", log)))[:4]
        gdr = sorted(set(re.findall(r"GPU Direct RDMA (?:Enabled|Disabled)[^\n]*", log)))[:2]
        for obj in lines:
            obj.update(nccl_path=paths, nccl_net_lines=loaded, nccl_gdr=gdr)
            refutil.emit(obj)
        if not failed and (not paths or not all(p.startswith(want) for p in paths)):
            failed = f"NCCL used {paths}, not {want}"
        if not failed and not all(o.get("verified") for o in lines):
            failed = "a result did not match"
        want_lines = len(args.size_list) * len(ops_for(args.ranks))
        if not failed and len(lines) != want_lines:
            failed = f"{len(lines)} results, want {want_lines}"
        if failed:
            refutil.emit({"ref": MODES[mode_parts(mode)[0]][0], "mode": mode, "error": failed})
            rc = 1
    if args.kill_test:
        # Rank 0 passes when it ends, not hangs: with its own error line, or aborted by PyTorch's
        # watchdog after NCCL reported the error (the collective's kernel never finishes, so the
        # Python thread stays in synchronize). What NCCL reported, and when, comes from its log.
        t0 = time.monotonic()
        lines, failed, log = run_pair(args, "dmx", kill=True)
        seen = re.findall(r"NCCL WARN NET/dmx: [^\n]*", log)[:2]
        obj = lines[0] if lines else {"test": "rank_killed", "rank0_outcome": "ended without its own report "
                                      "(aborted by PyTorch's watchdog)"}
        obj.update(wall_seconds=round(time.monotonic() - t0, 1), plugin_reported=seen)
        refutil.emit(obj)
        if failed or not seen or obj.get("rank0_outcome", "").startswith("completed"):
            refutil.emit({"test": "rank_killed", "error": failed or "the plugin reported no error"})
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
