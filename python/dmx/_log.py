"""dmx's log lines through Python's logging, as records of the logger "dmx".

The extension queues the lines of dmx's threads (they never run Python code); the thread
"dmx-log" takes them and hands them to logging. Which lines dmx makes is decided when a Context
is made: the level of logging.getLogger("dmx") then (or the log_level setting, DMX_LOG_LEVEL).
At exit the lines go to stderr again, as do those of a process without this module.
"""
import atexit
import logging
import os
import threading

from . import _dmx

logger = logging.getLogger("dmx")
_thread = None


def _emit(lines):
    for levelno, message, created in lines:
        if logger.isEnabledFor(levelno):
            record = logger.makeRecord(logger.name, levelno, "dmx", 0, message, None, None)
            record.created, record.msecs = created, (created - int(created)) * 1000
            logger.handle(record)


def _run():
    while True:
        lines = _dmx._log_take(1.0)
        if lines is None:  # stopped, and nothing left
            return
        try:
            _emit(lines)
        except Exception:  # a failing handler must not end the thread; logging reports its own
            pass


def _start(after_fork=False):
    global _thread
    _dmx._log_start(after_fork)
    _thread = threading.Thread(target=_run, name="dmx-log", daemon=True)
    _thread.start()


def _stop():
    _dmx._log_stop()
    if _thread is not None:
        _thread.join(timeout=5)


_start()
atexit.register(_stop)
os.register_at_fork(after_in_child=lambda: _start(after_fork=True))
