"""Fake torch.cuda (see the package docstring)."""
import os
import time

from . import nccl  # noqa: F401


def is_available():
    return device_count() > 0


def device_count():
    return int(os.environ.get("FAKE_TORCH_GPUS", "2"))


_current = [0]


def set_device(d):
    _current[0] = d if isinstance(d, int) else d.index


def current_device():
    return _current[0]


def synchronize(d=None):
    pass


def empty_cache():
    pass


def get_device_name(d=None):
    return "Fake GPU"


def can_device_access_peer(a, b):
    return True


class Stream:
    cuda_stream = 0

    def synchronize(self):
        pass


def current_stream(d=None):
    return Stream()


class Event:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0 + 1e-3
