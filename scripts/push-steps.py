#!/usr/bin/env python3
"""push-steps.py FILE... — each step's time of one small message, from a DMX_TRACE build's records.

Run a ping-pong (`dmx bench --sizes 8`) with DMX_TRACE_FILE=/some/prefix on both sides (each
process writes /some/prefix.<pid>), then: python3 scripts/push-steps.py /some/prefix.*

A message is the time from a `send.post` in one process to the next `send.post` in the other (the
peer's reply, posted once its application saw the message complete); messages the sender followed
with another send before the reply (a throughput phase) are left out. Within each message every
trace point is placed by its offset from the `send.post`; the table gives, per point (tx: the
sender, rx: the receiver), the p50 of that offset, the p50 of the step from the row before, the
step it belongs to, and in how many messages it occurred. The first tenth of the messages is
warm-up and left out. Clocks: CLOCK_MONOTONIC, one host, so the two processes compare.
"""
import collections
import os
import re
import statistics
import struct
import sys

STAGE = re.compile(r"[+@-][0-9a-f]{6}$")
REC = struct.Struct("<QI20s")

# The point -> the step of the send path it ends (docs/gpu-push.md, "Where the time goes").
STEPS = {
    "send.post": "host post",
    "send.op": "host post",
    "send.locked": "host post",
    "send.queued": "host post",
    "tx.export": "host post (cuda_ipc export)",
    "tx.exported": "host post (cuda_ipc export)",
    "st.d2h": "copy launch (tx staging)",
    "st.pushed": "copy launch (tx staging)",
    "st.copied": "copy launch (tx staging)",
    "st.d2h.issued": "copy launch (tx staging)",
    "st.d2h.done": "copy done (tx staging)",
    "s0.write": "wire send",
    "s0.out.eager": "wire send",
    "s0.out.other": "wire send",
    "s0.in.eager": "peer receive",
    "s0.in.other": "peer receive",
    "on_header.locked": "peer receive",
    "s0.planned": "peer receive",
    "path_hdr": "peer receive",
    "path_hdr.planned": "peer receive",
    "path_hdr.post_rx": "peer receive",
    "st.h2d": "land: copy launch",
    "st.h2d.issued": "land: copy launch",
    "ipc.inline": "land: copy launch",
    "ce.copy": "land: copy launch",
    "ce.guard": "land: copy launch",
    "ce.acquired": "land: copy launch",
    "ce.memcpy": "land: copy launch",
    "ce.recorded": "land: copy launch",
    "ipc.inline.issued": "land: copy launch",
    "ipc.take": "land: copy launch",
    "ipc.issued": "land: copy launch",
    "st.h2d.done": "land: copy done",
    "ipc.inline.copied": "land: copy done",
    "ipc.copied": "land: copy done",
    "rx.inline": "land: copy done",
    "rx.done": "land: copy done",
    "on_landed": "land",
    "on_landed.locked": "land",
    "rx.landed": "land",
    "rx.posted": "land",
    "deliver.batch": "completion seen",
    "op.completed": "completion seen",
    "wait.spun": "completion seen",
}


def load(path):
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pid = path.rsplit(".", 1)[-1]
    for off in range(REC.size, len(data) - REC.size + 1, REC.size):
        ns, tid, name = REC.unpack_from(data, off)
        name = name.split(b"\0", 1)[0].decode(errors="replace")
        if ns and not STAGE.search(name):  # the per-stream stage records of scripts/stage-times.py
            out.append((ns, pid, tid, name))
    return out


def messages(events):
    """Yields (sender pid, [(offset ns, side, name)]) per message."""
    posts = [i for i, e in enumerate(events) if e[3] == "send.post"]
    for k, i in enumerate(posts):
        sender = events[i][1]
        end = None
        for j in posts[k + 1:]:
            if events[j][1] != sender:
                end = j
                break
        if end is None:
            return
        if posts[k + 1] != end:
            continue  # the sender posted again before the reply: a throughput phase, not a ping-pong
        t0 = events[i][0]
        body = [(events[x][0] - t0, "tx" if events[x][1] == sender else "rx", events[x][3]) for x in range(i, end)]
        body.append((events[end][0] - t0, "rx", "reply.post"))
        yield sender, body


def main():
    paths = [p for p in sys.argv[1:] if os.path.isfile(p) and os.path.getsize(p) > 0]
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    if not paths:
        print("no trace records: was dmx built with -DDMX_TRACE=ON, and did the bench run? (run the pair by hand to see its errors)")
        return 1
    events = sorted(e for p in paths for e in load(p))
    msgs = list(messages(events))
    msgs = msgs[len(msgs) // 10:]
    if not msgs:
        print("no complete messages in the records (both sides' files, a ping-pong with send.post points?)")
        return 1
    offsets = collections.defaultdict(list)  # (side, name, nth) -> offsets
    for _, body in msgs:
        seen = collections.Counter()
        for off, side, name in body:
            key = (side, name, seen[(side, name)])
            seen[(side, name)] += 1
            offsets[key].append(off)
    rows = [(statistics.median(v), k, len(v)) for k, v in offsets.items() if len(v) >= len(msgs) // 2]
    rows.sort()
    total = statistics.median(body[-1][0] for _, body in msgs)
    print(f"{len(msgs)} messages (after warm-up) from {len(paths)} file(s); one way, send.post -> the peer's "
          f"reply.post: p50 {total / 1e3:.2f} us")
    print(f"  {'at us':>8} {'step us':>8} {'seen':>6}  point (side)               step")
    prev = 0.0
    by_step = collections.OrderedDict()
    for at, (side, name, nth), n in rows:
        step = STEPS.get(name, "reply posted" if name == "reply.post" else "other")
        if side == "rx" and name in ("st.pushed", "st.copied"):
            step = "land: copy launch"  # the same staging_copy points, on the receiving side
        label = f"{name}{'#' + str(nth + 1) if nth else ''} ({side})"
        print(f"  {at / 1e3:8.2f} {(at - prev) / 1e3:8.2f} {n:6d}  {label:26} {step}")
        by_step[step] = by_step.get(step, 0.0) + (at - prev)
        prev = at
    print("\n  per step (sum of the p50 steps above; the same order):")
    for step, ns in by_step.items():
        print(f"    {step:30} {ns / 1e3:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
