"""examples/python runs and verifies its bytes (CUDA variant: on a GPU machine)."""
import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "kv_cache.py")


def run(*args):
    r = subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "\n".join((r.stdout + r.stderr).splitlines()[-15:])
    assert "all bytes match" in r.stdout, r.stdout


def test_kv_cache_numpy():
    run("--requests", "3", "--blocks", "32", "--slots", "100", "--block", "65539")


def test_kv_cache_cuda():
    torch = pytest.importorskip("torch", reason="not installed: PyTorch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: PyTorch sees none")
    run("--device", "cuda:0")
