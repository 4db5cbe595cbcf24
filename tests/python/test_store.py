"""The store from Python (docs/cluster.md) against Debian's etcd started here; skipped without it."""
import json
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
        except dmx.Error as e:
            if "no cpp-httplib" in str(e):  # the module's build has no etcd client
                proc.kill()
                proc.wait()
                shutil.rmtree(d, ignore_errors=True)
                pytest.skip(f"not built: the etcd store ({e})")
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


def dmx_binary():
    """The CLI beside this build's module (build/python/dmx -> build/tools/dmx/dmx), or DMX_BIN."""
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(dmx.__file__))))
    path = os.environ.get("DMX_BIN") or os.path.join(build, "tools", "dmx", "dmx")
    return path if os.access(path, os.X_OK) else None


def test_cluster_lists_the_engines_pools_as_dmx_ls_does(etcd):
    # The engine publishes the machine's pools (topo/placement.h) once the process has a name; on
    # the two-socket fixture: a pinned pool per NUMA node, a GPU pool per GPU (CUDA ordinals in PCI
    # order), the NVMe's p2pmem BAR. Fresh names: a job and a process name of random letters.
    job, name = "py" + os.urandom(6).hex(), "pools" + os.urandom(6).hex()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "topo", "dual-socket-icelake")
    settings = dict(store=etcd, store_job=job, auth_key="python-store-test-key-42")
    a = dmx.Context(**settings, store_name=name, sysfs_root=root)
    b = dmx.Context(**settings)
    assert b.cluster()["pools"] == [], "published once the process has a name (its first listener)"
    lis = a.listen("tcp://127.0.0.1:0")
    listing = b.cluster()
    assert listing["refused"] == []
    pools = {p["name"]: p for p in listing["pools"]}
    want = {f"{name}:host-node0": ("pinned-host", 0, -1), f"{name}:host-node1": ("pinned-host", 1, -1),
            f"{name}:gpu-0000:03:00.0": ("gpu", 0, 0), f"{name}:gpu-0000:83:00.0": ("gpu", 1, 1),
            f"{name}:p2pmem-0000:05:00.0": ("device-bar", 0, -1)}
    assert sorted(pools) == sorted(want)
    for n, (kind, numa, device) in want.items():
        p = pools[n]
        assert (p["kind"], p["numa"], p["device"]) == (kind, numa, device), p
        assert p["bytes"] > 0 and p["host"], p
        assert set(p) == {"host", "name", "kind", "device", "numa", "bytes"}, p
    # `dmx ls --json` shows the same pools with the same keys and values.
    cli = dmx_binary()
    if cli is None:
        pytest.skip("no dmx CLI beside this module (set DMX_BIN) to compare with `dmx ls`")
    env = dict(os.environ, DMX_AUTH_KEY="python-store-test-key-42")
    out = subprocess.run([cli, "ls", "--store", etcd, "--job", job, "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    key = lambda p: p["name"]
    assert sorted(shown["pools"], key=key) == sorted(listing["pools"], key=key)
    assert [p["name"] for p in shown["peers"]] == [p["name"] for p in listing["peers"]] == [name]
    del lis
