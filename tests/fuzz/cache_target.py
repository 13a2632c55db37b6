"""Fuzz target: a shard cache's own files as another process (or a disk) left them.

Everything under ``.recordkit-cache/`` comes from disk: the sqlite state
(``state.db`` and its WAL), the saved catalog (``catalog.json``), the
reservation and pin files; and the published shards themselves. Each example
starts from a cache that a real fill made, damages one or more of them, and
then uses the directory as a training run would — a fill, a status, a
snapshot read back record by record, a reader-only open, a restart while the
remote is away — holding each to the two outcomes: the remote's own data (a
fill ends with every shard byte-identical to the remote's), or a
``RecordkitError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

import recordkit as rk
from recordkit.cache import ShardCache
from recordkit.retry import RetryPolicy

from .readers import attempt, canon
from .targets import _VALUES, SCHEMAS, _mutated, _tree_edit, sample

_SHARDS = [f"part-0000{k}.tfrecord" for k in range(4)] + ["../x", "/abs", "", "a/../b"]
FAST = RetryPolicy(attempts=1, backoff=0.0, cooldown=0.0, shard_attempts=1)
META = ".recordkit-cache"
_SQL = [
    "UPDATE shards SET {col} = {value} WHERE rowid IN (SELECT rowid FROM shards LIMIT 1)",
    "UPDATE shards SET {col} = {value}",
    "INSERT OR REPLACE INTO shards(path, present, bytes, index_bytes) VALUES ({value}, 1, 5, 5)",
    "DELETE FROM shards",
    "DELETE FROM totals",
    "UPDATE totals SET bytes = {value}",
    "UPDATE settings SET value = {value}",
    "DROP TABLE changes",
    "DROP TRIGGER shards_upd",
    "INSERT INTO changes(path, present, bytes, index_bytes) VALUES ({value}, 1, {value}, 0)",
    "PRAGMA user_version = {value}",
]
_COLUMNS = [
    "path",
    "present",
    "bytes",
    "index_bytes",
    "seen",
    "published",
    "used",
    "uses",
    "reads",
    "consumed",
    "extra",
]
_SQL_VALUES = st.sampled_from(
    [
        "NULL",
        "-1",
        "0",
        "1",
        "7",
        "9223372036854775807",
        "-9223372036854775808",
        "1e300",
        "'x'",
        "'../../etc/passwd'",
        "'part-00000.tfrecord'",
        "'part-00009.tfrecord'",
        "'{'",
        "'[]'",
        '\'{"crc32c": "no"}\'',
        "X'00ff'",
        "''",
        "'/abs'",
    ]
)


@st.composite
def _damage(draw: st.DrawFn, catalog: Any) -> tuple[str, Any]:
    what = draw(
        st.sampled_from(
            [
                "catalog",
                "catalog-text",
                "db-bytes",
                "db-sql",
                "wal",
                "lease",
                "pin",
                "shard",
                "stray",
                "state.json",
            ]
        )
    )
    if what == "state.json":  # the history a recordkit before the sqlite store left
        entry = st.dictionaries(
            st.sampled_from(["seen", "published", "used", "uses", "reads", "consumed", "crc32c"]),
            st.one_of(
                _VALUES, st.floats(), st.integers(-(2**70), 2**70), st.sampled_from([2**63, -1])
            ),
            max_size=5,
        )
        names = st.one_of(st.sampled_from(_SHARDS), st.text(max_size=6))
        doc = st.one_of(
            st.fixed_dictionaries(
                {"shards": st.dictionaries(names, entry | _VALUES, max_size=4), "epoch": _VALUES}
            ),
            _VALUES,
        )
        return what, json.dumps(draw(doc), allow_nan=True).encode()
    if what == "db-sql":
        stmt = draw(st.sampled_from(_SQL))
        return what, stmt.format(col=draw(st.sampled_from(_COLUMNS)), value=draw(_SQL_VALUES))
    if what in ("db-bytes", "wal", "shard"):
        flips = draw(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=4))
        cut = draw(st.one_of(st.none(), st.integers(0, 1 << 16)))
        return what, (flips, cut, draw(st.binary(max_size=64)))
    if what in ("lease", "pin"):
        content = draw(
            st.one_of(st.binary(max_size=64), _VALUES.map(lambda v: json.dumps(v).encode()))
        )
        name = draw(
            st.sampled_from(["0123456789ab.json", "x.json", "..json", "a" * 200 + ".json", "b.tmp"])
        )
        return what, (name, content)
    if what == "stray":
        return what, draw(
            st.sampled_from(
                [
                    "part-00001.tfrecord.tmp-0123456789ab",
                    "part-00002.tfrecord.tmp-zz",
                    "other.tfrecord",
                    "part-00003.tfrecord.idx.tmp-0123456789ab",
                    ".recordkit-cache/leases",
                    ".recordkit-cache/junk",
                ]
            )
        )
    text = json.dumps(catalog).encode()
    if what == "catalog":
        return what, json.dumps(draw(_tree_edit(json.loads(text))), allow_nan=True).encode()
    return what, draw(_mutated(text))


def _damage_bytes(path: str, flips: list[tuple[int, int]], cut: int | None, tail: bytes) -> None:
    with contextlib.suppress(FileNotFoundError), open(path, "r+b") as f:
        data = bytearray(f.read())
        for at, value in flips:
            if data:
                data[at % len(data)] = value
        if cut is not None:
            del data[cut % (len(data) + 1) :]
        data += tail
        f.seek(0)
        f.write(data)
        f.truncate()


class _CacheState:
    remote = ""
    template = ""
    records: dict[str, list[Any]] | None = None
    catalog: Any = None

    def setup(self, scratch: str) -> None:
        import recordkit.torch  # noqa: F401

        self.remote = os.path.join(scratch, "remote")
        schema = SCHEMAS[0]
        with rk.Writer(self.remote, schema, max_records=3, fsync=False) as w:
            for i in range(12):
                w.write(sample(schema, i))
        self.records = {}
        for name in sorted(os.listdir(self.remote)):
            if name.endswith(".tfrecord"):
                with rk.Dataset(os.path.join(self.remote, name)) as ds:
                    self.records[name] = [canon(s) for s in ds]
        self.template = os.path.join(scratch, "cache-template")
        cache = ShardCache(self.remote, self.template, max_bytes="64MiB", fill_workers=0)
        assert cache.fill() == 4
        with cache.snapshot(0) as snap:  # a history: uses, reads, an epoch
            snap.mark_consumed(snap.shards[0])
        cache.dir.store.close()
        with open(os.path.join(self.template, META, "catalog.json")) as f:
            self.catalog = json.load(f)

    def strategy(self) -> st.SearchStrategy[Any]:
        ops = st.sampled_from(["fill", "reader", "offline"])
        damages = st.lists(st.deferred(lambda: _damage(self.catalog)), min_size=1, max_size=3)
        return st.tuples(damages, ops)

    def _apply(self, root: str, what: str, arg: Any) -> None:
        meta = os.path.join(root, META)
        if what in ("catalog", "catalog-text"):
            with open(os.path.join(meta, "catalog.json"), "wb") as f:
                f.write(arg)
        elif what == "db-sql":
            conn = sqlite3.connect(os.path.join(meta, "state.db"), isolation_level=None)
            try:
                with contextlib.suppress(sqlite3.Error, ValueError):  # (a damaged db's text)
                    conn.execute(arg)
            finally:
                conn.close()
        elif what in ("db-bytes", "wal"):
            name = "state.db" if what == "db-bytes" else "state.db-wal"
            path = os.path.join(meta, name)
            if not os.path.exists(path):
                open(path, "wb").close()
            _damage_bytes(path, *arg)
        elif what == "shard":
            _damage_bytes(os.path.join(root, "part-00001.tfrecord"), *arg)
        elif what in ("lease", "pin"):
            name, content = arg
            folder = os.path.join(meta, "leases" if what == "lease" else "pins")
            path = os.path.join(folder, name)
            # (unless an earlier damage put a file in the folder's place)
            with contextlib.suppress(NotADirectoryError), open(path, "wb") as f:
                f.write(content)
        elif what == "state.json":
            with open(os.path.join(meta, "state.json"), "wb") as f:
                f.write(arg)
        elif what == "stray":
            path = os.path.join(root, arg)
            if arg.endswith(("leases", "junk")):
                shutil.rmtree(path, ignore_errors=True)
                with open(path, "wb") as f:
                    f.write(b"not a directory")
            else:
                shutil.copy(os.path.join(self.remote, "part-00000.tfrecord"), path)

    def _check_fill(self, root: str) -> Iterator[str]:
        cache = ShardCache(self.remote, root, max_bytes="64MiB", fill_workers=0, retry=FAST)
        try:
            n = cache.fill()
            status = cache.status()
            assert status.complete == n
            with cache.snapshot(0, min_shards=0) as snap:
                got = {info.path: _read_shard(path) for info, path in zip(snap.shards, snap.paths)}
        finally:
            cache.dir.store.close()
        for name, outcome in got.items():
            if outcome[0] == "data":
                assert outcome[1] == self.records[name], f"{name}: other records than the remote's"
        for name in self.records:
            path = os.path.join(root, name)
            if os.path.exists(path) and got.get(name, ("x",))[0] != "error":
                with open(path, "rb") as a, open(os.path.join(self.remote, name), "rb") as b:
                    assert a.read() == b.read(), f"{name}: the cached copy is not the remote's"
        yield f"fill: {n} shard(s)"

    def _check_reader(self, root: str) -> Iterator[str]:
        cache = ShardCache(None, root, max_bytes="64MiB", fill_workers=0)
        try:
            cache.status()
            with cache.snapshot(0, min_shards=0) as snap:
                for info, path in zip(snap.shards, snap.paths):
                    outcome = _read_shard(path)
                    if outcome[0] == "data":
                        assert outcome[1] == self.records[info.path], info.path
        finally:
            cache.dir.store.close()
        yield "reader: ok"

    def check(self, example: tuple[list[tuple[str, Any]], str], scratch: str) -> Iterator[str]:
        damages, op = example
        root = os.path.join(scratch, "cache")
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(self.template, root)
        for what, arg in damages:
            self._apply(root, what, arg)
            yield f"damage: {what}"
        if op == "fill":
            outcome = attempt(lambda: list(self._check_fill(root)))
        elif op == "reader":
            outcome = attempt(lambda: list(self._check_reader(root)))
        else:  # a restart while the remote cannot be reached: the saved catalog is used
            away = self.remote + ".away"
            os.rename(self.remote, away)
            try:
                outcome = attempt(lambda: list(self._check_reader_offline(root)))
            finally:
                os.rename(away, self.remote)
        yield f"{op}: {outcome[0] if outcome[0] == 'data' else type(outcome[1]).__name__}"

    def _check_reader_offline(self, root: str) -> Iterator[str]:
        cache = ShardCache(self.remote, root, max_bytes="64MiB", fill_workers=0, retry=FAST)
        try:
            cache.catalog()
            cache.status()
            with cache.snapshot(0, min_shards=0) as snap:
                for info, path in zip(snap.shards, snap.paths):
                    outcome = _read_shard(path)
                    if outcome[0] == "data":
                        assert outcome[1] == self.records[info.path], info.path
        finally:
            cache.dir.store.close()
        yield "offline: ok"


def _read_shard(path: str) -> tuple[str, Any]:
    def read() -> list[Any]:
        with rk.Dataset(path) as ds:
            return [canon(s) for s in ds]

    return attempt(read)


cache_state = _CacheState()
