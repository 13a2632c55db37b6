"""Type stub for the C extension ``recordkit.native._ext``.

Built from ``recordkit/_native*.c`` (one subject per unit, mapped in
``recordkit/native/recordkit.h``). Its pure Python twin, with the same signatures and
results, is ``recordkit.reader._fallback``; the contract of the Runner's tasks
is ``recordkit.reader._contract``.
"""

from typing import Any

CRC32C_IMPL: str

STATUS_OK: int
STATUS_OUT_OF_BOUNDS: int
STATUS_TRUNCATED: int
STATUS_LENGTH_CRC: int
STATUS_TOO_LARGE: int
STATUS_LENGTH_MISMATCH: int
STATUS_PAYLOAD_CRC: int
STATUS_MALFORMED: int
STATUS_UNEXPECTED: int

KIND_ABSENT: int
KIND_BYTES: int
KIND_FLOAT: int
KIND_INT64: int
KIND_NONE: int
KIND_COMPLEX: int

class MapFault(BufferError):
    """A page of a buffer vanished under a guarded read: ``args == (message, at, offset)``."""

def crc32c(data: Any, value: int = 0, /) -> int: ...
def read(buf: Any, start: int, length: int, /) -> bytes: ...
def _crc32c_software(data: Any, value: int = 0, /) -> int: ...
def parse_batch(
    buf: Any,
    offsets: Any,
    sizes: Any,
    keys: tuple[bytes, ...],
    verify: bool,
    max_record_bytes: int = ...,
    expect: Any = None,
    /,
) -> tuple[bytearray, bytearray]: ...
def gather(buf: Any, starts: Any, lengths: Any, out: Any, row_bytes: int, /) -> None: ...
def gather_verified(
    buf: Any,
    offsets: Any,
    sizes: Any,
    starts: Any,
    lengths: Any,
    out: Any,
    row_bytes: int,
    /,
) -> bytearray: ...
def varints(buf: Any, starts: Any, nbytes: Any, counts: Any, out: Any, /) -> None: ...
def bytes_lists(buf: Any, starts: Any, nbytes: Any, counts: Any, /) -> list[Any]: ...

COL_BYTES: int
COL_FIXED: int
COL_INT64: int

class Runner:
    """Decodes whole reader tasks on threads that never take the GIL (Linux/macOS only)."""

    def __init__(
        self,
        keys: tuple[bytes, ...],
        expect: Any,
        columns: tuple[tuple[int, int, int, int, bool], ...],
        verify: bool,
        max_record_bytes: int,
        fuse_min_bytes: int,
        /,
    ) -> None: ...
    def submit(self, bufs: tuple[Any, ...], rec: Any, outs: tuple[Any, ...], /) -> int: ...
    def run(
        self, bufs: tuple[Any, ...], rec: Any, outs: tuple[Any, ...], /
    ) -> tuple[bool, tuple[int, ...]]: ...
    def work(self) -> int: ...
    def wait(self, task_id: int, /) -> tuple[bool, tuple[int, ...], float]: ...
    def close(self) -> None: ...
    def drop(self) -> None: ...
