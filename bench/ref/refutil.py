"""Small helpers shared by the dmx benchmark references and bench/compare.py (stdlib only).

Units: sizes use binary multiples like `dmx bench --sizes` (1M = 1 MiB = 1048576 bytes);
rates are decimal GB/s (1e9 bytes per second), the unit dmx bench prints in gb_per_s.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sys

# Workplace rule: NVLink multicast (NVLS, symmetric-memory multicast) can break the shared
# host. Every script that may load NCCL or torch sets these before importing either.
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def apply_safety_env(env: dict | None = None) -> dict:
    """Forces SAFETY_ENV into env (os.environ by default) and returns it."""
    target = os.environ if env is None else env
    for k, v in SAFETY_ENV.items():
        target[k] = v
    return target


def parse_size(text: str) -> int:
    """'8' -> 8, '4K' -> 4096, '256M'/'256MiB' -> 268435456. Raises ValueError."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"bad size {text!r} (want N, NK, NM, NG, optionally with B/iB)")
    return int(m.group(1)) * _MULT[m.group(2).lower()]


def parse_sizes(text: str) -> list[int]:
    sizes = [parse_size(t) for t in text.split(",") if t.strip()]
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"bad size list {text!r}")
    return sizes


def parse_int_list(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"bad number list {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"bad number list {text!r}")
    return values


def format_size(n: int) -> str:
    """268435456 -> '256M', 8 -> '8', 1536 -> '1536'."""
    for suffix, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    if not values:
        raise ValueError("percentile of nothing")
    s = sorted(values)
    k = max(1, math.ceil(p / 100.0 * len(s)))
    return s[k - 1]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def emit(obj: dict, stream=None) -> None:
    """Prints one JSON line and flushes (lines are read by other processes)."""
    out = stream or sys.stdout
    out.write(json.dumps(obj, sort_keys=False) + "\n")
    out.flush()


def json_lines(text: str) -> list[dict]:
    """The JSON objects among the lines of text; other lines are ignored."""
    objs = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            objs.append(obj)
    return objs
