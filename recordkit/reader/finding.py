"""Finding the TFRecord files of a folder without a manifest, as engines name them.

Names taken as shards (:func:`find_shards`):

- TensorFlow's and ours: ``*.tfrecord``, ``*.tfrecords``, ``*.tfrecord-00000-of-00010``;
- ``*.tfr``;
- the sharded names of Apache Beam and TFX, with or without a suffix:
  ``data-00000-of-00004``, ``train.tfrecord-00003-of-00016``;
- any other file whose first 12 bytes are a valid TFRecord frame header (its length
  CRC matches), whatever its name: Ray Data's ``write_tfrecords`` names its files
  ``{uuid}_{task}.tar``. Only files that no rule above takes are opened, 12 bytes each.

Compressed TFRecords (``*.gz``, ``*.zlib`` of such names, a sharded name whose first
bytes are GZIP or ZLIB, or any file whose GZIP or ZLIB stream begins with a valid
frame header: Ray's ``.tar`` again) are found too, and named as compressed by the readers
with the ``recordkit convert`` command that makes an indexed copy. A folder where
nothing is found gets a message listing what was skipped (:func:`nothing_found`).
A path with glob characters (``out/data-*-of-*``) is expanded (:func:`expand`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import mmap
import os
import re
import stat
import struct
from collections.abc import Sequence

from ..errors import CorruptRecordError, ManifestError, ShardNotFoundError, add_note
from ..format.crc import masked_crc32c
from ..format.index import INDEX_SUFFIX, open_map
from ..format.manifest import MANIFEST_NAME, SHARD_PATTERNS, Manifest, ShardInfo, read_manifest
from ..storage import is_temp_name
from .index import ensure_index
from .tfds import tfds_hint

__all__ = [
    "check_listed",
    "compressed_names",
    "count_shards",
    "expand",
    "find_shards",
    "has_glob",
    "nothing_found",
    "shard_infos",
    "what_it_is",
]

_SHARDED = re.compile(r".*-\d{5}-of-\d{5}(\.[^./]+)?$")
_COMPRESSED = (".gz", ".gzip", ".zlib", ".zz")
# Files these never are: a TFRecord is not sniffed among them (and not reported skipped
# with a hint: they are the folder's other business).
_NOT_RECORDS = (".json", ".txt", ".md", ".idx", ".py", ".csv", ".yaml", ".yml", ".lock")


def _named(name: str) -> bool:
    """A TFRecord by its name (uncompressed)."""
    if name.endswith(INDEX_SUFFIX) or is_temp_name(name):
        return False
    if any(fnmatch.fnmatchcase(name, p) for p in SHARD_PATTERNS) or name.endswith(".tfr"):
        return not name.endswith(_COMPRESSED)
    return bool(_SHARDED.match(name)) and not name.endswith(_COMPRESSED + _NOT_RECORDS)


def _frames(path: str) -> bool:
    """Whether the file begins with a valid TFRecord frame header."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return len(head) == 12 and masked_crc32c(head[:8]) == struct.unpack("<I", head[8:])[0]


