#!/usr/bin/env python3
"""Runs dmx bench and a reference side by side in one run and prints a ratio table.

  bench/compare.py SCENARIO [options]

Scenarios
  host-loopback  dmx bench --loopback --mem host --streams N --transport tcp
                 vs bench/ref/iperf3.sh N (kernel TCP against TCP: in one process auto
                 would pick shm). target: dmx >= 80 % of iperf3 with N streams, at the
                 largest size; dmx really used transport tcp.
                 --two-process runs dmx as --listen/--connect on 127.0.0.1 instead.
  host-netns     the same between two network namespaces (scripts/netns.sh; root only),
                 dmx --listen in namespace B, --connect from A (--transport tcp), iperf3
                 across the veth.
  gpu-staged     dmx two processes --mem cuda:0 --peer-mem cuda:1 --transport tcp
                 vs NCCL socket (default and tuned, bench/ref/nccl_socket.py) and vs dmx
                 host->host (two processes, --transport tcp) at the same stream count.
                 targets at the large size (256M): >= 3x nccl-socket, >= 22 GB/s,
                 >= 85 % of dmx host->host; 1M >= 50 % of the large-size rate;
                 8-byte half round trip <= 20 us; dmx really used transport tcp.
  same-host      dmx two processes --mem cuda:0 --peer-mem cuda:1 --transport auto
                 vs cudaMemcpyPeer / torch copy (bench/ref/memcpy_peer.py) and NCCL p2p;
                 dmx must have used cuda_ipc (a fallback is judged FAIL).
                 No target unless --same-host-target R (dmx >= R x best peer copy at --large)
                 and/or --nccl-p2p-target R (dmx >= R x NCCL p2p at --small).
  shm-host       dmx two processes --mem host --peer-mem host --transport auto (shm) vs
                 single-thread memcpy (bench/ref/memcpy_host.py); dmx must have used shm
                 (a fallback is judged FAIL). No other target unless
                 --shm-target R (dmx >= R x memcpy at --large).

dmx is --dmx PATH, else $DMX_BIN, else build/tools/dmx/dmx under the repository root.
Output: a table on stdout, and with --json FILE everything (commands, raw lines, targets).
Exit: 0 all targets met (or SKIPPED: no GPUs / not root, unless --fail-on-skip);
1 a target missed; 2 dmx or a reference could not run (message says why); 3 skipped with
--fail-on-skip. Rates are decimal GB/s (1e9 bytes/s); sizes are binary (1M = 1 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
import refutil  # noqa: E402

refutil.apply_safety_env()

REQUIRED_DMX_KEYS = ("size_bytes", "iters", "gb_per_s", "msg_per_s", "p50_us", "p99_us", "p999_us",
                     "transport", "reason", "cpu_pct", "mem", "peer_mem", "streams", "verified")
SCENARIOS = ("host-loopback", "host-netns", "gpu-staged", "same-host", "shm-host")


class Failure(Exception):
    """dmx or a reference could not produce numbers (exit 2)."""


class Skip(Exception):
    """The scenario cannot run on this machine (exit 0, or 3 with --fail-on-skip)."""


# ---------------------------------------------------------------------------------------
# running things


class Runner:
    def __init__(self, args):
        self.args = args
        self.commands = []  # every command line run, in order, for the record

    def log(self, msg):
        print(f"compare: {msg}", file=sys.stderr, flush=True)

    def run(self, cmd, what, timeout=None, check=True):
        """Runs cmd; returns (rc, stdout, stderr). check: non-zero exit raises Failure."""
        line = " ".join(shlex.quote(c) for c in cmd)
        self.commands.append(line)
        self.log(f"run: {line}")
        if self.args.dry_run:
            return 0, "", ""
        try:
            p = subprocess.run(cmd, capture_output=True, text=True,
                               timeout=timeout or self.args.timeout)
        except FileNotFoundError as e:
            raise Failure(f"{what}: cannot run {cmd[0]}: {e}") from None
        except subprocess.TimeoutExpired as e:
            raise Failure(f"{what}: timed out after {e.timeout}s: {line}") from None
        if check and p.returncode != 0:
            raise Failure(f"{what} failed (exit {p.returncode}): {line}\n"
                          f"{_tail(p.stderr) or _tail(p.stdout) or '(no output)'}")
        return p.returncode, p.stdout, p.stderr


def _tail(text, n=1500):
    text = (text or "").strip()
    return text[-n:]


def _listening(port, ns):
    """True when some socket listens on TCP port in namespace ns (None: ours)."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            if ns:
                text = subprocess.run(["ip", "netns", "exec", ns, "cat", name], capture_output=True,
                                      text=True, timeout=5).stdout
            else:
                with open(name) as fh:
                    text = fh.read()
        except (OSError, subprocess.SubprocessError):
            continue
        for row in text.splitlines()[1:]:
            f = row.split()
            if len(f) > 3 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


