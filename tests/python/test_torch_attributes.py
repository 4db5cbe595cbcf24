"""A torch.Tensor is read through its attributes (data_ptr, nbytes, device), not DLPack.

PyTorch is not needed: a stand-in module `torch` in sys.modules, whose Tensor keeps its bytes in
a NumPy array, has the attributes dmx reads, and counts its __dlpack__ calls. The real thing runs
in test_torch.py (CPU tensors where PyTorch is installed, CUDA on a GPU machine).
"""
import sys
import types

import numpy as np
import pytest

import dmx
from dmx import _dmx
from conftest import DATA, ECHO

rng = np.random.default_rng()


class Tensor:
    """What dmx reads of a torch.Tensor; the bytes live in `self.array` (or at `fake_ptr`)."""
    dlpack_calls = 0

    def __init__(self, array, cuda_device=None, fake_ptr=None, **flags):
        self.array = array
        self.cuda_device = cuda_device
        self.fake_ptr = fake_ptr
        self.flags = dict(requires_grad=False, conj=False, neg=False, quantized=False, contiguous=True,
                          cpu=cuda_device is None, layout=sys.modules["torch"].strided)
        self.flags.update(flags)

    layout = property(lambda self: self.flags["layout"])
    requires_grad = property(lambda self: self.flags["requires_grad"])
    is_quantized = property(lambda self: self.flags["quantized"])
    is_cuda = property(lambda self: self.cuda_device is not None)
    is_cpu = property(lambda self: self.flags["cpu"])
    nbytes = property(lambda self: self.array.nbytes)

    def is_conj(self):
        return self.flags["conj"]

    def is_neg(self):
        return self.flags["neg"]

    def is_contiguous(self):
        return self.flags["contiguous"]

    def get_device(self):
        return -1 if self.cuda_device is None else self.cuda_device

    def data_ptr(self):
        return self.fake_ptr if self.fake_ptr is not None else self.array.ctypes.data

    def __dlpack_device__(self):
        return (1, 0) if self.cuda_device is None else (2, self.cuda_device)

    def __dlpack__(self, **kw):
        Tensor.dlpack_calls += 1
        if self.flags["requires_grad"]:
            raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
        return self.array.__dlpack__()


class _CudaDevice:
    """torch.cuda.device, for the DLPack road's device switch."""
    def __init__(self, index):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


@pytest.fixture
def torch():
    if "torch" in sys.modules:
        pytest.skip("PyTorch is imported: the stand-in would replace it")
    mod = types.ModuleType("torch")
    mod.strided = object()
    mod.cuda = types.SimpleNamespace(device=_CudaDevice)
    Tensor.__module__ = "torch"
    mod.Tensor = Tensor
    sys.modules["torch"] = mod
    Tensor.dlpack_calls = 0
    yield mod
    del sys.modules["torch"]


def fresh(n):
    return np.frombuffer(rng.bytes(n), np.uint8).copy()


def echo(peer, src, dst, size):
    peer.command("echo", wait_reply=False, size=size)
    back = peer.ep.recv(dst, ECHO)
    assert peer.ep.send(src, DATA).wait(timeout=60) == size
    return back.wait(timeout=60)


@pytest.mark.parametrize("size", [0, 1, 4099])
def test_tensor_moves_without_dlpack(peer, torch, size):
    x = Tensor(fresh(size))
    y = Tensor(np.zeros(size, np.uint8))
    assert echo(peer, x, y, size) == size
    assert np.array_equal(x.array, y.array)
    assert Tensor.dlpack_calls == 0


def test_tensor_one_sided_without_dlpack(peer, torch):
    info = peer.command("register", size=1 << 12)
    d = bytes.fromhex(info["descriptor"])
    x = Tensor(fresh(999))
    peer.ep.write(x, d, offset=5).wait(timeout=30)
    back = Tensor(np.zeros(999, np.uint8))
    peer.ep.read(back, d, offset=5).wait(timeout=30)
    assert np.array_equal(back.array, x.array)
    assert Tensor.dlpack_calls == 0


def test_cuda_tensor_region_without_device_switch(torch):
    # A CUDA tensor of device 1 (a made-up pointer; nothing is moved): no capsule, no torch.cuda.
    del torch.cuda
    t = Tensor(np.zeros(4096, np.uint8), cuda_device=1, fake_ptr=0x7F0000001000)
    assert _dmx._region_of(t) == (0x7F0000001000, 4096, "cuda:1")
    assert Tensor.dlpack_calls == 0


@pytest.mark.parametrize("flag", ["requires_grad", "conj", "neg", "quantized", "not strided", "not contiguous",
                                  "meta device"])
def test_what_pytorch_would_not_export_goes_by_dlpack(torch, flag):
    flags = {"not strided": dict(layout=object()), "not contiguous": dict(contiguous=False),
             "meta device": dict(cpu=False)}.get(flag, {flag: True})
    t = Tensor(fresh(64), **flags)
    if flag == "requires_grad":  # PyTorch's own refusal, through DLPack
        with pytest.raises(dmx.InvalidArgumentError, match="require gradient"):
            _dmx._region_of(t)
    else:
        _dmx._region_of(t)
    assert Tensor.dlpack_calls == 1


def test_subclass_goes_by_dlpack(torch):
    class Parameter(Tensor):
        pass
    _dmx._region_of(Parameter(fresh(64)))
    assert Tensor.dlpack_calls == 1


def test_a_broken_attribute_falls_back_to_dlpack(torch):
    t = Tensor(fresh(64))
    t.data_ptr = lambda: "not a number"
    assert _dmx._region_of(t)[1] == 64
    assert Tensor.dlpack_calls == 1


def test_only_the_module_in_sys_modules_counts(torch):
    t = Tensor(fresh(64))
    del sys.modules["torch"]  # its Tensor class is then an ordinary class
    try:
        _dmx._region_of(t)
        assert Tensor.dlpack_calls == 1
    finally:
        sys.modules["torch"] = torch


def test_profile_counts_each_stage(peer):
    x, y = fresh(100), np.zeros(100, np.uint8)
    peer.command("echo", wait_reply=False, size=100)
    _dmx._profile(True)
    try:
        back = peer.ep.recv(y, ECHO)
        peer.ep.send(x, DATA).wait(timeout=60)
        back.wait(timeout=60)
        stages = _dmx._profile_take()
    finally:
        _dmx._profile(False)
    assert np.array_equal(x, y)
    for stage in ("acquire", "post", "future", "wait", "release"):
        assert stages[stage][0] == 2, (stage, stages)
    assert all(secs >= 0 for _, secs in stages.values())
    assert _dmx._time_acquire(x, False, 10) > 0
