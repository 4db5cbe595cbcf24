"""The records of a DMX_TRACE file (src/core/trace.cc), for the scripts that read them
(trace-report.py, stage-times.py): 32-byte little-endian records (ns, thread id, name), record 0
and the unwritten records zero."""
import struct
import sys

REC = struct.Struct("<QI20s")


def read(path, tool):
    """[(ns, tid, name)] of the written records in file order. A file cut inside a record (a
    partial copy: trace.cc sizes its file in whole records) is read to its last whole record and
    `tool` says on stderr what it ignored."""
    with open(path, "rb") as f:
        data = f.read()
    whole = len(data) // REC.size
    tail = len(data) - whole * REC.size
    if tail:
        print(f"{tool}: {path}: {len(data)} bytes, not a multiple of the {REC.size}-byte record: "
              f"read {whole} records, ignored the trailing {tail} bytes", file=sys.stderr)
    out = []
    for off in range(REC.size, whole * REC.size, REC.size):
        ns, tid, name = REC.unpack_from(data, off)
        if ns:
            out.append((ns, tid, name.split(b"\0", 1)[0].decode(errors="replace")))
    return out