# ---------------------------------------------------------------------------------------
# dmx


def dmx_path(args):
    path = args.dmx or os.environ.get("DMX_BIN") or os.path.join(ROOT, "build", "tools", "dmx", "dmx")
    if args.dry_run:
        return path
    if not os.path.isfile(path):
        raise Failure(f"dmx not found at {path}: build it (cmake --build build -j2 --target dmx_cli) "
                      f"or pass --dmx PATH / set DMX_BIN")
    if not os.access(path, os.X_OK):
        raise Failure(f"dmx at {path} is not executable")
    return path


def parse_dmx(stdout, what):
    rows = [r for r in refutil.json_lines(stdout) if "size_bytes" in r]
    if not rows:
        raise Failure(f"{what}: dmx bench printed no JSON result lines:\n{_tail(stdout) or '(nothing)'}")
    for r in rows:
        missing = [k for k in REQUIRED_DMX_KEYS if k not in r]
        if missing:
            r.setdefault("_warnings", []).append(f"missing keys: {', '.join(missing)}")
    return rows


def bench_args(args, mem, peer_mem, streams, sizes, transport):
    a = ["--mem", mem, "--streams", str(streams), "--sizes", sizes, "--json"]
    if peer_mem:
        a += ["--peer-mem", peer_mem]
    if transport:
        a += ["--transport", transport]
    if args.op:
        a += ["--op", args.op]
    if args.iters:
        a += ["--iters", str(args.iters)]
    if args.verify:
        a += ["--verify"]
    return a


def dmx_loopback(runner, dmx, args, mem, streams, sizes, transport=None):
    cmd = [dmx, "bench", "--loopback"] + bench_args(args, mem, None, streams, sizes, transport)
    _, out, _ = runner.run(cmd, f"dmx bench --loopback (streams {streams})")
    return [] if args.dry_run else parse_dmx(out, "dmx bench --loopback")


def dmx_pair(runner, dmx, args, mem, peer_mem, streams, sizes, transport,
             host="127.0.0.1", ns_server=None, ns_client=None):
    """dmx bench --listen in one process (namespace), --connect from another."""
    port = refutil.free_port("127.0.0.1") if not ns_server else 7000 + os.getpid() % 1000
    addr = f"tcp://{host}:{port}"
    pre_s = ["ip", "netns", "exec", ns_server] if ns_server else []
    pre_c = ["ip", "netns", "exec", ns_client] if ns_client else []
    lcmd = pre_s + [dmx, "bench", "--listen", addr] + list(args.listen_arg or [])
    ccmd = pre_c + [dmx, "bench", "--connect", addr] + bench_args(args, mem, peer_mem, streams,
                                                                  sizes, transport)
    runner.commands.append(" ".join(shlex.quote(c) for c in lcmd) + " &")
    runner.log(f"run: {' '.join(shlex.quote(c) for c in lcmd)} &")
    if args.dry_run:
        runner.run(ccmd, "dmx bench --connect")
        return []
    listener = subprocess.Popen(lcmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while not _listening(port, ns_server):
            if listener.poll() is not None:
                _, err = listener.communicate()
                raise Failure(f"dmx bench --listen {addr} exited {listener.returncode} before "
                              f"listening:\n{_tail(err) or '(no output)'}")
            if time.monotonic() > deadline:
                raise Failure(f"dmx bench --listen {addr} did not listen within 15 s")
            time.sleep(0.1)
        _, out, _ = runner.run(ccmd, f"dmx bench --connect {addr} (mem {mem}->{peer_mem}, "
                                     f"streams {streams})")
        return parse_dmx(out, "dmx bench --connect")
    finally:
        _stop(listener)


def _stop(proc):
    """Stops a listener we started: SIGINT (its documented stop), then TERM, then KILL."""
    for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 3), (signal.SIGKILL, 3)):
        if proc.poll() is not None:
            break
        try:
            proc.send_signal(sig)
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
    try:
        proc.communicate(timeout=1)
    except (subprocess.TimeoutExpired, ValueError):
        pass


