"""The cache's bookkeeping: one ``sqlite3`` database in WAL mode, a row per shard.

Why sqlite (and not a journal of our own), how durable a commit is
(``synchronous=NORMAL``), what the budget counts of it and how an unreadable one is
set aside and rebuilt (the rescan re-adopts the complete shards): ``docs/cache.md``,
"Bookkeeping: sqlite in WAL mode". Every access happens under the cache directory's
``flock`` (:class:`~recordkit.cache.locks.DirLock`), so sqlite never waits on its own
locks and a checkpoint always completes. The WAL is checkpointed and truncated
whenever a commit leaves it past :data:`WAL_LIMIT`, so it never holds more than that
plus one transaction; the budget counts it at that bound
(``directory.CacheDir.bookkeeping``).

Only :class:`~recordkit.cache.directory.CacheDir` uses this module, always under the
directory lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import CacheFullError, RecordkitError
from ..format.manifest import normalize_shard_path

log = logging.getLogger(__name__)

# Checkpoint and truncate the WAL once it passes this: small enough to bound the
# bookkeeping's share of a budget, large enough that checkpoints (which write and
# fsync the database) come once per ten or so events (1 KiB pages).
WAL_LIMIT = 32 * 1024
_LAYOUT = 1  # PRAGMA user_version of the layout below

_SCHEMA = """
CREATE TABLE shards(
    path TEXT PRIMARY KEY,
    present INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0,
    index_bytes INTEGER NOT NULL DEFAULT 0,
    seen INTEGER NOT NULL DEFAULT 0,
    published REAL NOT NULL DEFAULT 0,
    used REAL NOT NULL DEFAULT 0,
    uses INTEGER NOT NULL DEFAULT 0,
    reads INTEGER NOT NULL DEFAULT 0,
    consumed INTEGER,
    extra TEXT NOT NULL DEFAULT '{}'
) WITHOUT ROWID;
CREATE TABLE totals(id INTEGER PRIMARY KEY CHECK (id = 0), bytes INTEGER NOT NULL);
INSERT INTO totals VALUES (0, 0);
CREATE TABLE settings(key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO settings VALUES ('epoch', 0), ('foreign', 0);
CREATE TRIGGER shards_ins AFTER INSERT ON shards BEGIN
    UPDATE totals SET bytes = bytes + NEW.present * (NEW.bytes + NEW.index_bytes);
END;
CREATE TRIGGER shards_del AFTER DELETE ON shards BEGIN
    UPDATE totals SET bytes = bytes - OLD.present * (OLD.bytes + OLD.index_bytes);
END;
CREATE TRIGGER shards_upd AFTER UPDATE OF present, bytes, index_bytes ON shards BEGIN
    UPDATE totals SET bytes = bytes - OLD.present * (OLD.bytes + OLD.index_bytes)
                                    + NEW.present * (NEW.bytes + NEW.index_bytes);
END;
CREATE INDEX shards_lru ON shards(used, published, path) WHERE present = 1;
CREATE INDEX shards_consumed ON shards(consumed, used, published, path) WHERE present = 1;
-- Every change to the published set, in order: a process keeps its copy of the set
-- current by reading what was appended since it last looked (see Store.present).
CREATE TABLE changes(
    seq INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    present INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    index_bytes INTEGER NOT NULL
);
CREATE TRIGGER changes_ins AFTER INSERT ON shards WHEN NEW.present = 1 BEGIN
    INSERT INTO changes(path, present, bytes, index_bytes)
    VALUES (NEW.path, 1, NEW.bytes, NEW.index_bytes);
END;
CREATE TRIGGER changes_upd AFTER UPDATE OF present, bytes, index_bytes ON shards
WHEN OLD.present != NEW.present OR (NEW.present = 1
    AND (OLD.bytes != NEW.bytes OR OLD.index_bytes != NEW.index_bytes)) BEGIN
    INSERT INTO changes(path, present, bytes, index_bytes)
    VALUES (NEW.path, NEW.present, NEW.bytes, NEW.index_bytes);
END;
CREATE TRIGGER changes_del AFTER DELETE ON shards WHEN OLD.present = 1 BEGIN
    INSERT INTO changes(path, present, bytes, index_bytes) VALUES (OLD.path, 0, 0, 0);
END;
"""
# Rows another program (or a damaged disk) may have left, which the queries below would
# choke on: counted at open, and a database with any is rebuilt like an unreadable one.
_INT = "typeof({0}) = 'integer' AND {0} BETWEEN 0 AND 9007199254740992"
_NUM = "typeof({0}) IN ('integer', 'real') AND abs({0}) < 1e18"
_WRONG_SHAPE = f"""SELECT
 (SELECT count(*) FROM shards WHERE NOT (
    typeof(path) = 'text' AND path != '' AND path NOT LIKE '/%' AND path NOT LIKE '%\\%'
    AND '/' || path || '/' NOT LIKE '%/../%' AND '/' || path || '/' NOT LIKE '%/./%'
    AND path NOT LIKE '%//%' AND instr(path, char(0)) = 0
    AND present IN (0, 1) AND {_INT.format("bytes")} AND {_INT.format("index_bytes")}
    AND {_INT.format("seen")} AND {_INT.format("uses")} AND {_INT.format("reads")}
    AND {_NUM.format("published")} AND {_NUM.format("used")}
    AND (consumed IS NULL OR {_INT.format("consumed")})
    AND typeof(extra) = 'text' AND json_valid(extra) AND json_type(extra) = 'object'))
 + (SELECT count(*) FROM totals WHERE NOT ({_INT.format("bytes")}))
 + (SELECT count(*) FROM settings WHERE NOT ({_INT.format("value")}))
 + (SELECT count(*) FROM changes WHERE NOT (typeof(path) = 'text' AND present IN (0, 1)
    AND {_INT.format("bytes")} AND {_INT.format("index_bytes")}))
 + ((SELECT count(*) FROM totals) != 1)
 + ((SELECT bytes FROM totals) != (SELECT coalesce(sum(present * (bytes + index_bytes)), 0)
    FROM shards))"""
# The change log keeps this many entries (trimmed at each commit); a process further
# behind reloads the whole set. Small: the log's pages count against the budget.
_CHANGES_KEPT = 256
_PAGE = 64  # eviction candidates read at a time
_COLUMNS = ("seen", "published", "used", "uses", "reads", "consumed")
_META = "seen, published, used, uses, reads, consumed, extra"  # what _meta() reads
# A published shard found on disk: present with these sizes (its history, if any, stays).
_FOUND = (
    "INSERT INTO shards(path, present, bytes, index_bytes, published, used) "
    "VALUES (?, 1, ?, ?, ?, ?) ON CONFLICT(path) DO UPDATE SET present = 1, "
    "bytes = excluded.bytes, index_bytes = excluded.index_bytes"
)


class Store:
    """The per-shard state of one cache directory (see the module doc).

    Args:
        path: the database file (``.recordkit-cache/state.db``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._present: dict[str, tuple[int, int]] | None = None
        self._seq = 0  # the last change applied to _present
        # True once this process created (or rebuilt) the database: its content is
        # not known yet, and the directory must be adopted (CacheDir.scan does).
        self.fresh = False

    @property
    def files(self) -> tuple[str, str, str]:
        """The database and its WAL and shared-memory files."""
        return self.path, self.path + "-wal", self.path + "-shm"

    # -- opening -------------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        # A connection must not cross a fork (DataLoader workers): each process opens its own.
        if self._conn is None or self._pid != os.getpid():
            self._conn = self._open()
            self._pid = os.getpid()
            self._present = None
        return self._conn

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=60.0, isolation_level=None, check_same_thread=False
        )
        try:
            # Small pages: the database's and the WAL's bytes count against the budget,
            # and an event changes a row or two. (Takes effect only on a new database.)
            conn.execute("PRAGMA page_size=1024")
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint=0")  # we checkpoint (see _commit)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if tables:
                    raise sqlite3.DatabaseError("tables of an unknown layout")
                conn.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version={_LAYOUT}; COMMIT;")
                self.fresh = True
            elif version != _LAYOUT:
                raise sqlite3.DatabaseError(f"layout {version}, expected {_LAYOUT}")
            ok = conn.execute("PRAGMA integrity_check(1)").fetchone()[0]
            if ok != "ok":
                raise sqlite3.DatabaseError(ok)
            conn.execute("SELECT bytes FROM totals WHERE id = 0").fetchone()[0]
            bad = conn.execute(_WRONG_SHAPE).fetchone()[0]
            if bad:  # sqlite keeps any value in any column: another program's rows
                raise sqlite3.DatabaseError(f"{bad} value(s) of the wrong type or range")
            for table, column in (("shards", "path"), ("shards", "extra"), ("changes", "path")):
                for (raw,) in conn.execute(f"SELECT CAST({column} AS BLOB) FROM {table}"):
                    bytes(raw).decode("utf-8")  # sqlite does not check; Python would, later
        except BaseException:
            conn.close()
            raise
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except (sqlite3.DatabaseError, TypeError, ValueError) as exc:
            log.warning(
                "cache state %s is unreadable (%s); rebuilding it from the directory",
                self.path,
                exc,
            )
        for p in self.files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        return self._connect()

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._db()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute(
                    "DELETE FROM changes WHERE seq <= (SELECT max(seq) FROM changes) - ?",
                    (_CHANGES_KEPT,),
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if "full" not in str(exc):
                raise
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise CacheFullError(
                f"the disk under {os.path.dirname(os.path.dirname(self.path))} is full: the "
                f"cache's state could not be saved ({exc})"
            ) from exc
        try:
            wal = os.path.getsize(self.path + "-wal")
        except FileNotFoundError:
            wal = 0
        if wal > WAL_LIMIT:
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.OperationalError as exc:  # a full disk: the next commit tries again
                log.warning("cache state %s: checkpoint failed (%s)", self.path, exc)

    # -- reading -------------------------------------------------------------------------------

    def present(self) -> dict[str, tuple[int, int]]:
        """Published shards: path -> (shard bytes, index bytes).

        Kept in memory and brought up to date from the change log (what any process
        changed since this one last looked), so a call costs the changes, not the
        shards; a process too far behind the log's kept entries reloads the set."""
        conn = self._db()
        if self._present is not None:
            rows = conn.execute(
                "SELECT seq, path, present, bytes, index_bytes FROM changes WHERE seq > ? "
                "ORDER BY seq",
                (self._seq,),
            ).fetchall()
            if not rows or rows[0][0] == self._seq + 1:
                for seq, path, present, nbytes, index_bytes in rows:
                    if present:
                        self._present[path] = (int(nbytes), int(index_bytes))
                    else:
                        self._present.pop(path, None)
                    self._seq = seq
                return self._present
        own = not conn.in_transaction
        if own:
            conn.execute("BEGIN")  # one snapshot: the set and the log position agree
        try:
            seq = conn.execute("SELECT coalesce(max(seq), 0) FROM changes").fetchone()[0]
            found = conn.execute("SELECT path, bytes, index_bytes FROM shards WHERE present = 1")
            self._present = {p: (int(b), int(i)) for p, b, i in found}
        finally:
            if own:
                conn.execute("COMMIT")
        self._seq = int(seq)
        return self._present

    def logical_bytes(self) -> int:
        """The database's size with every committed page in place (WAL included)."""
        db = self._db()
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        return int(pages) * int(db.execute("PRAGMA page_size").fetchone()[0])

    def shard_bytes(self) -> int:
        """Bytes of the published shards and their indexes (a running total)."""
        return int(self._db().execute("SELECT bytes FROM totals").fetchone()[0])

    def setting(self, key: str) -> int:
        row = self._db().execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def meta(self, rel: str) -> dict[str, Any]:
        """What is known of one shard (empty if nothing): its history and publish extras."""
        row = self._db().execute(f"SELECT {_META} FROM shards WHERE path = ?", (rel,)).fetchone()
        return {} if row is None else _meta(row)

    def metas(self) -> dict[str, dict[str, Any]]:
        """Every shard's :meth:`meta` (a full read: for gc, not per event)."""
        rows = self._db().execute(f"SELECT {_META}, path FROM shards")
        return {row[7]: _meta(row) for row in rows}

    def seen(self, *, absent: bool = False) -> dict[str, int]:
        """How often each shard was fetched (shards never fetched are left out; with
        ``absent``, published ones too: the fill order needs only the others)."""
        where = "seen > 0 AND present = 0" if absent else "seen > 0"
        rows = self._db().execute(f"SELECT path, seen FROM shards WHERE {where}")
        return {p: int(n) for p, n in rows}

    def records(self) -> dict[str, int]:
        """The record count each published shard's publish recorded."""
        rows = self._db().execute(
            "SELECT path, json_extract(extra, '$.records') FROM shards WHERE present = 1"
        )
        return {p: int(n or 0) for p, n in rows}

    def victims(self, policy: str, *, displace: bool) -> Iterator[tuple[str, int]]:
        """Published shards in eviction order with their bytes (pins not applied):
        consumed this epoch first (``consumed-lru``), then least recently used.
        With ``displace``, only shards read (``consumed-lru``) or used (``lru``) since
        they arrived. Read lazily, a batch at a time, along an index."""
        used = "reads" if policy == "consumed-lru" else "uses"
        extra = f" AND {used} > 0" if displace else ""
        if policy == "consumed-lru":
            epoch = self.setting("epoch")  # the latest epoch any snapshot was taken for
            yield from self._by_lru(f"consumed = ?{extra}", (epoch,))
            yield from self._by_lru(f"(consumed IS NULL OR consumed != ?){extra}", (epoch,))
        else:
            yield from self._by_lru(f"1{extra}", ())

    def _by_lru(self, where: str, args: tuple[Any, ...]) -> Iterator[tuple[str, int]]:
        # Keyset pages: shards evicted between two pages leave the set without
        # shifting the rest (the caller holds the directory lock: nothing else moves).
        after: tuple[Any, ...] = ()
        db = self._db()
        while True:
            cond = f"present = 1 AND {where}"
            if after:
                cond += " AND (used, published, path) > (?, ?, ?)"
            rows = db.execute(
                f"SELECT path, bytes + index_bytes, used, published FROM shards "
                f"WHERE {cond} ORDER BY used, published, path LIMIT {_PAGE}",
                (*args, *after),
            ).fetchall()
            for path, size, _, _ in rows:
                yield str(path), int(size)
            if len(rows) < _PAGE:
                return
            last = rows[-1]
            after = (last[2], last[3], last[0])

    def max_ratio(self, plan: str) -> float | None:
        """The largest (shard + index bytes) / source bytes of shards produced by ``plan``."""
        db = self._db()
        row = db.execute(
            "SELECT max((json_extract(extra, '$.bytes') "
            "+ coalesce(json_extract(extra, '$.index_bytes'), 0)) * 1.0 "
            "/ json_extract(extra, '$.source_bytes')) FROM shards "
            "WHERE json_extract(extra, '$.plan') = ? "
            "AND json_extract(extra, '$.source_bytes') > 0 "
            "AND json_extract(extra, '$.bytes') IS NOT NULL",
            (plan,),
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    # -- changing ------------------------------------------------------------------------------

    def published(self, rel: str, nbytes: int, index_bytes: int, extra: dict[str, Any]) -> None:
        """Record a publish: present, fetched once more, fresh for LRU, not yet read."""
        now = time.time()
        with self._write() as db:
            row = db.execute("SELECT extra FROM shards WHERE path = ?", (rel,)).fetchone()
            merged = {**(_loads(row[0]) if row else {}), **extra}
            db.execute(
                "INSERT INTO shards(path, present, bytes, index_bytes, seen, published, used, "
                "uses, reads, consumed, extra) VALUES (?, 1, ?, ?, 1, ?, ?, 0, 0, NULL, ?) "
                "ON CONFLICT(path) DO UPDATE SET present = 1, bytes = excluded.bytes, "
                "index_bytes = excluded.index_bytes, seen = seen + 1, "
                "published = excluded.published, used = excluded.used, uses = 0, reads = 0, "
                "consumed = NULL, extra = excluded.extra",
                (rel, nbytes, index_bytes, now, now, json.dumps(merged, sort_keys=True)),
            )

    def adopt(self, found: dict[str, tuple[int, int]], foreign: int) -> None:
        """Make the published set what a directory walk ``found`` (path -> sizes), and
        record the bytes of files that are not the cache's (``foreign``)."""
        with self._write() as db:
            have = dict(self.present())
            for rel in set(have) - set(found):
                db.execute("UPDATE shards SET present = 0 WHERE path = ?", (rel,))
            for rel, (nbytes, index_bytes) in found.items():
                if have.get(rel) != (nbytes, index_bytes):
                    db.execute(_FOUND, (rel, nbytes, index_bytes, time.time(), time.time()))
            db.execute("UPDATE settings SET value = ? WHERE key = 'foreign'", (foreign,))

    def found(self, rel: str, nbytes: int, index_bytes: int) -> None:
        """Record a published shard found on disk (its history, if any, stays)."""
        now = time.time()
        with self._write() as db:
            db.execute(_FOUND, (rel, nbytes, index_bytes, now, now))

    def vouch(self, rel: str, crc32c: int) -> None:
        """Record the CRC32C a re-adopted shard was found to have (it is not read again)."""
        now = time.time()
        with self._write() as db:  # the row may not be there yet (adopt() follows gc's check)
            db.execute(
                "INSERT INTO shards(path, present, bytes, index_bytes, published, used, extra) "
                "VALUES (?, 0, 0, 0, ?, ?, json_object('crc32c', ?)) ON CONFLICT(path) DO "
                "UPDATE SET extra = "
                "json_set(extra, '$.crc32c', json_extract(excluded.extra, '$.crc32c'))",
                (rel, now, now, crc32c),
            )

    def evicted(self, rel: str) -> None:
        """Record that a shard's files were removed (its history stays)."""
        with self._write() as db:
            db.execute("UPDATE shards SET present = 0 WHERE path = ?", (rel,))

    def touch(self, rels: Iterable[str], *, epoch: int | None, consumed: bool) -> None:
        """Record a use (for LRU) and, with ``consumed``, a read in ``epoch``."""
        now = time.time()
        with self._write() as db:
            current = self.setting("epoch")
            if epoch is not None and epoch > current:
                # a new epoch: last epoch's consumption stops counting
                db.execute("UPDATE settings SET value = ? WHERE key = 'epoch'", (epoch,))
                current = epoch
            if consumed:
                mark = current if epoch is None else epoch
                db.executemany(
                    "UPDATE shards SET used = ?, uses = uses + 1, reads = reads + 1, "
                    "consumed = ? WHERE path = ?",
                    ((now, mark, rel) for rel in rels),
                )
            else:
                db.executemany(
                    "UPDATE shards SET used = ?, uses = uses + 1 WHERE path = ?",
                    ((now, rel) for rel in rels),
                )

    def import_history(self, shards: dict[str, Any], epoch: int) -> int:
        """Take over the per-shard history of a pre-sqlite ``state.json``; returns the
        number of shards taken (entries of the wrong shape are skipped)."""
        n = 0
        with self._write() as db:
            for rel, m in shards.items():
                row = _history_row(rel, m)
                if row is None:
                    continue
                db.execute(
                    "INSERT OR IGNORE INTO shards(path, seen, published, used, uses, reads, "
                    "consumed, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
                n += 1
            epoch = epoch if _count(epoch) is not None else 0
            db.execute("UPDATE settings SET value = ? WHERE key = 'epoch'", (epoch,))
        return n


def _count(value: Any) -> int | None:
    """``value`` as a count the store keeps (an integral number in [0, 2**53)), or None."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = type(value) is int and 0 <= value < 1 << 53
    return value if ok else None


def _history_row(rel: Any, m: Any) -> tuple[Any, ...] | None:
    """A row for a ``state.json`` entry, or ``None`` for one of the wrong shape."""
    if not isinstance(rel, str) or not isinstance(m, dict):
        return None
    try:
        rel = normalize_shard_path(rel)
    except RecordkitError:
        return None
    counts = [_count(m.get(c, 0) or 0) for c in ("seen", "uses", "reads")]
    times = [m.get(c, 0) or 0 for c in ("published", "used")]
    consumed = m.get("consumed")
    if any(c is None for c in counts) or (consumed is not None and _count(consumed) is None):
        return None
    if not all(type(t) in (int, float) and abs(t) < 1e18 for t in times):
        return None  # (NaN fails the comparison too)
    try:
        extra = {k: v for k, v in m.items() if k not in _COLUMNS}
        text = json.dumps(extra, allow_nan=False, sort_keys=True)
    except ValueError:
        return None
    seen, uses, reads = counts
    published, used = (float(t) for t in times)
    return (rel, seen, published, used, uses, reads, _count(consumed), text)


def _loads(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _meta(row: tuple[Any, ...]) -> dict[str, Any]:
    out: dict[str, Any] = _loads(row[6])
    out.update(seen=row[0], published=row[1], used=row[2], uses=row[3], reads=row[4])
    if row[5] is not None:
        out["consumed"] = row[5]
    return out