def _files(root: str) -> list[str]:
    """The visible files of a folder (an entry that cannot be stat'ed, a symlink loop
    say, is not one)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    out = []
    for e in entries:
        if e.name.startswith(".") or is_temp_name(e.name):
            continue
        try:
            if e.is_file():
                out.append(e.name)
        except OSError:
            continue
    return sorted(out)


def find_shards(root: str) -> list[str]:
    """TFRecord files in a directory without a manifest, sorted by name (see the module
    docstring); compressed ones are :func:`compressed_names`, not these."""
    found = []
    for name in _files(root):
        if _named(name):
            found.append(name)
        elif (
            not name.endswith(_COMPRESSED + _NOT_RECORDS)
            and not _compressed_name(name)
            and _frames(os.path.join(root, name))
        ):
            found.append(name)  # a TFRecord by its content (Ray's {uuid}_{task}.tar)
    return found


def _compressed_name(name: str) -> bool:
    stem, dot, ext = name.rpartition(".")
    if not dot or f".{ext}" not in _COMPRESSED:
        return False
    return _named(stem) or ".tfrecord" in stem


def compressed_names(root: str) -> list[str]:
    """The compressed TFRecord files of a folder: by name (``x.tfrecord.gz``,
    ``data-00000-of-00004.gz``), a sharded name whose first bytes are GZIP or ZLIB, or
    any other file that is one GZIP or ZLIB stream of TFRecord frames (Ray Data's
    ``write_tfrecords`` with ``compression="gzip"`` still names its files ``.tar``)."""
    from ..format.compressed import sniff_compression

    out = []
    for name in _files(root):
        if _compressed_name(name):
            out.append(name)
        elif not name.endswith(_NOT_RECORDS) and (_SHARDED.match(name) or not _named(name)):
            try:  # (a *.tfrecord is a shard by name: not opened here)
                with open(os.path.join(root, name), "rb") as f:
                    head = f.read(4096)
            except OSError:
                continue
            kind = sniff_compression(head)
            if kind is not None and (_SHARDED.match(name) or _inflates_to_frame(head, kind)):
                out.append(name)
    return out


def _inflates_to_frame(head: bytes, kind: str) -> bool:
    """Whether a GZIP or ZLIB stream's first 12 inflated bytes are a valid TFRecord
    frame header: a content check as strong as :func:`_frames`, where the two magic
    bytes alone would take any gzipped file."""
    import zlib

    try:
        out = zlib.decompressobj(31 if kind == "GZIP" else 15).decompress(head, 12)
    except zlib.error:
        return False
    return len(out) == 12 and masked_crc32c(out[:8]) == struct.unpack("<I", out[8:])[0]


def nothing_found(root: str) -> str:
    """Why a folder has nothing to read, and what was skipped there."""
    others = [n for n in _files(root) if not n.endswith(INDEX_SUFFIX)]
    base = f"no manifest and no TFRecord files in {root}"
    if not others:
        return base + " (it holds no files)"
    shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
    return (
        f"{base}; skipped {len(others)} file(s) that are neither named nor framed as "
        f"TFRecords: {shown}. TFRecords named otherwise can be given by path, a list "
        f"or a glob (for example {os.path.join(root, '*')!r})"
    )


def has_glob(path: str) -> bool:
    """Whether ``path`` has glob characters and names nothing as it is."""
    return glob.has_magic(path) and not os.path.exists(path)


def expand(pattern: str) -> tuple[str, list[str]]:
    """The files a glob names: ``(their directory, their names)``, sorted.

    Raises:
        ShardNotFoundError: it names no file, or files in more than one directory.
    """
    paths = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    paths = [p for p in paths if not p.endswith(INDEX_SUFFIX) and not is_temp_name(p)]
    if not paths:
        raise ShardNotFoundError(f"no file matches {pattern!r}")
    roots = {os.path.dirname(os.path.abspath(p)) for p in paths}
    if len(roots) > 1:
        raise ShardNotFoundError(
            f"{pattern!r} names files in {len(roots)} folders; give a list of them instead"
        )
    root = roots.pop()
    return root, [os.path.basename(p) for p in paths]


_MAGIC = (
    (b"PAR1", "a Parquet file", "parquet"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image", None),
    (b"\xff\xd8\xff", "a JPEG image", None),
    (b"PK\x03\x04", "a ZIP archive (a .npz?)", "numpy"),
    (b"\x93NUMPY", "a NumPy .npy array", "numpy"),
    (b"ARROW1", "an Arrow file", None),
    # Other whole-file compressions (Ray Data writes them when asked, still named .tar):
    # TFRecord readers know only GZIP and ZLIB, so these are named, not called corrupt.
    (b"(\xb5/\xfd", "a Zstandard-compressed file (TFRecords compress as GZIP or ZLIB only)", None),
    (b"BZh", "a bzip2-compressed file (TFRecords compress as GZIP or ZLIB only)", None),
    (b"\x04\x22\x4d\x18", "an LZ4-compressed file (TFRecords compress as GZIP or ZLIB only)", None),
    (b"\xfd7zXZ\x00", "an XZ-compressed file (TFRecords compress as GZIP or ZLIB only)", None),
)


def what_it_is(path: str) -> str | None:
    """What a file that is not a TFRecord looks like, with the command that converts it
    (``None``: a TFRecord, compressed or not, or nothing recognisable)."""
    from ..format.compressed import sniff_compression

    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    frames = len(head) >= 12 and masked_crc32c(head[:8]) == struct.unpack("<I", head[8:12])[0]
    if frames or sniff_compression(head) is not None:
        return None
    found = next(((what, fmt) for magic, what, fmt in _MAGIC if head.startswith(magic)), None)
    if found is None and len(head) > 257 + 5 and head[257:262] == b"ustar":
        found = ("a tar archive (WebDataset?)", "webdataset")
    if found is None:
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            return None
        first = text.lstrip()[:1]
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if first in "{[" and first:
            found = ("JSON Lines" if len(lines) > 1 and first == "{" else "JSON", "jsonl")
        elif lines and ("," in lines[0] or "\t" in lines[0]):
            found = ("a CSV file", "csv")
        else:
            found = ("text", None)
    what, fmt = found
    if fmt is None:
        return what
    return f"{what}; convert it with: recordkit convert {path} DEST --from {fmt}"


# -- from a path to its shards -------------------------------------------------------------


def count_shards(root: str, names: Sequence[str], *, write_index: bool = False) -> list[ShardInfo]:
    """Shard infos for files without a manifest: each shard's index read (or rebuilt).

    O(records): every index is loaded and validated (a missing or stale one is
    rebuilt by a CRC-checked scan, and kept in the per-user index cache unless
    ``write_index`` puts it beside the shard), then dropped; only the counts are kept.
    """
    infos = []
    for name in names:
        path = os.path.join(root, name)
        buf = open_map(path)
        try:
            try:
                entries = ensure_index(path, buf=buf, write=write_index)
            except CorruptRecordError as exc:
                # Beam's data-00000-of-00004 written with compression_type=ZSTD is no
                # corrupt TFRecord: say what the file is, as for a file given by path.
                looks = what_it_is(path) if exc.offset == 0 else None
                if looks is None:
                    raise
                raise ShardNotFoundError(
                    f"{path} is not a TFRecord file: it looks like {looks}"
                ) from None
            infos.append(ShardInfo(name, len(entries), len(buf)))
        finally:
            if isinstance(buf, mmap.mmap):
                # An error's traceback may still hold a view of the map: then the map
                # goes with it, and the error (not a BufferError) reaches the caller.
                with contextlib.suppress(BufferError):
                    buf.close()
    return infos


def shard_infos(path: str, write_index: bool) -> tuple[str, Manifest | None, list[ShardInfo]]:
    """``(root, manifest or None, shard infos)`` of a path: a manifest's shards, a
    folder's, a glob's, or one file's (counted), or the error that says why none."""
    if has_glob(path):  # out/data-*-of-*: the files it names, as a folder of them
        root, names = expand(path)
        return root, None, count_shards(root, names, write_index=write_index)
    if os.path.isdir(path):
        if os.path.lexists(os.path.join(path, MANIFEST_NAME)):  # a broken link is not "none"
            manifest = read_manifest(path)
            return path, manifest, list(manifest.shards)
        names = find_shards(path)
        if not names:
            compressed = compressed_names(path)
            if compressed:
                raise _compressed_folder(path, compressed)
            raise ShardNotFoundError(nothing_found(path) + tfds_hint(path))
        return path, None, count_shards(path, names, write_index=write_index)
    if os.path.isfile(path):
        looks = what_it_is(path)
        if looks is not None:  # a CSV, a Parquet file, an image: not a corrupt TFRecord
            raise ShardNotFoundError(f"{path} is not a TFRecord file: it looks like {looks}")
        root, name = os.path.split(path)
        return root, None, count_shards(root, [name], write_index=write_index)
    raise ShardNotFoundError(f"no such dataset: {path}")


