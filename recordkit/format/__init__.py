"""The on-disk format: TFRecord framing, the index sidecar, the manifest, and the
in-progress marker (``check_complete``). Bytes only: how a reader opens and keeps
indexes is ``recordkit.reader.index``.

Also the atomic-publish helpers every local writer uses (``atomic_write_bytes``,
``fsync_dir``, temp names carry ``TMP_MARKER``).
"""

from ._atomic import TMP_MARKER, atomic_write_bytes, fsync_dir, temp_name
from ._files import map_regular, open_regular, read_regular
from .complete import (
    MARKER_NAME,
    Incomplete,
    check_complete,
    find_incomplete,
    mark_finished,
    mark_started,
)
from .compressed import detect_compression, open_stream, sniff_compression
from .crc import crc32c, mask, masked_crc32c, unmask
from .framing import (
    DEFAULT_MAX_RECORD_BYTES,
    OVERHEAD,
    frame,
    frame_header,
    iter_records,
    read_header,
    read_record,
    read_stream,
)
from .index import (
    index_path,
    load_index,
    open_map,
    parse_index,
    scan_index,
    validate_index,
    write_index,
)
from .manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    SHARD_PATTERNS,
    Manifest,
    ShardInfo,
    read_manifest,
)

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MARKER_NAME",
    "OVERHEAD",
    "SHARD_PATTERNS",
    "TMP_MARKER",
    "Incomplete",
    "Manifest",
    "ShardInfo",
    "atomic_write_bytes",
    "check_complete",
    "crc32c",
    "detect_compression",
    "find_incomplete",
    "frame",
    "frame_header",
    "fsync_dir",
    "index_path",
    "iter_records",
    "load_index",
    "map_regular",
    "mark_finished",
    "mark_started",
    "mask",
    "masked_crc32c",
    "open_map",
    "open_regular",
    "open_stream",
    "parse_index",
    "read_header",
    "read_manifest",
    "read_record",
    "read_regular",
    "read_stream",
    "scan_index",
    "sniff_compression",
    "temp_name",
    "unmask",
    "validate_index",
    "write_index",
]