# ---------------------------------------------------------------------------------------
# references


def run_ref(runner, cmd, what, timeout=None):
    """Runs a reference script; returns its JSON lines. 'skipped' lines raise Skip."""
    rc, out, err = runner.run(cmd, what, timeout=timeout, check=False)
    if runner.args.dry_run:
        return []
    lines = refutil.json_lines(out)
    for w in sorted({l["warning"] for l in lines if l.get("warning")}):
        runner.log(f"{what}: warning: {w}")
    skipped = [l for l in lines if l.get("skipped")]
    if skipped and all(l.get("skipped") for l in lines):
        raise Skip(f"{what}: {skipped[0]['skipped']}")
    errors = [l for l in lines if l.get("error")]
    if rc != 0 or errors:
        msg = "; ".join(str(l["error"]) for l in errors) or _tail(err) or _tail(out) or "(no output)"
        raise Failure(f"{what} failed (exit {rc}): {msg}")
    return lines


def iperf3_ref(runner, args, streams, netns=None):
    cmd = [os.path.join(HERE, "ref", "iperf3.sh"), "--streams", str(streams), "--time",
           str(args.time), "--mode", args.iperf_mode]
    if netns:
        cmd += ["--netns", netns]
    lines = run_ref(runner, cmd, f"iperf3.sh (streams {streams})",
                    timeout=args.time * 3 + 60)
    return lines[0] if lines else {}


# ---------------------------------------------------------------------------------------
# tables and targets


def by_size(rows, **match):
    out = {}
    for r in rows:
        if r.get("metric") or r.get("skipped") or r.get("error"):
            continue
        if all(r.get(k) == v for k, v in match.items()):
            out[int(r["size_bytes"])] = r
    return out


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return a / b


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def target(name, value, op, bound, note=""):
    """One judged target: value op bound, where op is '>=' or '<='."""
    if value is None:
        verdict = "N/A"
    elif op == ">=":
        verdict = "PASS" if value >= bound else "FAIL"
    else:
        verdict = "PASS" if value <= bound else "FAIL"
    return {"target": name, "value": value, "op": op, "bound": bound, "verdict": verdict, "note": note}


def transport_target(n, rows, want):
    """Judges that every dmx row used `want` (alone or within e.g. shm+cuda_ipc): a comparison
    with a reference of another kind of path means nothing, and a fallback must not pass."""
    used = sorted({str(r.get("transport")) for r in rows})
    ok = bool(used) and all(want in u.split("+") for u in used)
    return {"target": f"x{n} dmx transport is {want}", "value": ",".join(used), "op": "==",
            "bound": want, "verdict": "PASS" if ok else "FAIL", "note": ""}


def print_table(headers, rows):
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def print_targets(targets):
    if not targets:
        return
    print()
    for t in targets:
        val = fmt(t["value"], ".3g") if isinstance(t["value"], float) else str(t["value"])
        note = f"  ({t['note']})" if t["note"] else ""
        print(f"  {t['verdict']:<5} {t['target']}: {val} {t['op']} {t['bound']}{note}")


