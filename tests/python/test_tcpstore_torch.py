"""dmx's TCPStore client against PyTorch's own TCPStore server (docs/cluster.md).

Two dmx contexts join the store a torch.distributed job would run at MASTER_ADDR:MASTER_PORT: one
registers a name and publishes a region, the other looks it up, connects by name and writes; then
the first is replaced by a new one under the same name (a restart) and the second's endpoint fails
naming it. Runs where torch is importable (the GPU machine), over each server backend torch has
(libuv and the classic one); skipped with the reason elsewhere.
"""
import os
import time

import numpy as np
import pytest

import dmx

torch = pytest.importorskip("torch", reason="not installed: PyTorch (the TCPStore server is torch's own)")
from torch.distributed import TCPStore  # noqa: E402


def torch_store(use_libuv):
    kwargs = dict(host_name="127.0.0.1", port=0, is_master=True, wait_for_workers=False)
    try:
        return TCPStore(**kwargs, use_libuv=use_libuv)
    except TypeError:
        if use_libuv:
            pytest.skip(f"torch {torch.__version__} has no use_libuv argument")
        return TCPStore(**kwargs)


def ctx(port, name=None):
    settings = dict(store=f"tcpstore://127.0.0.1:{port}", store_job="tj", auth_key="tcpstore-test-key-0123",
                    store_lease_ttl="3s", store_watch_interval="200ms")
    if name:
        settings["store_name"] = name
    return dmx.Context(**settings)


@pytest.mark.parametrize("use_libuv", [True, False])
def test_publish_lookup_connect_restart(use_libuv):
    server = torch_store(use_libuv)
    port = server.port
    a = ctx(port, "a")
    lis = a.listen("tcp://127.0.0.1:0")
    buf = np.zeros(1 << 20, dtype=np.uint8)
    reg = a.register(buf)
    a.publish("buf", reg)
    assert a.epoch() > 0

    b = ctx(port)
    found = b.lookup("buf")
    assert found["owner"] == "a" and found["owner_epoch"] == a.epoch() and found["size"] == buf.nbytes
    ep = b.connect("dmx://tj/a")
    served = lis.accept(timeout=10)  # kept: a dropped endpoint closes
    data = np.frombuffer(os.urandom(300001), dtype=np.uint8)
    ep.write(data, found["region"], 4099).wait(timeout=60)
    assert np.array_equal(buf[4099:4099 + data.size], data)
    listing = b.cluster()
    assert [p["name"] for p in listing["peers"]] == ["a"] and listing["refused"] == []
    # torch's own keys are untouched, and torch sees ours as plain keys.
    server.set("torch-key", "v")
    assert server.get("torch-key") == b"v"
    assert server.check([f"dmx/tj/peers/a"])

    # "a" restarts: the endpoint to the old one fails naming it; the name finds the new one.
    sink = np.zeros(64, dtype=np.uint8)
    pending = ep.recv(sink, 5)
    a2 = ctx(port, "a")
    lis2 = a2.listen("tcp://127.0.0.1:0")
    assert a2.epoch() > a.epoch()
    with pytest.raises(dmx.Error) as e:
        pending.wait(timeout=60)
    assert "dmx://tj/a" in str(e.value) and "restarted" in str(e.value)
    ep2 = b.connect("dmx://tj/a")
    served2 = lis2.accept(timeout=10)
    assert b.lookup_peer("a")["epoch"] == a2.epoch()
    del ep2, served2, lis2, a2, ep, served, lis, reg, a, b
    time.sleep(0.1)
