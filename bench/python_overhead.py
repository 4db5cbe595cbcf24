#!/usr/bin/env python3
"""Python's overhead over the C++ API: the same measurement through `dmx bench` (C++, two
processes) and through the dmx module (Python, two processes), in one run.

    PYTHONPATH=build/python python3 bench/python_overhead.py [--dmx build/tools/dmx/dmx] [--repeat 3] [--profile]

Both follow `dmx bench --op send` (tools/dmx/bench.h): latency is the half round trip of a
ping-pong (1,000 samples, p50); throughput is `iters` sends with `window` in flight, timed on the
client until the server reports that the last one arrived (about 4 GiB per size, at least 8
operations, at most 2,000), with dmx bench's window (1 GiB in flight, 2 to 64 operations). Host memory by default; `--mem cuda:0 --peer-mem cuda:1` moves PyTorch CUDA tensors
(C++: the same device buffers). Default settings (on one host: shm, and cuda_ipc for GPU memory).
Each implementation runs `--repeat` times, alternating; the median is reported. `--nccl-p2p` adds
torch.distributed send/recv between the two GPUs (NCCL) at the same sizes in the same run (issue 23,
run 5). Prints one JSON row per measurement, then a table. `--profile` then splits one operation of
each size up to 1 MiB into the binding's stages (finding the buffer's memory, the dmx call, the
future, the wait, letting go), on both sides, and times finding a tensor's memory by each road
(PyTorch's attributes, DLPack with its device switch).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

PING, PONG, DATA, DONE, CTRL = 11, 12, 10, 13, 1


def throughput_plan(size):
    """dmx bench's plan (tools/dmx/bench_sizes.cc throughput_iters, bench_client.cc auto_window)."""
    iters = max(8, min(2000, (4 << 30) // max(size, 1)))
    window = max(2, min(64, (1 << 30) // max(size, 1)))
    return iters, min(window, iters)


# ---- the Python side ------------------------------------------------------------------------

def alloc(mem, size, fill=None):
    """A buffer of `size` bytes in `mem` ("host" or "cuda:N"): NumPy, or a torch tensor on the GPU."""
    import numpy as np
    if mem == "host":
        if fill is None:
            return np.frombuffer(np.random.default_rng().bytes(size), np.uint8).copy()
        return np.full(size, fill, np.uint8)
    import torch
    if fill is None:
        return torch.randint(0, 256, (size,), dtype=torch.uint8, device=mem)
    return torch.full((size,), fill, dtype=torch.uint8, device=mem)


def same(a, b):
    if hasattr(a, "device") and hasattr(a, "cpu"):
        import torch
        return bool(torch.equal(a, b))
    import numpy as np
    return bool(np.array_equal(a, b))


def serve(address_out, mem):
    import dmx
    ctx = dmx.Context()
    lis = ctx.listen("tcp://127.0.0.1:0")
    print(lis.address, file=address_out, flush=True)
    ep = lis.accept(timeout=60)
    ctl = bytearray(256)
    while True:
        n = ep.recv(ctl, CTRL).wait(timeout=600)
        cmd = json.loads(ctl[:n])
        if cmd["op"] == "quit":
            break
        size, window = cmd["size"], cmd["window"]
        # Touched now, as dmx bench does: page faults are not transfer time.
        slots = [alloc(mem, size, 0x5A) for _ in range(window)]
        if mem != "host":
            import torch
            torch.cuda.synchronize()
        ep.send(b"ready", CTRL).wait(timeout=60)
        if cmd["op"] == "throughput":
            iters = cmd["iters"]
            futs = [ep.recv(slots[i], DATA) for i in range(min(window, iters))]
            for i in range(iters):
                futs[i % window].wait(timeout=300)
                if i + window < iters:
                    futs[i % window] = ep.recv(slots[i % window], DATA)
            ep.send(b"done", DONE).wait(timeout=60)
        else:  # latency: ping-pong
            buf = slots[0]
            if cmd.get("profile"):
                dmx._dmx._profile(True)
            for _ in range(cmd["samples"] + 1):
                ep.recv(buf, PING).wait(timeout=60)
                ep.send(buf, PONG).wait(timeout=60)
            if cmd.get("profile"):
                stages = dmx._dmx._profile_take()
                dmx._dmx._profile(False)
                ep.send(json.dumps(stages).encode(), CTRL).wait(timeout=60)
    ep.close()


def python_run(sizes, samples, mem, peer_mem):
    import dmx
    proc, address = start_server(peer_mem)
    try:
        ctx = dmx.Context()
        ep = ctx.connect(address)
        ready = bytearray(16)
        rows = []
        for size in sizes:
            iters, window = throughput_plan(size)
            src = alloc(mem, size)
            pong = alloc(mem, size, 0x5A)
            if mem != "host":
                import torch
                torch.cuda.synchronize()  # dmx does not wait on the producer's stream

            def plan(op, **kw):
                ep.send(json.dumps(dict(op=op, size=size, window=window, **kw)).encode(), CTRL).wait(timeout=60)
                ep.recv(ready, CTRL).wait(timeout=120)

            plan("throughput", iters=iters + 1)
            ep.send(src, DATA).wait(timeout=300)  # warm-up, untimed (as dmx bench does)
            done = bytearray(16)
            t0 = time.perf_counter()
            futs = [ep.send(src, DATA) for _ in range(min(window, iters))]
            for i in range(iters):
                futs[i % window].wait(timeout=300)
                if i + window < iters:
                    futs[i % window] = ep.send(src, DATA)
            ep.recv(done, DONE).wait(timeout=300)
            secs = time.perf_counter() - t0
            row = {"impl": "python", "mem": mem, "peer_mem": peer_mem, "size_bytes": size, "iters": iters, "window": window,
                   "gb_per_s": size * iters / secs / 1e9}
            if size <= (1 << 20):
                plan("latency", samples=samples)
                lat = []
                for j in range(samples + 1):  # the first is a warm-up
                    t = time.perf_counter()
                    back = ep.recv(pong, PONG)
                    ep.send(src, PING).wait(timeout=60)
                    back.wait(timeout=60)
                    if j:
                        lat.append((time.perf_counter() - t) / 2 * 1e6)
                lat.sort()
                row.update(lat_samples=samples, p50_us=lat[len(lat) // 2], p99_us=lat[int(0.99 * (len(lat) - 1))])
                if not same(pong, src):
                    raise SystemExit("python: the echoed bytes differ")
            rows.append(row)
        ep.send(json.dumps({"op": "quit"}).encode(), CTRL).wait(timeout=60)
        proc.wait(timeout=60)
        ep.close()
        return rows
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_server(peer_mem):
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--peer-mem", peer_mem], stdout=subprocess.PIPE,
                            text=True)
    return proc, proc.stdout.readline().strip()


STAGES = ("acquire", "post", "future", "wait", "release")


def profile_run(sizes, samples, mem, peer_mem):
    """--profile: where one operation's time goes in the binding, stage by stage, on both sides of
    the ping-pong (dmx._dmx._profile; python/src/profile.h), and what finding a buffer's memory
    costs by each road (torch attributes, DLPack) for the same tensor."""
    import dmx
    from dmx import _dmx
    proc, address = start_server(peer_mem)
    rows = []
    try:
        ctx = dmx.Context()
        ep = ctx.connect(address)
        ready, answer = bytearray(16), bytearray(1 << 14)
        for size in sizes:
            if size > (1 << 20):
                continue
            src = alloc(mem, size)
            pong = alloc(mem, size, 0x5A)
            other = None  # a tensor of the peer's device, when that is another GPU than ours
            if mem != "host":
                import torch
                if peer_mem.startswith("cuda") and torch.device(peer_mem) != torch.device(mem):
                    other = alloc(peer_mem, size, 0x5A)
                torch.cuda.synchronize()
            n = 20000
            acquire = {"attributes": _dmx._time_acquire(src, False, n),
                       "dlpack": _dmx._time_acquire(src, False, n, torch_attributes=False)}
            if other is not None:
                acquire["attributes_other_device"] = _dmx._time_acquire(other, False, n)
                acquire["dlpack_other_device"] = _dmx._time_acquire(other, False, n, torch_attributes=False)
            ep.send(json.dumps(dict(op="latency", size=size, window=2, samples=samples, profile=True)).encode(),
                    CTRL).wait(timeout=60)
            ep.recv(ready, CTRL).wait(timeout=120)
            calls = {"recv_call": 0.0, "send_call": 0.0, "send_wait": 0.0, "recv_wait": 0.0}
            lat = []
            _dmx._profile(True)
            for j in range(samples + 1):  # the first is a warm-up
                t0 = time.perf_counter()
                back = ep.recv(pong, PONG)
                t1 = time.perf_counter()
                f = ep.send(src, PING)
                t2 = time.perf_counter()
                f.wait(timeout=60)
                t3 = time.perf_counter()
                back.wait(timeout=60)
                t4 = time.perf_counter()
                if j:
                    calls["recv_call"] += t1 - t0
                    calls["send_call"] += t2 - t1
                    calls["send_wait"] += t3 - t2
                    calls["recv_wait"] += t4 - t3
                    lat.append((t4 - t0) / 2 * 1e6)
            client = _dmx._profile_take()
            _dmx._profile(False)
            got = ep.recv(answer, CTRL).wait(timeout=60)
            server = json.loads(answer[:got])
            lat.sort()
            per_op = lambda st: {k: (secs / c * 1e6 if c else None) for k, (c, secs) in st.items()}  # noqa: E731
            cl, sv = per_op(client), per_op(server)
            posts = sum(cl[k] or 0 for k in ("acquire", "post", "future"))
            row = {"kind": "profile", "mem": mem, "peer_mem": peer_mem, "size_bytes": size, "samples": samples,
                   "p50_us": lat[len(lat) // 2], "client_us": cl, "server_us": sv,
                   "python_us": {k: v / samples * 1e6 for k, v in calls.items()},
                   "acquire_alone_us": {k: v * 1e6 for k, v in acquire.items()}}
            # What Python's view of a post adds to the stages timed inside: pybind11's dispatch and
            # argument conversion, the Future's Python object.
            row["binding_us"] = (row["python_us"]["recv_call"] + row["python_us"]["send_call"]) / 2 - posts
            rows.append(row)
            print(json.dumps(row))
            fmt = lambda v: f"{v:8.2f}" if v is not None else "       -"  # noqa: E731
            print(f"# profile: {size} B {mem} -> {peer_mem}, {samples} ping-pongs (half round trip p50 "
                  f"{row['p50_us']:.2f} us); microseconds per operation")
            print(f"#   {'stage':<28} {'client':>8} {'server':>8}")
            for k in STAGES:
                print(f"#   {k:<28} {fmt(cl.get(k))} {fmt(sv.get(k))}")
            print(f"#   {'binding (pybind11, objects)':<28} {fmt(row['binding_us'])}")
            for k, v in row["python_us"].items():
                print(f"#   {'python: ' + k:<28} {fmt(v)}")
            for k, v in row["acquire_alone_us"].items():
                print(f"#   {'acquire alone: ' + k:<28} {fmt(v)}")
            if mem == "host":
                print("#   (NumPy: both roads are the buffer protocol)")
        ep.send(json.dumps({"op": "quit"}).encode(), CTRL).wait(timeout=60)
        proc.wait(timeout=60)
        ep.close()
        return rows
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- the C++ side: dmx bench ----------------------------------------------------------------

def cpp_run(dmx_bin, sizes, mem, peer_mem):
    server = subprocess.Popen([dmx_bin, "bench", "--listen", "tcp://127.0.0.1:0", "--mem", peer_mem],
                              stderr=subprocess.PIPE, text=True)
    try:
        address = None
        for line in server.stderr:
            if "serving on " in line:
                address = line.split("serving on ")[1].split()[0]
                break
        if not address:
            raise SystemExit("dmx bench --listen printed no address")
        out = subprocess.run([dmx_bin, "bench", "--connect", address, "--mem", mem, "--peer-mem", peer_mem,
                              "--sizes", ",".join(str(s) for s in sizes), "--json"],
                             capture_output=True, text=True, timeout=600, check=True).stdout
        rows = []
        for line in out.splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                if j.get("error"):
                    raise SystemExit("dmx bench: " + j["error"])
                row = {"impl": "cpp", "mem": mem, "peer_mem": peer_mem, "size_bytes": j["size_bytes"], "iters": j["iters"], "window": j["window"],
                       "gb_per_s": j["gb_per_s"], "transport": j["transport"]}
                if j["size_bytes"] <= (1 << 20):
                    row.update(lat_samples=j["lat_samples"], p50_us=j["p50_us"], p99_us=j["p99_us"])
                rows.append(row)
        return rows
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dmx", help="the dmx CLI (default: build/tools/dmx/dmx, else dmx on PATH)")
    ap.add_argument("--sizes", default="8,268435456", help="bytes, comma-separated (default 8 and 256 MiB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--mem", default="host", help="the sender's memory: host or cuda:N (torch tensors)")
    ap.add_argument("--peer-mem", default="host", help="the receiver's memory: host or cuda:N")
    ap.add_argument("--nccl-p2p", action="store_true",
                    help="also torch.distributed send/recv (NCCL defaults) cuda:0 -> cuda:1, same sizes "
                         "(bench/ref/nccl_socket.py --p2p)")
    ap.add_argument("--profile", action="store_true",
                    help="after the comparison, the time of each stage of one operation (sizes up to 1 MiB) on both "
                         "sides, and of each road to a buffer's memory; --repeat 0 runs the profile alone")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(sys.stdout, a.peer_mem)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dmx_bin = a.dmx or next((p for p in [os.path.join(root, "build/tools/dmx/dmx"), shutil.which("dmx")]
                             if p and os.path.exists(p)), None)
    if not dmx_bin:
        raise SystemExit("no dmx CLI: build it (cmake --build build --target dmx_cli) or pass --dmx")
    sizes = [int(s) for s in a.sizes.split(",")]
    runs = {"cpp": [], "python": []}
    for _ in range(a.repeat):
        runs["cpp"].append(cpp_run(dmx_bin, sizes, a.mem, a.peer_mem))
        runs["python"].append(python_run(sizes, a.samples, a.mem, a.peer_mem))
    nccl = {}
    if a.nccl_p2p:
        ref = subprocess.run([sys.executable, os.path.join(root, "bench", "ref", "nccl_socket.py"), "--p2p", "--sizes",
                              ",".join(str(s) for s in sizes)], capture_output=True, text=True, timeout=900)
        for line in ref.stdout.splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                print(json.dumps(dict(j, kind="nccl")))
                if j.get("metric") == "half_rtt":
                    nccl["half_rtt"] = j.get("lat_p50_us")
                elif "gb_per_s" in j:
                    nccl[j["size_bytes"]] = j["gb_per_s"]
    for impl in ("cpp", "python"):
        for run in runs[impl]:
            for row in run:
                print(json.dumps(dict(row, kind="run")))
    if a.profile:
        profile_run(sizes, a.samples, a.mem, a.peer_mem)
    if a.repeat < 1:
        return 0

    def median(impl, i, key):
        vals = [run[i][key] for run in runs[impl] if key in run[i]]
        return statistics.median(vals) if vals else None

    print(f"# {a.mem} -> {a.peer_mem}; median of {a.repeat} runs each; latency: half round trip p50 (us); "
          f"throughput: GB/s (1e9 B/s); NCCL: torch.distributed send/recv, its 8-byte half round trip "
          f"{nccl.get('half_rtt', '-')} us")
    print(f"# {'size':>10} {'C++ p50':>9} {'Py p50':>9} {'diff us':>8} {'C++ GB/s':>9} {'Py GB/s':>9} {'Py/C++':>7} "
          f"{'NCCL GB/s':>9}")
    for i, size in enumerate(sizes):
        cp, pp = median("cpp", i, "p50_us"), median("python", i, "p50_us")
        cg, pg = median("cpp", i, "gb_per_s"), median("python", i, "gb_per_s")
        summary = {"kind": "summary", "size_bytes": size, "cpp_p50_us": cp, "python_p50_us": pp,
                   "p50_diff_us": (pp - cp) if cp is not None and pp is not None else None,
                   "cpp_gb_per_s": cg, "python_gb_per_s": pg, "throughput_ratio": pg / cg if cg else None,
                   "mem": a.mem, "peer_mem": a.peer_mem, "nccl_p2p_gb_per_s": nccl.get(size)}
        print(json.dumps(summary))
        fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
        print(f"# {size:>10} {fmt(cp, '9.2f')} {fmt(pp, '9.2f')} {fmt(summary['p50_diff_us'], '8.2f')} "
              f"{fmt(cg, '9.2f')} {fmt(pg, '9.2f')} {fmt(summary['throughput_ratio'], '7.3f')} "
              f"{fmt(summary['nccl_p2p_gb_per_s'], '9.2f')}")


if __name__ == "__main__":
    sys.exit(main())
