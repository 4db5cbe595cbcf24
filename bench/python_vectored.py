#!/usr/bin/env python3
"""How long Python takes to post one vectored write of many blocks (issue 44: 100,000 entries in
at most 20 ms), and how fast it moves, in two processes.

    PYTHONPATH=build/python python3 bench/python_vectored.py [--entries 100000] [--block 1024]
        [--mem host|cuda:N] [--peer-mem host|cuda:N] [--repeat 5] [--form blocks|entries]

The peer registers one cache of ENTRIES blocks of BLOCK bytes; this side has a cache of the same
shape and writes every block of it to a shuffled slot of the peer's with one `write_blocks` (the
list built in C++ from two arrays of offsets; --form entries: a prebuilt dmx.IO_ENTRY array, copied
with one memcpy) and notify. Per repeat: post (the call until its Future is back: list building and
checking included), done (until the write completed), and the binding's stages (list, acquire,
post). The data is checked once at the end (read back, compared). One JSON row per repeat, then
the medians; `--per-block N` also times N plain writes, one per block, for comparison.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

CTRL, DESC = 1, 2


def alloc(mem, size):
    if mem == "host":
        return np.zeros(size, np.uint8)
    import torch
    return torch.zeros(size, dtype=torch.uint8, device=mem)


def serve(mem):
    import dmx
    ctx = dmx.Context()
    lis = ctx.listen("tcp://127.0.0.1:0")
    print(lis.address, flush=True)
    ep = lis.accept(timeout=60)
    buf = bytearray(256)
    n = ep.recv(buf, CTRL).wait(timeout=60)
    size = json.loads(buf[:n])["size"]
    region = alloc(mem, size)
    if mem != "host":
        import torch
        torch.cuda.synchronize()
    reg = ctx.register(region)
    ep.send(reg.descriptor(), DESC).wait(timeout=60)
    ep.recv(buf, CTRL).wait(timeout=3600)  # quit
    ep.close()
    reg.deregister()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--block", type=int, default=1024, help="bytes per block")
    ap.add_argument("--mem", default="host", help="this side's cache: host (NumPy) or cuda:N (torch)")
    ap.add_argument("--peer-mem", default="host")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--form", choices=["blocks", "entries"], default="blocks")
    ap.add_argument("--per-block", type=int, default=0, help="also N single writes, one per block")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(a.peer_mem)
    import dmx
    from dmx import _dmx
    n, block = a.entries, a.block
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--peer-mem", a.peer_mem], stdout=subprocess.PIPE,
                            text=True)
    try:
        address = proc.stdout.readline().strip()
        ctx = dmx.Context()
        ep = ctx.connect(address)
        ep.send(json.dumps({"size": n * block}).encode(), CTRL).wait(timeout=60)
        desc = bytearray(64)
        got = ep.recv(desc, DESC).wait(timeout=120)
        d = bytes(desc[:got])
        rng = np.random.default_rng()
        host = np.frombuffer(rng.bytes(n * block), np.uint8).copy()
        src = host if a.mem == "host" else __import__("torch").from_numpy(host).to(a.mem)
        if a.mem != "host":
            __import__("torch").cuda.synchronize()
        src_ids = rng.permutation(n)
        dst_ids = rng.permutation(n)
        lo, ro = src_ids * block, dst_ids * block
        entries = None
        if a.form == "entries":
            entries = np.zeros(n, dmx.IO_ENTRY)
            entries["local_offset"], entries["remote_offset"], entries["length"] = lo, ro, block
        rows = []
        for r in range(a.repeat):
            _dmx._profile(True)
            t0 = time.perf_counter()
            if entries is None:
                fut = ep.write_blocks(src, d, lo, ro, block, notify=r)
            else:
                fut = ep.write_vec(src, d, entries, notify=r)
            t1 = time.perf_counter()
            moved = fut.wait(timeout=600)
            t2 = time.perf_counter()
            stages = _dmx._profile_take()
            _dmx._profile(False)
            assert moved == n * block, moved
            row = {"kind": "run", "form": a.form, "mem": a.mem, "peer_mem": a.peer_mem, "entries": n,
                   "block": block, "post_ms": (t1 - t0) * 1e3, "done_ms": (t2 - t0) * 1e3,
                   "gb_per_s": n * block / (t2 - t0) / 1e9, "blocks_per_s": n / (t2 - t0),
                   "stages_ms": {k: secs * 1e3 for k, (calls, secs) in stages.items() if calls},
                   "transport": ep.stats()["transport"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        loop = None
        if a.per_block:
            m = min(a.per_block, n)
            t0 = time.perf_counter()
            futs = [ep.write(src[int(lo[j]):int(lo[j]) + block], d, offset=int(ro[j])) for j in range(m)]
            t1 = time.perf_counter()
            for f in futs:
                f.wait(timeout=600)
            t2 = time.perf_counter()
            loop = {"kind": "per_block", "writes": m, "post_ms": (t1 - t0) * 1e3, "done_ms": (t2 - t0) * 1e3,
                    "blocks_per_s": m / (t2 - t0), "gb_per_s": m * block / (t2 - t0) / 1e9}
            print(json.dumps(loop), flush=True)
        # Check: read the peer's cache back; block dst_ids[j] must be our block src_ids[j].
        back = alloc(a.mem, n * block)
        ep.read(back, d).wait(timeout=600)
        back = back if a.mem == "host" else back.cpu().numpy()
        ok = bool(np.array_equal(back.reshape(n, block)[dst_ids], host.reshape(n, block)[src_ids]))
        ep.send(b"quit", CTRL).wait(timeout=60)
        proc.wait(timeout=60)
        ep.close()
        med = {k: statistics.median(r[k] for r in rows) for k in ("post_ms", "done_ms", "gb_per_s", "blocks_per_s")}
        summary = dict(kind="summary", form=a.form, mem=a.mem, peer_mem=a.peer_mem, entries=n, block=block,
                       repeat=a.repeat, verified=ok, post_goal_met=med["post_ms"] <= 20, **med)
        print(json.dumps(summary))
        print(f"# {n} entries of {block} B, {a.mem} -> {a.peer_mem} ({rows[-1]['transport']}), form {a.form}, median "
              f"of {a.repeat}: posted in {med['post_ms']:.2f} ms (goal <= 20), done in {med['done_ms']:.1f} ms, "
              f"{med['gb_per_s']:.2f} GB/s, {med['blocks_per_s']:.0f} blocks/s; bytes "
              f"{'verified' if ok else 'DIFFER'}")
        if loop:
            print(f"# one write per block ({loop['writes']}): posted in {loop['post_ms']:.1f} ms, "
                  f"{loop['blocks_per_s']:.0f} blocks/s, {loop['gb_per_s']:.2f} GB/s")
        return 0 if ok else 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