# ---------------------------------------------------------------------------------------
# scenarios


def scenario_host(runner, args, netns=False):
    # iperf3 is kernel TCP: dmx must use TCP too (on one host auto would pick shm).
    if args.transport not in (None, "tcp"):
        raise Failure(f"{args.scenario} compares with iperf3 (TCP): dmx runs --transport tcp, "
                      f"not {args.transport}")
    dmx = dmx_path(args)
    sizes = args.sizes or "1M,256M"
    size_list = refutil.parse_sizes(sizes)
    judge = refutil.parse_size(args.judge_size) if args.judge_size else max(size_list)
    suffix = None
    if netns:
        if os.geteuid() != 0:
            raise Skip("host-netns needs root (ip netns)")
        suffix = f"cmp{os.getpid()}"
        runner.run([os.path.join(ROOT, "scripts", "netns.sh"), "up", suffix] +
                   (["--mtu", str(args.netns_mtu)] if args.netns_mtu else []), "netns.sh up")
    result = {"dmx": [], "refs": [], "table": [], "targets": []}
    try:
        for n in refutil.parse_int_list(args.streams or "1,2,4,8"):
            if netns:
                ns_a = f"dmx-test-{suffix}-a"
                ns_b = f"dmx-test-{suffix}-b"
                rows = dmx_pair(runner, dmx, args, "host", "host", n, sizes, "tcp",
                                host="10.199.0.2", ns_server=ns_b, ns_client=ns_a)
            elif args.two_process:
                rows = dmx_pair(runner, dmx, args, "host", "host", n, sizes, "tcp")
            else:
                rows = dmx_loopback(runner, dmx, args, "host", n, sizes, "tcp")
            ref = iperf3_ref(runner, args, n, netns=suffix)
            result["dmx"] += rows
            if ref:
                result["refs"].append(ref)
            for size, r in sorted(by_size(rows).items()):
                ref_rate = ref.get("gb_per_s")
                rr = ratio(r.get("gb_per_s"), ref_rate)
                row = {"size_bytes": size, "streams": n, "dmx_gb_per_s": r.get("gb_per_s"),
                       "iperf3_gb_per_s": ref_rate, "ratio": rr, "dmx_cpu_pct": r.get("cpu_pct"),
                       "iperf3_threads": ref.get("threads"), "transport": r.get("transport"),
                       "verified": r.get("verified")}
                result["table"].append(row)
                if size == judge:
                    result["targets"].append(target(
                        f"{refutil.format_size(size)} x{n} streams: dmx / iperf3 with {n} streams", rr, ">=",
                        args.host_target, f"iperf3 {ref.get('mode')} mode, {ref.get('threads')} thread(s)"))
            if not args.dry_run:
                result["targets"].append(transport_target(n, rows, "tcp"))
    finally:
        if suffix:
            runner.run([os.path.join(ROOT, "scripts", "netns.sh"), "down", suffix], "netns.sh down",
                       check=False)
    if args.dry_run:
        return result
    print(f"\n{'host-netns (veth between two namespaces)' if netns else 'host-loopback'}: "
          f"dmx vs iperf3 ({result['refs'][0].get('iperf3_version') if result['refs'] else '?'}, "
          f"{'multi' if result['refs'] and result['refs'][0].get('multithreaded') else 'single'}-threaded)")
    print_table(["size", "streams", "dmx GB/s", "iperf3 GB/s", "ratio", "iperf3 thr", "dmx cpu%",
                 "transport", "verified"],
                [[refutil.format_size(t["size_bytes"]), t["streams"], fmt(t["dmx_gb_per_s"]),
                  fmt(t["iperf3_gb_per_s"]), fmt(t["ratio"]), t["iperf3_threads"],
                  fmt(t["dmx_cpu_pct"], ".0f"), t["transport"], t["verified"]] for t in result["table"]])
    print_targets(result["targets"])
    return result


