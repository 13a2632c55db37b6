"""RecordDataset(reader_process=True): a loader process hands chunks over through shared memory."""

import gc
import glob
import os
import signal
import time
import warnings

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import CorruptRecordError, LoaderTimeoutError
from recordkit.reader import ReadOptions

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

from recordkit.torch import DataLoader, DevicePrefetcher, RecordDataset  # noqa: E402

SCHEMA = rk.Schema(
    idx=rk.Int64(),
    data=rk.Bytes(),
    img=rk.Tensor("uint8", (4, 4)),
    var=rk.Float32((None,)),
)
N = 700


def _sample(i):
    return {
        "idx": i,
        "data": bytes([i % 251]) * (i % 23),
        "img": np.full((4, 4), i % 256, np.uint8),
        "var": np.arange(i % 5, dtype=np.float32),
    }


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("proc") / "ds"
    with rk.Writer(root, SCHEMA, max_records=200) as w:
        for i in range(N):
            w.write(_sample(i))
    return root


def _segments():
    return set(glob.glob(f"/dev/shm/rk_{os.getpid()}_*"))


@pytest.fixture(autouse=True)
def no_leftovers():
    before = _segments()
    yield
    gc.collect()
    assert _segments() <= before, "shared-memory segments left behind"


def test_segments_are_visible_while_reading(ds_path):
    it = iter(RecordDataset(ds_path, batch_size=64, options=ReadOptions(reader_process=True)))
    next(it)
    assert _segments()  # so the leftover check above looks at the right names
    it.close()


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], list):
                assert len(x[k]) == len(y[k])
                for p, q in zip(x[k], y[k]):
                    assert p == q if isinstance(p, bytes) else torch.equal(p, q), k
            else:
                assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("bytes_as", ["padded", "list"])
def test_same_batches_as_threads(ds_path, bytes_as):
    kw = dict(batch_size=64, shuffle=True, seed=4)
    want = list(RecordDataset(ds_path, **kw, options=ReadOptions(bytes_as=bytes_as)))
    process = ReadOptions(bytes_as=bytes_as, reader_process=True, num_threads=2)
    ds = RecordDataset(ds_path, **kw, options=process)
    got = list(ds)
    _equal(got, want)
    assert ds.stats.records == N and ds.stats.bytes > 0 and ds.epoch == 1
    assert list(ds)  # the next epoch starts a fresh loader process


def test_samples_and_columns(ds_path):
    want = list(RecordDataset(ds_path, columns=["idx", "data"]))
    got = list(
        RecordDataset(ds_path, columns=["idx", "data"], options=ReadOptions(reader_process=True))
    )
    assert len(got) == N
    assert [s["data"] for s in got] == [s["data"] for s in want]
    assert [int(s["idx"]) for s in got] == list(range(N))


def test_resume(ds_path):
    kw = dict(batch_size=50, shuffle=True, seed=1, options=ReadOptions(reader_process=True))
    everything = [int(i) for b in RecordDataset(ds_path, **kw) for i in b["idx"]]
    loader = DataLoader(RecordDataset(ds_path, **kw))
    seen = []
    for step, b in enumerate(loader):
        seen += b["idx"].tolist()
        if step == 4:
            state = loader.state_dict()
            break
    loader2 = DataLoader(RecordDataset(ds_path, **kw))
    loader2.load_state_dict(state)
    assert seen + [int(i) for b in loader2 for i in b["idx"]] == everything


def test_batches_outlive_the_loader_process(ds_path):
    ds = RecordDataset(ds_path, batch_size=100, options=ReadOptions(reader_process=True))
    kept = [b["img"] for b in ds]  # 7 batches in few chunks: fewer than the slots
    assert [int(t[0, 0, 0]) for t in kept] == [(100 * k) % 256 for k in range(7)]


@pytest.fixture(scope="module")
def big_path(tmp_path_factory):
    """100 KiB records: a task (chunk) holds ~8 MiB, 10 batches of 8; 420 records: 6 chunks."""
    root = tmp_path_factory.mktemp("proc") / "big"
    schema = rk.Schema(idx=rk.Int64(), data=rk.Bytes())
    with rk.Writer(root, schema) as w:
        for i in range(420):
            w.write({"idx": i, "data": bytes([i % 256]) * (100 << 10)})
    return root


