"""Fixtures: a peer process (peer.py) connected to this one."""
import json
import os
import subprocess
import sys

import pytest

import dmx

HERE = os.path.dirname(os.path.abspath(__file__))
CMD, REPLY, DATA, ECHO = 1, 2, 3, 4


class Peer:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "peer.py")],
                                     stdout=subprocess.PIPE, text=True)
        address = self.proc.stdout.readline().strip()
        assert address.startswith("tcp://"), f"peer printed {address!r}"
        self.ctx = dmx.Context()
        self.ep = self.ctx.connect(address)

    def command(self, op, wait_reply=True, **args):
        buf = bytearray(4096)
        # The reply's recv is posted first: the peer may close right after replying (exit), and a
        # recv posted after the close arrives would fail.
        reply = self.ep.recv(buf, REPLY) if wait_reply else None
        self.ep.send(json.dumps(dict(op=op, **args)).encode(), CMD).wait(timeout=30)
        if not wait_reply:
            return None
        n = reply.wait(timeout=60)
        return json.loads(buf[:n])

    def close(self):
        if self.proc.poll() is None:
            try:
                self.command("exit")
            except dmx.Error:
                pass
        self.ep.close()
        try:
            self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def peer():
    p = Peer()
    yield p
    p.close()


@pytest.fixture
def own_peer():
    """A peer of this test alone (it may kill it)."""
    p = Peer()
    yield p
    p.close()
