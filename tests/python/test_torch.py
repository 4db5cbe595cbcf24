"""PyTorch tensors (their attributes, DLPack for the rest): CPU when torch is importable, CUDA when a
GPU is present."""
import hashlib

import numpy as np
import pytest

import dmx
from conftest import DATA, ECHO

torch = pytest.importorskip("torch", reason="not installed: PyTorch (CPU tests need Debian's python3-torch)")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: PyTorch sees none")


def fresh(n, device="cpu"):
    return torch.randint(0, 256, (n,), dtype=torch.uint8).to(device)


def echo(peer, src, dst, size):
    peer.command("echo", wait_reply=False, size=size)
    back = peer.ep.recv(dst, ECHO)
    peer.ep.send(src, DATA).wait(timeout=60)
    return back.wait(timeout=60)


def test_cpu_tensors(peer):
    x = torch.randn(1000, 3)  # float32
    y = torch.zeros(1000, 3)
    assert echo(peer, x, y, x.numel() * 4) == 12000
    assert torch.equal(x, y)
    z = torch.zeros(10, 1000)
    assert echo(peer, x.view(-1)[:2000], z[3:5], 8000) == 8000
    assert torch.equal(z[3:5].reshape(-1), x.view(-1)[:2000]) and not z[:3].any() and not z[5:].any()
    with pytest.raises(Exception, match="contiguous"):
        peer.ep.send(x.t())


def test_cpu_tensor_one_sided(peer):
    info = peer.command("register", size=1 << 16)
    d = bytes.fromhex(info["descriptor"])
    before = torch.zeros(1 << 16, dtype=torch.uint8)
    peer.ep.read(before, d).wait(timeout=30)
    assert hashlib.sha256(before.numpy()).hexdigest() == info["digest"]
    x = fresh(4099)
    peer.ep.write(x, d, offset=7, notify=5).wait(timeout=30)
    before[7:7 + 4099] = x
    assert peer.command("notify")["value"] == 5
    assert peer.command("digest")["digest"] == hashlib.sha256(before.numpy()).hexdigest()


@cuda
@pytest.mark.parametrize("size", [0, 8, (1 << 20) + 3, 64 << 20])
def test_cuda_tensors_both_ways(peer, size):
    x = fresh(size, "cuda:0")
    y = torch.zeros(size, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()  # dmx copies on its own streams: the producers' work must be done
    assert echo(peer, x, y, size) == size
    assert torch.equal(x, y)


@cuda
def test_cuda_tensor_registered(peer):
    n = (4 << 20) + 1
    info = peer.command("register", size=n, device="cuda:0")  # the peer's memory is on the GPU
    d = bytes.fromhex(info["descriptor"])
    got = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
    peer.ep.read(got, d).wait(timeout=60)
    assert hashlib.sha256(got.cpu().numpy()).hexdigest() == info["digest"]
    x = fresh(n - 1, "cuda:0")
    torch.cuda.synchronize()
    peer.ep.write(x, d, offset=1, notify=9).wait(timeout=60)
    assert peer.command("notify")["value"] == 9
    got[1:] = x
    assert peer.command("digest")["digest"] == hashlib.sha256(got.cpu().numpy()).hexdigest()


@cuda
def test_pinned_tensor(peer):
    x = fresh(100000).pin_memory()
    y = torch.zeros(100000, dtype=torch.uint8).pin_memory()
    assert echo(peer, x, y, 100000) == 100000
    assert torch.equal(x, y)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason=f"too few CUDA devices: needs 2, PyTorch sees {torch.cuda.device_count()}")
def test_cuda_tensor_on_another_device_than_the_current_one(peer):
    # PyTorch exports a CUDA tensor only while its device is current; dmx makes it so.
    assert torch.cuda.current_device() == 0
    x = fresh((1 << 20) + 5, "cuda:1")
    y = torch.zeros((1 << 20) + 5, dtype=torch.uint8, device="cuda:1")
    torch.cuda.synchronize(1)
    assert echo(peer, x, y, x.numel()) == x.numel()
    assert torch.equal(x, y)
    assert torch.cuda.current_device() == 0  # and puts the current device back


def test_tensor_read_through_its_attributes():
    # No DLPack capsule per operation (python/src/buffer.cc from_torch): the same memory as DLPack names.
    from dmx import _dmx
    x = torch.randn(100, 3)[10:20]
    assert _dmx._region_of(x) == (x.data_ptr(), x.nbytes, "host")
    assert _dmx._region_of(x, torch_attributes=False) == _dmx._region_of(x)
    with pytest.raises(dmx.InvalidArgumentError, match="require gradient"):  # PyTorch's refusal, as before
        _dmx._region_of(torch.zeros(4, requires_grad=True))
    with pytest.raises(dmx.InvalidArgumentError, match="contiguous"):
        _dmx._region_of(x.t())


@cuda
def test_cuda_tensor_read_through_its_attributes():
    from dmx import _dmx
    last = torch.cuda.device_count() - 1
    x = fresh(4099, f"cuda:{last}")[3:]
    before = torch.cuda.current_device()
    assert _dmx._region_of(x) == (x.data_ptr(), 4096, f"cuda:{last}")
    assert _dmx._region_of(x, torch_attributes=False) == _dmx._region_of(x)
    assert torch.cuda.current_device() == before


@cuda
@pytest.mark.parametrize("n", [1, 100_000])
def test_cuda_write_blocks(peer, n):
    # One vectored write of CUDA tensor blocks into the peer's CUDA memory, offsets from NumPy.
    block = 16
    info = peer.command("register", size=n * block, device="cuda:0")
    d = bytes.fromhex(info["descriptor"])
    before = torch.zeros(n * block, dtype=torch.uint8, device="cuda:0")
    peer.ep.read(before, d).wait(timeout=60)
    src = fresh(n * block + 1, "cuda:0")[1:]  # an odd base address
    torch.cuda.synchronize()
    lo = np.random.default_rng().permutation(n) * block
    ro = np.random.default_rng().permutation(n) * block
    assert peer.ep.write_blocks(src, d, lo, ro, block, notify=3).wait(timeout=120) == n * block
    assert peer.command("notify")["value"] == 3
    expect = before.cpu().numpy().reshape(n, block)
    expect[ro // block] = src.cpu().numpy().reshape(n, block)[lo // block]
    assert peer.command("digest")["digest"] == hashlib.sha256(expect.reshape(-1)).hexdigest()
    back = torch.zeros_like(src)
    assert peer.ep.read_blocks(back, d, lo, ro, block).wait(timeout=120) == n * block
    assert torch.equal(back, src)
