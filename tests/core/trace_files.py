"""Synthetic DMX_TRACE files for the tests of the scripts that read them (trace_report_test.py,
stage_times_test.py): the layout of src/core/trace.cc, 32-byte little-endian records
(ns, thread id, name), record 0 and the unwritten records zero."""
import os
import struct

REC = struct.Struct("<QI20s")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(path, records):
    """Writes records [(ns, tid, name)] as a process's trace file: record 0, them, an unwritten tail."""
    with open(path, "wb") as f:
        f.write(b"\0" * REC.size)  # record 0 is never written
        for ns, tid, name in records:
            f.write(REC.pack(ns, tid, name.encode()))
        f.write(b"\0" * REC.size * 4)  # unwritten tail