def nccl_ref(runner, args, modes, sizes):
    cmd = [sys.executable, os.path.join(HERE, "ref", "nccl_socket.py"), "--sizes", sizes] + \
          [f"--{m}" for m in modes]
    if args.keep_logs:
        cmd += ["--keep-logs", args.keep_logs]
    return run_ref(runner, cmd, "nccl_socket.py " + " ".join(f"--{m}" for m in modes),
                   timeout=args.timeout * len(modes))


def gpu_check(runner, args):
    """Raises Skip unless torch sees two GPUs with NCCL (asks nccl_socket.py --check)."""
    run_ref(runner, [sys.executable, os.path.join(HERE, "ref", "nccl_socket.py"), "--check"],
            "GPU check (nccl_socket.py --check)", timeout=120)


def half_rtt(row):
    """(value, field) of the 8-byte half round trip in a dmx row."""
    if row is None:
        return None, None
    if row.get("half_rtt_us") is not None:
        return row["half_rtt_us"], "half_rtt_us"
    return row.get("p50_us"), "p50_us"


def scenario_gpu_staged(runner, args):
    sizes = args.sizes or "8,1M,256M"
    large = refutil.parse_size(args.large)
    small = refutil.parse_size(args.small)
    gpu_check(runner, args)  # skips without 2 GPUs, before anything long runs
    dmx = dmx_path(args)
    refs = nccl_ref(runner, args, ["socket", "socket-tuned"], sizes)
    nccl = by_size(refs, ref="nccl-socket")
    tuned = by_size(refs, ref="nccl-socket-tuned")
    result = {"dmx": [], "refs": refs, "table": [], "targets": []}
    for n in refutil.parse_int_list(args.streams or "4"):
        gpu = dmx_pair(runner, dmx, args, "cuda:0", "cuda:1", n, sizes, "tcp")
        host = dmx_pair(runner, dmx, args, "host", "host", n, sizes, "tcp")
        result["dmx"] += gpu + host
        if args.dry_run:
            continue
        g, h = by_size(gpu), by_size(host)
        for size in sorted(g):
            rate = g[size].get("gb_per_s")
            result["table"].append({
                "size_bytes": size, "streams": n, "dmx_gpu_gb_per_s": rate,
                "dmx_host_gb_per_s": h.get(size, {}).get("gb_per_s"),
                "nccl_socket_gb_per_s": nccl.get(size, {}).get("gb_per_s"),
                "nccl_tuned_gb_per_s": tuned.get(size, {}).get("gb_per_s"),
                "x_nccl": ratio(rate, nccl.get(size, {}).get("gb_per_s")),
                "x_tuned": ratio(rate, tuned.get(size, {}).get("gb_per_s")),
                "of_host": ratio(rate, h.get(size, {}).get("gb_per_s")),
                "p50_us": g[size].get("p50_us"),
                "nccl_p50_us": nccl.get(size, {}).get("lat_p50_us"),
                "transport": g[size].get("transport"), "verified": g[size].get("verified")})
        gl = g.get(large, {}).get("gb_per_s")
        L = refutil.format_size(large)
        t = result["targets"]
        t.append(target(f"x{n} {L}: dmx cuda->cuda / nccl-socket", ratio(gl, nccl.get(large, {}).get("gb_per_s")),
                        ">=", 3.0, "NCCL default socket settings"))
        t.append(target(f"x{n} {L}: dmx cuda->cuda GB/s", gl, ">=", 22.0))
        t.append(target(f"x{n} {L}: dmx cuda->cuda / dmx host->host", ratio(gl, h.get(large, {}).get("gb_per_s")),
                        ">=", 0.85))
        t.append(target(f"x{n} {refutil.format_size(small)} rate / {L} rate",
                        ratio(g.get(small, {}).get("gb_per_s"), gl), ">=", 0.5))
        v, field = half_rtt(g.get(8))
        t.append(target(f"x{n} 8 B half round trip (us)", v, "<=", 20.0,
                        f"dmx field {field}" if field else "no 8-byte row"))
        t.append(transport_target(n, gpu, "tcp"))
        t.append(transport_target(n, host, "tcp"))
    if args.dry_run:
        return result
    hr = [r for r in refs if r.get("metric") == "half_rtt"]
    print("\ngpu-staged: dmx cuda:0 -> cuda:1 over TCP vs NCCL socket and dmx host->host")
    print_table(["size", "streams", "dmx gpu", "dmx host", "nccl sock", "nccl tuned", "x nccl",
                 "x tuned", "of host", "dmx p50us", "nccl p50us", "transport", "verified"],
                [[refutil.format_size(r["size_bytes"]), r["streams"], fmt(r["dmx_gpu_gb_per_s"]),
                  fmt(r["dmx_host_gb_per_s"]), fmt(r["nccl_socket_gb_per_s"]),
                  fmt(r["nccl_tuned_gb_per_s"]), fmt(r["x_nccl"]), fmt(r["x_tuned"]),
                  fmt(r["of_host"]), fmt(r["p50_us"], ".1f"), fmt(r["nccl_p50_us"], ".1f"),
                  r["transport"], r["verified"]] for r in result["table"]])
    for r in hr:
        print(f"  {r['ref']}: 8 B half round trip p50 {fmt(r.get('lat_p50_us'), '.1f')} us, "
              f"back-to-back {fmt(r.get('half_rtt_burst_us'), '.1f')} us; NCCL path {r.get('nccl_path')}")
    print("  (GB/s columns are decimal GB/s; 'x nccl' = dmx gpu / nccl socket)")
    print_targets(result["targets"])
    return result