def _compressed_folder(root: str, names: list[str]) -> Exception:
    """A folder of compressed TFRecords, named as such with the command that converts it."""
    from ..format.compressed import compressed_error, sniff_compression

    with open(os.path.join(root, names[0]), "rb") as f:
        kind = sniff_compression(f.read(12)) or (
            "ZLIB" if names[0].endswith((".zlib", ".zz")) else "GZIP"
        )
    exc = compressed_error(root, kind)
    add_note(exc, f"{len(names)} compressed TFRecord file(s) there, such as {names[0]}")
    return exc


def check_listed(root: str, infos: Sequence[ShardInfo]) -> None:
    """Fail early on a shard the manifest lists that is missing or of another size.

    One ``stat`` per shard (about 0.2 s for 100k shards on a local disk); the
    index and record count are checked when the shard is first read.
    """
    for info in infos:
        path = os.path.join(root, info.path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise ShardNotFoundError(f"shard not found: {path}") from None
        except OSError as exc:  # a name too long, a symlink loop, a file as a folder
            raise ManifestError(
                f"shard cannot be opened: {exc.strerror or exc}", path=path
            ) from None
        if not stat.S_ISREG(st.st_mode):
            open_map(path)  # refuses it with the error that says what it is
        size = st.st_size
        if size != info.bytes:
            raise ManifestError(f"shard is {size} bytes, the manifest says {info.bytes}", path=path)
