"""``webdataset``: WebDataset tar shards; members grouped into samples by key.

A member ``dir/000123.jpg`` belongs to sample ``dir/000123`` as its ``jpg``
field (the key is the name up to the first dot of its last path component,
WebDataset's rule). Members are streamed from the tar (remote tars by
streaming reads), never extracted to disk. Absolute member names and names
with ``..`` are refused, as are links and device files.

Features: ``__key__`` (``Bytes``) and one per extension. Inferred types:
``Int64`` for ``cls``/``cls2``/``index``/``id`` fields whose text is an
integer, ``Bytes`` (the member's bytes) for everything else. With a schema,
``Int64``/``Float32`` fields are parsed from the member's text.

Options (the archive limits are checked on each member's header, before its data
is read; a member or an archive over one is refused by name):
    infer_samples: how many leading samples inference looks at (default 64).
    max_member_bytes: the largest member accepted, in bytes (default 2 GiB,
        the record limit: a bigger member could not become a record anyway).
    max_expansion: the largest ratio of the bytes all members declare to the
        archive file's size (default 100; gzip cannot exceed about 1032, and
        real shards of images or text stay far below 100): what a ``.tar.gz``
        bomb or a sparse tar of gigabytes of holes passes, never a plain tar.
        Ignored when the listing gives no size.
"""

from __future__ import annotations

import itertools
import tarfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from recordkit import Bytes, Float32, Int64, Schema
from recordkit.format import DEFAULT_MAX_RECORD_BYTES

from .base import Item, Source, SourceError, SourceNotFoundError, check_member_name, source_errors

__all__ = ["WebDatasetSource"]

_INT_FIELDS = ("cls", "cls2", "index", "id")


class WebDatasetSource(Source):
    """WebDataset tars (``*.tar``, ``*.tar.gz``, ``*.tgz``) -> one record per sample."""

    name: ClassVar[str] = "webdataset"
    defaults: ClassVar[Mapping[str, Any]] = {
        "infer_samples": 64,
        "max_member_bytes": DEFAULT_MAX_RECORD_BYTES,
        "max_expansion": 100,
    }
    suffixes: ClassVar[tuple[str, ...]] = (".tar", ".tar.gz", ".tgz")

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        _limits(self.options)

    def list_items(self) -> list[Item]:
        tars = self.matching_files(lambda r: r.lower().endswith(self.suffixes), ".tar")
        return [Item(self.item_key(r), s, (r,)) for r, s in tars]

    def _raw_samples(self, item: Item) -> Iterator[dict[str, bytes]]:
        rel = item.ref[0]
        budget = _Budget(item, self.options)
        with (
            source_errors(item.key),
            self.location.open(rel, block_size=8 << 20) as f,
            tarfile.open(fileobj=f, mode="r|*") as tar,
        ):
            key: str | None = None
            sample: dict[str, bytes] = {}
            try:
                for member in tar:
                    name = check_member_name(item.key, member.name)
                    budget.check(name, member.size)
                    if member.isdir():
                        continue
                    if not member.isfile():
                        raise SourceError(f"{item.key}: member {name!r} is not a regular file")
                    folder, _, base = name.rpartition("/")
                    stem, dot, ext = base.partition(".")
                    if not dot or not stem:
                        continue  # no extension: not a sample field (WebDataset skips these too)
                    this = f"{folder}/{stem}" if folder else stem
                    if this != key:
                        if sample:
                            yield sample
                        key, sample = this, {"__key__": this.encode()}
                    if ext in sample:
                        raise SourceError(f"{item.key}: sample {key!r} has two {ext!r} members")
                    data = tar.extractfile(member)
                    assert data is not None  # a regular file always has data
                    sample[ext] = data.read()
            except (tarfile.TarError, EOFError, zlib.error) as exc:
                raise SourceError(f"{item.key}: bad tar: {exc}") from exc
            if sample:
                yield sample

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        limit = int(self.options["infer_samples"])
        samples = list(itertools.islice((s for it in items for s in self._raw_samples(it)), limit))
        if not samples:
            raise SourceNotFoundError(f"webdataset: no samples in {self.location.url}")
        fields = sorted(set().union(*samples))
        features: dict[str, Any] = {}
        for field in fields:
            present = [s[field] for s in samples if field in s]
            if len(present) != len(samples):
                raise SourceError(
                    f"webdataset: field {field!r} is in {len(present)} of the first "
                    f"{len(samples)} samples; a schema needs it in every sample"
                )
            is_int = field in _INT_FIELDS and all(_is_int(v) for v in present)
            features[field] = Int64() if is_int else Bytes()
        keyed = {"__key__": features.pop("__key__")}
        return Schema({**keyed, **features})

    def samples(self, item: Item, schema: Schema) -> Iterator[Mapping[str, Any]]:
        features = schema.features
        for sample in self._raw_samples(item):
            if sample.keys() != features.keys():
                raise SourceError(
                    f"{item.key}: sample {sample['__key__'].decode()!r} has fields "
                    f"{sorted(sample)}, the schema {sorted(features)}"
                )
            out: dict[str, Any] = {}
            for name, ftype in features.items():
                value = sample[name]
                try:
                    if isinstance(ftype, Int64) and not ftype.shape:
                        out[name] = int(value.decode())
                    elif isinstance(ftype, Float32) and not ftype.shape:
                        out[name] = float(value.decode())
                    else:
                        out[name] = value
                except (UnicodeDecodeError, ValueError) as exc:
                    key = sample["__key__"].decode()
                    raise SourceError(f"{item.key}: sample {key!r} field {name!r}: {exc}") from exc
            yield out


def _limits(options: Mapping[str, Any]) -> tuple[int, float]:
    max_member, ratio = int(options["max_member_bytes"]), float(options["max_expansion"])
    if max_member < 0 or not ratio > 0:
        raise ValueError(
            f"webdataset: max_member_bytes must be >= 0 and max_expansion > 0, "
            f"got {max_member} and {ratio}"
        )
    return max_member, ratio


class _Budget:
    """The archive limits, checked against each member's declared size before it is read."""

    def __init__(self, item: Item, options: Mapping[str, Any]) -> None:
        self.key = item.key
        self.archive_bytes = item.size
        self.max_member, self.ratio = _limits(options)
        self.declared = 0

    def check(self, name: str, size: int) -> None:
        if size > self.max_member:
            raise SourceError(
                f"{self.key}: member {name!r} declares {size} bytes, over the limit of "
                f"{self.max_member} (option max_member_bytes); refused before reading it"
            )
        self.declared += size
        if self.archive_bytes > 0 and self.declared > self.ratio * self.archive_bytes:
            raise SourceError(
                f"{self.key}: members up to {name!r} declare {self.declared} bytes, over "
                f"{self.ratio:g} times the archive's {self.archive_bytes} bytes (option "
                "max_expansion): a decompression bomb or a sparse tar; refused before reading it"
            )


def _is_int(value: bytes) -> bool:
    try:
        int(value.decode())
    except (UnicodeDecodeError, ValueError):
        return False
    return True