def dmx_same_host_runs(runner, dmx, args, mem, peer_mem, sizes, result, want):
    """dmx two processes at each stream count (--transport, default auto); collects the rows in
    result["dmx"], judges that they used `want` (the path the reference stands for; with
    --transport X, X) and yields (streams, rows by size) unless this is a dry run."""
    transport = args.transport or "auto"
    for n in refutil.parse_int_list(args.streams or "1"):
        rows = dmx_pair(runner, dmx, args, mem, peer_mem, n, sizes, transport)
        result["dmx"] += rows
        if not args.dry_run:
            result["targets"].append(transport_target(n, rows, want if transport == "auto" else transport))
            yield n, by_size(rows)


def scenario_same_host(runner, args):
    sizes = args.sizes or "8,1M,256M"
    large = refutil.parse_size(args.large)
    big_sizes = ",".join(refutil.format_size(s) for s in refutil.parse_sizes(sizes) if s >= 4096) or "1M"
    gpu_check(runner, args)
    dmx = dmx_path(args)
    peer = run_ref(runner, [sys.executable, os.path.join(HERE, "ref", "memcpy_peer.py"),
                            "--sizes", big_sizes, "--no-host"], "memcpy_peer.py",
                   timeout=args.timeout)
    p2p = nccl_ref(runner, args, ["p2p"], sizes)
    best = {}
    for r in peer:
        if r.get("ref") == "memcpy-peer" and r.get("src") == "cuda:0" and r.get("gb_per_s"):
            s = int(r["size_bytes"])
            if s not in best or r["gb_per_s"] > best[s]["gb_per_s"]:
                best[s] = r
    nccl = by_size(p2p, ref="nccl-p2p")
    result = {"dmx": [], "refs": peer + p2p, "table": [], "targets": []}
    for n, g in dmx_same_host_runs(runner, dmx, args, "cuda:0", "cuda:1", sizes, result, "cuda_ipc"):
        for size in sorted(g):
            rate = g[size].get("gb_per_s")
            b = best.get(size, {})
            result["table"].append({
                "size_bytes": size, "streams": n, "dmx_gb_per_s": rate,
                "memcpy_peer_gb_per_s": b.get("gb_per_s"), "memcpy_method": b.get("method"),
                "nccl_p2p_gb_per_s": nccl.get(size, {}).get("gb_per_s"),
                "of_memcpy": ratio(rate, b.get("gb_per_s")),
                "of_nccl": ratio(rate, nccl.get(size, {}).get("gb_per_s")),
                "transport": g[size].get("transport"), "verified": g[size].get("verified")})
        if args.same_host_target:
            result["targets"].append(target(
                f"x{n} {refutil.format_size(large)}: dmx / best peer copy",
                ratio(g.get(large, {}).get("gb_per_s"), best.get(large, {}).get("gb_per_s")),
                ">=", args.same_host_target))
        if args.nccl_p2p_target:
            small = refutil.parse_size(args.small)
            result["targets"].append(target(
                f"x{n} {refutil.format_size(small)}: dmx / NCCL p2p",
                ratio(g.get(small, {}).get("gb_per_s"), nccl.get(small, {}).get("gb_per_s")),
                ">=", args.nccl_p2p_target))
    if args.dry_run:
        return result
    print("\nsame-host: dmx cuda:0 -> cuda:1 vs peer copy and NCCL p2p")
    print_table(["size", "streams", "dmx GB/s", "peer copy", "method", "nccl p2p", "of copy",
                 "of nccl", "transport", "verified"],
                [[refutil.format_size(r["size_bytes"]), r["streams"], fmt(r["dmx_gb_per_s"]),
                  fmt(r["memcpy_peer_gb_per_s"]), r["memcpy_method"] or "-",
                  fmt(r["nccl_p2p_gb_per_s"]), fmt(r["of_memcpy"]), fmt(r["of_nccl"]),
                  r["transport"], r["verified"]] for r in result["table"]])
    if not (args.same_host_target or args.nccl_p2p_target):
        print("  (no rate target: pass --same-host-target R to judge dmx against the best peer copy)")
    print_targets(result["targets"])
    return result


