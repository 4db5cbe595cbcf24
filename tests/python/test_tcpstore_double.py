"""dmx's TCPStore client against a stand-in server (tcpstore_double.py; torch's own server is in
test_tcpstore_torch.py): publish, look up, connect by name, heartbeat liveness, a restart."""
import os

import numpy as np
import pytest

import dmx
from tcpstore_double import TCPStoreDouble


def ctx(port, name=None):
    s = dict(store=f"tcpstore://127.0.0.1:{port}", store_job="tj", auth_key="tcpstore-double-key-01",
             store_lease_ttl="2s", store_watch_interval="200ms")
    if name:
        s["store_name"] = name
    return dmx.Context(**s)


def test_publish_lookup_connect_restart():
    server = TCPStoreDouble()
    a = ctx(server.port, "a")
    lis = a.listen("tcp://127.0.0.1:0")
    buf = np.zeros(1 << 16, dtype=np.uint8)
    reg = a.register(buf)
    a.publish("buf", reg)
    b = ctx(server.port)
    r = b.lookup("buf")
    assert r["owner"] == "a" and r["owner_epoch"] == a.epoch()
    ep = b.connect("dmx://tj/a")
    served = lis.accept(timeout=10)  # kept: a dropped endpoint closes
    data = np.frombuffer(os.urandom(5000), dtype=np.uint8)
    ep.write(data, r["region"], 3).wait(timeout=60)
    assert np.array_equal(buf[3:5003], data)
    assert [p["name"] for p in b.cluster()["peers"]] == ["a"]
    # The leased value is stored behind its lease id, the lease as a heartbeat time; keys go with
    # torch's "/" before them.
    key = b"/dmx/tj/peers/a"
    assert server.data[key].startswith(b"L")
    lease = server.data[key][1:server.data[key].index(b"\n")].decode()
    assert int(server.data[f"/dmx/lease/{lease}".encode()]) > 0
    # "a" restarts: a new epoch (ADD), and the endpoint to the old one fails naming it.
    sink = np.zeros(8, dtype=np.uint8)
    pending = ep.recv(sink, 9)
    a2 = ctx(server.port, "a")
    lis2 = a2.listen("tcp://127.0.0.1:0")
    assert a2.epoch() == a.epoch() + 1
    with pytest.raises(dmx.Error) as e:
        pending.wait(timeout=60)
    assert "dmx://tj/a" in str(e.value) and "restarted" in str(e.value)
    ep2 = b.connect("dmx://tj/a")
    served2 = lis2.accept(timeout=10)
    server.close()
