"""Type stubs of the dmx module (docs/python.md)."""
from typing import Any, Generator, Optional, Sequence, Union

import numpy

from ._errors import (AuthError as AuthError, CancelledError as CancelledError,
                      ClosedError as ClosedError, DataLossError as DataLossError, Error as Error, InternalError as InternalError,
                      InvalidArgumentError as InvalidArgumentError, IoError as IoError,
                      NotFoundError as NotFoundError, OutOfRangeError as OutOfRangeError,
                      PeerFailedError as PeerFailedError, ProtocolError as ProtocolError,
                      ResourceExhaustedError as ResourceExhaustedError, TimeoutError as TimeoutError,
                      TruncatedError as TruncatedError, UnavailableError as UnavailableError)

__version__: str
ANY_TAG: int
"""recv(tag=ANY_TAG) matches a message of any tag."""

Buffer = Any
"""An object with __dlpack__ (CPU, pinned or CUDA memory) or the buffer protocol; contiguous; plain
data (items that are Python objects or pointers raise InvalidArgumentError)."""
Descriptor = Union[bytes, bytearray, memoryview, "RemoteRegion"]
Buffers = Union[Buffer, Sequence[Buffer]]
"""One buffer, or a list (or tuple) of them; a list entry's index names it in entries and pieces."""
Descriptors = Union[Descriptor, Sequence[Descriptor]]
Ints = Any
"""Integers in host memory, read in C++ without a Python loop: a 1-D NumPy array of any integer dtype
(any strides), an array.array, a memoryview, or a CPU torch tensor. Negative values are refused
with their index."""

IO_ENTRY: "numpy.dtype"
"""NumPy dtype of one vectored write/read entry, laid out as dmx::IoEntry (32 bytes):
local (u4: index into `local`), remote (u4: index into `remote`), local_offset, remote_offset,
length (u8). An array of it is copied with one memcpy."""
IO_PIECE: "numpy.dtype"
"""NumPy dtype of one piece of a vectored message, as dmx::IoPiece (24 bytes): region (u4: index
into `local`), reserved (u4, 0), offset, length (u8)."""

def build_info() -> dict[str, str]:
    """version, git_revision and options of the library this module was built with."""

class Future:
    """An operation in flight. Holds its buffers until it completes."""
    @property
    def tag(self) -> int:
        """recv: the tag of the matched message."""
    @property
    def crc32c(self) -> int:
        """The CRC32C of the bytes moved when the endpoint checksums (checksum="crc32c"), else 0."""
    @property
    def failed_entry(self) -> int:
        """A vectored operation refused for a bad entry: that entry's index (its error says
        "entry <i>:"); else -1."""
    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits (GIL released) and returns the bytes moved; a recv: the message size. Raises the
        operation's Error, or TimeoutError when `timeout` seconds pass first (it continues)."""
    def result(self, timeout: Optional[float] = None) -> int:
        """Same as wait()."""
    def done(self) -> bool:
        """True once complete (successfully or not)."""
    def cancel(self) -> None:
        """Asks for completion with CancelledError; no effect once complete."""
    def __await__(self) -> Generator[Any, None, int]:
        """asyncio: suspends until complete; cancelling the task cancels the operation."""

class RemoteRegion:
    """A region a peer registered, from its descriptor bytes."""
    key: int
    size: int
    @staticmethod
    def from_descriptor(descriptor: Union[bytes, bytearray, memoryview]) -> "RemoteRegion": ...
    def descriptor(self) -> bytes: ...

class Notification:
    """What a peer's write(..., notify=value) delivers once its data has landed here."""
    value: int
    key: int
    length: int