def scenario_shm_host(runner, args):
    sizes = args.sizes or "1M,256M"
    large = refutil.parse_size(args.large)
    dmx = dmx_path(args)
    ref = run_ref(runner, [sys.executable, os.path.join(HERE, "ref", "memcpy_host.py"), "--sizes", sizes],
                  "memcpy_host.py", timeout=args.timeout)
    mc = by_size(ref, ref="memcpy-host")
    result = {"dmx": [], "refs": ref, "table": [], "targets": []}
    for n, g in dmx_same_host_runs(runner, dmx, args, "host", "host", sizes, result, "shm"):
        for size in sorted(g):
            rate = g[size].get("gb_per_s")
            result["table"].append({
                "size_bytes": size, "streams": n, "dmx_gb_per_s": rate,
                "memcpy_gb_per_s": mc.get(size, {}).get("gb_per_s"),
                "of_memcpy": ratio(rate, mc.get(size, {}).get("gb_per_s")),
                "p50_us": g[size].get("p50_us"),
                "transport": g[size].get("transport"), "verified": g[size].get("verified")})
        if args.shm_target:
            result["targets"].append(target(
                f"x{n} {refutil.format_size(large)}: dmx / single-thread memcpy",
                ratio(g.get(large, {}).get("gb_per_s"), mc.get(large, {}).get("gb_per_s")),
                ">=", args.shm_target))
    if args.dry_run:
        return result
    print("\nshm-host: dmx host -> host, two processes, vs single-thread memcpy")
    print_table(["size", "streams", "dmx GB/s", "memcpy", "of memcpy", "dmx p50us", "transport", "verified"],
                [[refutil.format_size(r["size_bytes"]), r["streams"], fmt(r["dmx_gb_per_s"]),
                  fmt(r["memcpy_gb_per_s"]), fmt(r["of_memcpy"]), fmt(r["p50_us"], ".1f"),
                  r["transport"], r["verified"]] for r in result["table"]])
    print_targets(result["targets"])
    return result


