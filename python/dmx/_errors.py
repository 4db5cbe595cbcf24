"""dmx errors: one class per dmx::Code (include/dmx/status.h), all subclasses of dmx.Error.

Every failure of the library reaches Python as one of these, carrying the engine's message, where
it came from (origin) and the peer it concerns. Some also derive from the matching builtin, so
that `except TimeoutError` or `except ValueError` catch them too.
"""


class Error(Exception):
    """A dmx failure. Attributes: code (e.g. "timeout"), message, origin, peer."""

    code = "internal error"
    message = ""  # the engine's message, without code, origin and peer
    origin = ""   # where it came from, e.g. "tcp/stream 2"
    peer = ""     # the peer it concerns, e.g. "10.0.0.2:7000"


class InvalidArgumentError(Error, ValueError):
    code = "invalid argument"


class NotFoundError(Error, LookupError):
    code = "not found"


class UnavailableError(Error):
    code = "unavailable"


class TimeoutError(Error, TimeoutError):  # noqa: A001 (shadows the builtin on purpose)
    code = "timeout"


class CancelledError(Error):
    code = "cancelled"


class ClosedError(Error):
    code = "closed"


class ProtocolError(Error):
    code = "protocol error"


class AuthError(Error):
    code = "authentication failed"


class IoError(Error):
    code = "i/o error"


class OutOfRangeError(Error, IndexError):
    code = "out of range"


class TruncatedError(Error):
    code = "truncated"


class ResourceExhaustedError(Error):
    code = "resource exhausted"


class PeerFailedError(Error, ConnectionError):
    code = "peer failed"


class DataLossError(Error):
    code = "data loss"


class InternalError(Error):
    code = "internal error"


# Indexed by dmx::Code (0 is kOk).
_BY_CODE = (Error, InvalidArgumentError, NotFoundError, UnavailableError, TimeoutError,
            CancelledError, ClosedError, ProtocolError, AuthError, IoError, OutOfRangeError,
            TruncatedError, ResourceExhaustedError, PeerFailedError, DataLossError, InternalError)


def _from_status(code, message, origin, peer, text):
    """Called by the extension: the exception for a dmx::Status (code: its number)."""
    cls = _BY_CODE[code] if 0 < code < len(_BY_CODE) else Error
    # One argument only: OSError subclasses read several as (errno, strerror, filename).
    e = cls(text)
    e.message, e.origin, e.peer = message, origin, peer
    return e