class Endpoint:
    """A connection to one peer. After a connection error every operation fails; make a new one."""
    @property
    def peer(self) -> str: ...
    def send(self, buf: Buffer, tag: int = 0, *, timeout: Optional[float] = None) -> Future:
        """Sends the bytes of `buf` to the peer's recv with `tag`."""
    def recv(self, buf: Buffer, tag: int = 0, *, timeout: Optional[float] = None) -> Future:
        """Receives the next message with `tag` into `buf` (writable); wait() returns its size."""
    def write(self, buf: Buffer, remote: Descriptor, offset: int = 0, *,
              notify: Optional[int] = None, timeout: Optional[float] = None) -> Future:
        """Writes `buf` into the peer's registered region at `offset`; complete once landed.
        notify=VALUE: the peer's next_notification() returns VALUE after the data landed."""
    def read(self, buf: Buffer, remote: Descriptor, offset: int = 0, *,
             timeout: Optional[float] = None) -> Future:
        """Reads len(buf) bytes of the peer's registered region at `offset` into `buf`."""
    def write_vec(self, local: Buffers, remote: Descriptors, entries: Ints, *,
                  notify: Optional[int] = None, timeout: Optional[float] = None) -> Future:
        """Writes a list of ranges as one operation: one completion, and with notify=VALUE one
        notification once every byte has landed. `entries`: an array of dtype IO_ENTRY (copied
        with one memcpy) or integers of shape (n, 5): local index, remote index, local offset, remote offset,
        length. The whole list is checked before a byte moves (bounds, overlapping remote ranges):
        a bad entry fails the operation with "entry <i>: ..." and Future.failed_entry == i."""
    def read_vec(self, local: Buffers, remote: Descriptors, entries: Ints, *,
                 timeout: Optional[float] = None) -> Future:
        """The read of write_vec's list: remote ranges into local ones (which must not overlap)."""
    def write_blocks(self, local: Buffers, remote: Descriptors, local_offsets: Ints, remote_offsets: Ints,
                     lengths: Union[int, Ints], *, notify: Optional[int] = None,
                     timeout: Optional[float] = None) -> Future:
        """write_vec of a paged cache's blocks: for each buffer i of `local` and remote region i (or
        the only one), every block j: local_offsets[j] -> remote_offsets[j], lengths[j] bytes (or
        one length for all). The list is built in C++: len(local) x len(local_offsets) entries."""
    def read_blocks(self, local: Buffers, remote: Descriptors, local_offsets: Ints, remote_offsets: Ints,
                    lengths: Union[int, Ints], *, timeout: Optional[float] = None) -> Future:
        """read_vec of blocks, as write_blocks: remote_offsets[j] -> local_offsets[j]."""
    def send_vec(self, local: Buffers, pieces: Ints, tag: int = 0, *,
                 timeout: Optional[float] = None) -> Future:
        """Sends one message gathered from `pieces`, in order: an array of dtype IO_PIECE or integers
        of shape (n, 3): buffer index, offset, length. Any recv of the tag receives it."""
    def recv_vec(self, local: Buffers, pieces: Ints, tag: int = 0, *,
                 timeout: Optional[float] = None) -> Future:
        """Receives one message scattered over `pieces` (which must not overlap)."""
    def send_blocks(self, local: Buffers, offsets: Ints, lengths: Union[int, Ints], tag: int = 0, *,
                    timeout: Optional[float] = None) -> Future:
        """send_vec of blocks: for each buffer of `local` in turn, blocks offsets[j] of lengths[j]."""
    def recv_blocks(self, local: Buffers, offsets: Ints, lengths: Union[int, Ints], tag: int = 0, *,
                    timeout: Optional[float] = None) -> Future:
        """recv_vec of blocks, as send_blocks."""
    def next_notification(self, timeout: Optional[float] = None) -> Notification:
        """The next notifying write the peer made into our memory (TimeoutError if none)."""
    def stats(self) -> dict[str, Any]:
        """transport, reason, peer, streams, bytes and message counters."""
    def close(self) -> None:
        """Pending operations fail with ClosedError."""
    def __enter__(self) -> "Endpoint": ...
    def __exit__(self, *args: Any) -> None: ...

class Registration:
    """Memory that peers may write into and read from, until deregistered."""
    @property
    def remote(self) -> RemoteRegion: ...
    def descriptor(self) -> bytes:
        """16 bytes that name the region for a peer's write/read."""
    def deregister(self) -> None:
        """Peers' operations on it fail from now; returns once no transfer uses it."""
    def __enter__(self) -> "Registration": ...
    def __exit__(self, *args: Any) -> None: ...

class Listener:
    @property
    def address(self) -> str:
        """"tcp://host:port" with the real port."""
    def accept(self, timeout: Optional[float] = None) -> Endpoint:
        """The next authenticated endpoint; TimeoutError when none comes in time."""
    def close(self) -> None: ...
    def __enter__(self) -> "Listener": ...
    def __exit__(self, *args: Any) -> None: ...

class Context:
    def __init__(self, **settings: Any) -> None:
        """Settings by name as `dmx probe --config` lists them: Context(streams=4, transport="tcp").
        They win over DMX_* environment variables, which win over the defaults. log_level defaults
        to the effective level of logging.getLogger("dmx"), where dmx's log lines go."""
    def listen(self, address: str) -> Listener:
        """"tcp://host:port"; port 0 picks one (see Listener.address)."""
    def connect(self, address: str) -> Endpoint:
        """Connects and authenticates within the connect_timeout setting."""
    def register(self, buf: Buffer) -> Registration:
        """Registers writable memory for peers' one-sided write and read."""
    def metrics_text(self) -> str:
        """Counters and latency histograms, Prometheus text format."""
    # The store (docs/cluster.md): settings store, store_job, store_name; connect("dmx://job/name").
    def publish(self, name: str, registration: Registration) -> None:
        """Publishes a Registration under `name` in the store (needs a listener with store_name)."""
    def unpublish(self, name: str) -> None:
        """Withdraws a region published under `name`."""
    def lookup(self, name: str) -> dict[str, Any]:
        """A region another process published: 'region' (a RemoteRegion), 'owner', 'owner_epoch',
        'size', 'memory', 'device', 'host'."""
    def lookup_peer(self, name: str) -> dict[str, Any]:
        """A peer's store entry as a dict."""
    def cluster(self) -> dict[str, Any]:
        """The job's peers, regions, pools and refused entries, with the keys of `dmx ls --json`
        (a region also has 'region', a RemoteRegion); a pool: 'host', 'name', 'kind', 'device'
        (CUDA ordinal, -1 for none), 'numa', 'bytes'."""
    def epoch(self) -> int:
        """This process's epoch in the store (0 before it registered)."""