def test_holding_every_slot_is_an_error_not_a_hang(big_path):
    # Keeping every batch holds every slot (4): asking for more is an error.
    ds = RecordDataset(big_path, batch_size=8, options=ReadOptions(reader_process=True))
    kept = []
    with pytest.raises(RuntimeError, match="all 4 shared-memory slots are held"):
        for b in ds:
            kept.append(b)
    # Chunks (slots) of 1, 2, 4 and 8 batches first (the reader's slow start): 15 held.
    assert 15 <= len(kept) < 53
    # Dropping them frees the slots: a new pass reads everything.
    del kept, b
    assert sum(len(b["idx"]) for b in ds) == 420


def _loader_children():
    """PIDs of this process's recordkit loader processes (from /proc)."""
    pids = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        with open(path) as f:
            pids |= {int(p) for p in f.read().split()}
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_child_entry" in f.read():
                    found.append(pid)
        except FileNotFoundError:
            pass
    return found


def test_closing_mid_epoch_stops_the_process(ds_path):
    ds = RecordDataset(ds_path, batch_size=16, options=ReadOptions(reader_process=True))
    it = iter(ds)
    next(it)
    assert len(_loader_children()) == 1
    it.close()
    assert _loader_children() == []


def test_corrupt_records(tmp_path):
    root = tmp_path / "bad"
    with rk.Writer(root, SCHEMA, max_records=1000) as w:
        for i in range(300):
            w.write(_sample(i))
    shard = next(root.glob("*.tfrecord"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(CorruptRecordError, match=r"\.tfrecord:\d+:\d+"):
        list(
            RecordDataset(
                root, batch_size=32, schema=SCHEMA, options=ReadOptions(reader_process=True)
            )
        )
    ds = RecordDataset(
        root,
        batch_size=32,
        schema=SCHEMA,
        options=ReadOptions(reader_process=True, on_error="skip"),
    )
    assert sum(len(b["idx"]) for b in ds) == 299 and ds.stats.skipped == 1
    ds = RecordDataset(
        root,
        batch_size=32,
        schema=SCHEMA,
        options=ReadOptions(reader_process=True, on_error="warn"),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sum(len(b["idx"]) for b in ds) == 299
    assert any("skipping corrupt record" in str(w.message) for w in caught)


def test_with_prefetcher(ds_path):
    want = list(RecordDataset(ds_path, batch_size=64))
    got = list(
        DevicePrefetcher(
            RecordDataset(ds_path, batch_size=64, options=ReadOptions(reader_process=True)), "cpu"
        )
    )
    _equal(got, want)


def test_not_inside_dataloader_workers(ds_path):
    loader = torch.utils.data.DataLoader(
        RecordDataset(ds_path, batch_size=64, options=ReadOptions(reader_process=True)),
        batch_size=None,
        num_workers=1,
        multiprocessing_context="spawn",
    )
    with pytest.raises(ValueError, match="reader_process=True inside DataLoader workers"):
        list(loader)


def test_child_killed_is_an_error(big_path):
    ds = RecordDataset(
        big_path, batch_size=8, options=ReadOptions(reader_process=True, prefetch=1, num_threads=1)
    )
    it = iter(ds)
    next(it)
    (pid,) = _loader_children()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(rk.errors.RecordkitError, match="loader process exited"):
        for _ in it:
            pass
    assert _loader_children() == []


def test_stopped_loader_is_an_error_not_a_hang(big_path):
    # SIGSTOP stands for a loader wedged in uninterruptible I/O on a network file
    # system: alive, but handing nothing over.
    ds = RecordDataset(
        big_path,
        batch_size=8,
        options=ReadOptions(reader_process=True, prefetch=1, num_threads=1, loader_timeout=1.0),
    )
    it = iter(ds)
    next(it)
    (pid,) = _loader_children()
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(LoaderTimeoutError, match=rf"made no progress for 1 s \(pid {pid}\)"):
            for _ in it:
                pass
        assert time.monotonic() - start < 20  # the slots it had filled, then 1 s
        assert isinstance(LoaderTimeoutError("x"), TimeoutError)
        assert _loader_children() == []  # killed and reaped
    finally:
        if pid in _loader_children():  # only if the test failed: never leave it stopped
            os.kill(pid, signal.SIGKILL)


def test_loader_timeout_is_validated(ds_path):
    with pytest.raises(ValueError, match="loader_timeout must be > 0 or None"):
        RecordDataset(ds_path, options=ReadOptions(reader_process=True, loader_timeout=0))
    ds = RecordDataset(
        ds_path, batch_size=64, options=ReadOptions(reader_process=True, loader_timeout=None)
    )
    assert sum(len(b["idx"]) for b in ds) == N
