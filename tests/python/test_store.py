"""The store from Python (docs/cluster.md) against Debian's etcd started here; skipped without it."""
import os
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest

import dmx

ETCD = shutil.which("etcd")
pytestmark = pytest.mark.skipif(ETCD is None, reason="no etcd: not installed (Debian: etcd-server)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd():
    d = tempfile.mkdtemp(prefix="dmx-etcd-py-")
    cport, pport = free_port(), free_port()
    c, p = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    proc = subprocess.Popen([ETCD, "--data-dir", d, "--listen-client-urls", c, "--advertise-client-urls", c,
                             "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                             "--initial-cluster", f"default={p}", "--log-level", "error", "--logger", "zap"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"etcd://127.0.0.1:{cport}"
    probe = dmx.Context(store=url, store_timeout="500ms")
    for _ in range(300):
        try:
            probe.cluster()
            break
        except dmx.Error:
            time.sleep(0.2)
    yield url
    proc.kill()
    proc.wait()
    shutil.rmtree(d, ignore_errors=True)


def test_publish_lookup_connect_by_name(etcd):
    settings = dict(store=etcd, store_job="py", auth_key="python-store-test-key-42")
    a = dmx.Context(**settings, store_name="a")
    lis = a.listen("tcp://127.0.0.1:0")
    buf = np.zeros(1 << 16, dtype=np.uint8)
    reg = a.register(buf)
    a.publish("buf", reg)
    b = dmx.Context(**settings)
    r = b.lookup("buf")
    assert r["owner"] == "a" and r["owner_epoch"] == a.epoch() and r["memory"] == "host"
    ep = b.connect("dmx://py/a")
    served = lis.accept(timeout=10)  # kept: a dropped endpoint closes
    data = np.frombuffer(os.urandom(1000), dtype=np.uint8)
    ep.write(data, r["region"], 17).wait(timeout=60)
    assert np.array_equal(buf[17:1017], data)
    assert [p["name"] for p in b.cluster()["peers"]] == ["a"]
    with pytest.raises(dmx.Error) as e:
        b.lookup("nothing")
    assert "not published" in str(e.value)
    other = dmx.Context(store=etcd, store_job="py", auth_key="another-key-entirely-1")
    with pytest.raises(dmx.Error) as e:
        other.lookup("buf")
    assert "signature does not match" in str(e.value)
