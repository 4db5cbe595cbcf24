"""dmx is quiet by default, and its log lines are records of Python's logger "dmx" (issue 40)."""
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

import dmx

TRANSFER = textwrap.dedent("""
    import numpy as np, dmx
    ctx = dmx.Context()
    lis = ctx.listen("tcp://127.0.0.1:0")
    a = ctx.connect(lis.address)
    b = lis.accept(timeout=30)
    x = np.frombuffer(np.random.default_rng().bytes((1 << 20) + 7), np.uint8).copy()
    y = np.zeros_like(x)
    fut = b.recv(y)
    a.send(x).wait(timeout=60)
    assert fut.wait(timeout=60) == x.nbytes and np.array_equal(x, y)
    a.close(); b.close(); lis.close()
    print("moved", x.nbytes)
""")


def run_child(code):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMX_LOG")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "moved" in r.stdout, r.stdout
    return r.stderr


def test_quiet_by_default():
    # A fresh process that connects and moves data, with no logging set up: nothing on stderr.
    stderr = run_child(TRANSFER)
    assert stderr == "", f"dmx printed, unasked:\n{stderr}"


def test_logging_level_decides():
    # logging at INFO before the Context is made: dmx's info lines come as logging records
    # (formatted by logging, not by dmx), and none straight to stderr.
    stderr = run_child("import logging, sys\n"
                       "logging.basicConfig(level=logging.INFO, format='LOGGING %(name)s %(levelname)s %(message)s')\n"
                       + TRANSFER)
    lines = stderr.splitlines()
    assert any(line.startswith("LOGGING dmx INFO ") for line in lines), stderr
    assert all(line.startswith("LOGGING dmx ") for line in lines), stderr


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []
        self.mu = threading.Lock()

    def emit(self, record):
        with self.mu:
            self.records.append(record)

    def find(self, text):
        with self.mu:
            return [r for r in self.records if text in r.getMessage()]


def test_a_warning_reaches_logging(capfd):
    # A stranger sends garbage to a listener: dmx's listener thread warns, and the warning is a
    # WARNING record of logging.getLogger("dmx"), not a line on stderr.
    records = Records()
    log = logging.getLogger("dmx")
    log.addHandler(records)
    try:
        ctx = dmx.Context()
        lis = ctx.listen("tcp://127.0.0.1:0")
        host, port = lis.address[len("tcp://"):].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(np.random.default_rng().bytes(256))
            deadline = time.monotonic() + 20
            while not records.find("refused peer") and time.monotonic() < deadline:
                time.sleep(0.01)
        lis.close()
        got = records.find("refused peer")
        assert got, [r.getMessage() for r in records.records]
        assert got[0].levelno == logging.WARNING and got[0].name == "dmx"
        assert lis.address[len("tcp://"):] in got[0].getMessage()
        assert abs(got[0].created - time.time()) < 60
    finally:
        log.removeHandler(records)
    assert "refused peer" not in capfd.readouterr().err