# ---------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__[__doc__.index("Scenarios"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=SCENARIOS)
    p.add_argument("--dmx", help="path to dmx (default $DMX_BIN or build/tools/dmx/dmx)")
    p.add_argument("--streams", help="stream counts, e.g. 1,2,4,8 (per scenario default)")
    p.add_argument("--sizes", help="sizes for dmx and the references (per scenario default)")
    p.add_argument("--iters", type=int, help="passed to dmx bench --iters")
    p.add_argument("--op", help="passed to dmx bench --op (send|write|read)")
    p.add_argument("--transport", help="dmx --transport for same-host and shm-host (default auto); "
                   "host scenarios always run tcp, gpu-staged too")
    p.add_argument("--verify", action="store_true", help="pass --verify to dmx bench")
    p.add_argument("--two-process", action="store_true",
                   help="host-loopback: dmx --listen/--connect instead of --loopback")
    p.add_argument("--listen-arg", action="append", metavar="ARG",
                   help="extra argument for the dmx --listen side (repeatable)")
    p.add_argument("--netns-mtu", type=int, help="host-netns: veth MTU (default 1500)")
    p.add_argument("--time", type=int, default=5, help="iperf3 seconds per stream count")
    p.add_argument("--iperf-mode", default="auto", choices=("auto", "parallel", "procs"))
    p.add_argument("--judge-size", help="host scenarios: size the target applies to (default largest)")
    p.add_argument("--host-target", type=float, default=0.80, help="dmx/iperf3 ratio (default 0.80)")
    p.add_argument("--large", default="256M", help="gpu scenarios: the large message size")
    p.add_argument("--small", default="1M", help="gpu-staged: the size judged against --large")
    p.add_argument("--same-host-target", type=float, help="same-host: dmx / best peer copy")
    p.add_argument("--nccl-p2p-target", type=float, help="same-host: dmx / NCCL p2p at --small")
    p.add_argument("--shm-target", type=float, help="shm-host: dmx / single-thread memcpy at --large")
    p.add_argument("--timeout", type=int, default=600, help="seconds per command")
    p.add_argument("--json", metavar="FILE", help="write everything as JSON here")
    p.add_argument("--keep-logs", metavar="DIR", help="keep NCCL logs here")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--fail-on-skip", action="store_true", help="exit 3 when the scenario is skipped")
    args = p.parse_args(argv)
    try:
        if args.sizes:
            refutil.parse_sizes(args.sizes)
        if args.streams:
            refutil.parse_int_list(args.streams)
        for s in (args.large, args.small, args.judge_size):
            if s:
                refutil.parse_size(s)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    runner = Runner(args)
    record = {"scenario": args.scenario, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "host": platform.node(), "kernel": platform.release(), "argv": sys.argv}
    try:
        if args.scenario == "host-loopback":
            result = scenario_host(runner, args)
        elif args.scenario == "host-netns":
            result = scenario_host(runner, args, netns=True)
        elif args.scenario == "gpu-staged":
            result = scenario_gpu_staged(runner, args)
        elif args.scenario == "shm-host":
            result = scenario_shm_host(runner, args)
        else:
            result = scenario_same_host(runner, args)
        verdicts = [t["verdict"] for t in result["targets"]]
        if args.dry_run:
            status, rc = "DRY-RUN", 0
        elif "FAIL" in verdicts:
            status, rc = "FAIL", 1
        else:
            status, rc = "PASS", 0
        if "N/A" in verdicts:
            print("compare: some targets could not be judged (N/A): sizes missing from the run?",
                  file=sys.stderr)
        record.update(result)
    except Skip as e:
        status, rc = "SKIPPED", 3 if args.fail_on_skip else 0
        record["reason"] = str(e)
        print(f"SKIPPED: {args.scenario}: {e}")
    except Failure as e:
        status, rc = "ERROR", 2
        record["reason"] = str(e)
        print(f"ERROR: {args.scenario}: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        status, rc = "INTERRUPTED", 130
        print(f"INTERRUPTED: {args.scenario}", file=sys.stderr)
    record["status"] = status
    record["commands"] = runner.commands
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if status not in ("SKIPPED", "ERROR", "INTERRUPTED", "DRY-RUN"):
        print(f"\n{args.scenario}: {status}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(record, fh, indent=1)
            fh.write("\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
