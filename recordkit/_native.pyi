"""Type stub for the C extension ``recordkit._native`` (see ``recordkit/_native.c``).

Its pure Python twin, with the same signatures and results, is
``recordkit.reader._fallback``.
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

def crc32c(data: Any, value: int = 0, /) -> int: ...
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
