"""Fake `torch`, only for testing the control flow of bench/ref/*.py on machines without
PyTorch or GPUs (bench/ref/testing/selftest.sh). It moves no data between processes and
measures nothing real: recv() fills the buffer with the pattern the sender uses.
FAKE_TORCH_GPUS sets the GPU count (default 2)."""

import os
import time

__version__ = "0.0+fake"
_dmx_fake = True
__file__ = os.path.abspath(__file__)
uint8 = "uint8"
int64 = "int64"
int32 = "int32"


class device:
    def __init__(self, type_, index=None):
        if isinstance(type_, str) and ":" in type_:
            type_, index = type_.split(":")
        self.type, self.index = type_, None if index is None else int(index)

    def __repr__(self):
        return f"{self.type}:{self.index}" if self.index is not None else self.type


def _dev(d):
    if d is None:
        return device("cpu")
    return d if isinstance(d, device) else device(d)


class Tensor:
    def __init__(self, data, dev):
        self.data = bytearray(data)
        self.device = _dev(dev)

    def numel(self):
        return len(self.data)

    def copy_(self, other, non_blocking=False):
        assert len(other.data) == len(self.data), "size mismatch"
        self.data[:] = other.data
        return self

    def fill_(self, v):
        self.data[:] = bytes([int(v) & 0xFF]) * len(self.data)
        return self

    def zero_(self):
        return self.fill_(0)

    def repeat(self, n):
        return Tensor(self.data * n, self.device)

    def __getitem__(self, s):
        return Tensor(self.data[s], self.device)

    def data_ptr(self):
        return id(self.data)

    def to(self, dev):
        if dev in (uint8, int32, int64):  # a dtype: bytes stay as they are
            return Tensor(self.data, self.device)
        return Tensor(self.data, dev)

    def cpu(self):
        return self.to("cpu")


def empty(n, dtype=None, device=None, pin_memory=False):
    return Tensor(bytes(n), device)


def zeros(n, dtype=None, device=None):
    return Tensor(bytes(n), device)


def ones(n, dtype=None, device=None):
    return Tensor(b"\x01" * n, device)


def arange(n, dtype=None, device=None):
    return Tensor(bytes(i % 256 for i in range(n)), device)


def equal(a, b):
    return a.data == b.data


from . import cuda, distributed  # noqa: E402,F401
