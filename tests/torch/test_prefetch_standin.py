"""The accelerator path of DevicePrefetcher on the CPU, with a stand-in for ``torch.cuda``.

No GPU runs here, so :class:`FakeCuda` plays the device's torch module with
CUDA's semantics where they matter to the prefetcher: events complete late (a
copy "happens" when its event completes, so its host source must still be
alive then), the current device is per thread and any device call opens a
context on it, and the stream a consumer waits on is the thread's current
one. Copies go to the ``meta`` device. The real copier, producer thread and
readers run; what they do with the stand-in is checked.
"""

import gc
import logging
import threading
import time
import weakref

import numpy as np
import pytest

import recordkit as rk
from recordkit.reader import ReadOptions

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

from recordkit.torch import (  # noqa: E402
    DataLoader,
    DevicePrefetcher,
    RecordDataset,
    RecordMapDataset,
    prefetch,
)
from recordkit.torch import devcopy as _devcopy  # noqa: E402
from tests.standin_cuda import LATE, FakeCuda, install  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    f = FakeCuda(devices=2)
    install(f, monkeypatch.setattr)
    return f


def _check(fake, batches, stream=None):
    """Every copy's source outlived it; each batch waited on and recorded on ``stream``."""
    stream = stream or fake.default
    assert fake.problems == []
    assert all(e.done for e in fake.events)  # finished before the loader was closed
    assert [e for e in stream.waited] == fake.events[: len(stream.waited)]
    assert len(stream.waited) == len(batches) == len(fake.events)
    recorded = {i: s for i, s in fake.recorded}
    for b in batches:
        for t in b.values() if isinstance(b, dict) else b:
            if isinstance(t, torch.Tensor):
                assert t.device.type == "meta"
                assert recorded[id(t)] is stream


def _write(root, record_bytes, n):
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, record_bytes + 4096, dtype=np.uint8).tobytes()
    schema = rk.Schema(idx=rk.Int64(), data=rk.Bytes(), vec=rk.Float32((4,)))
    with rk.Writer(root, schema, max_records=max(2, n // 3)) as w:
        for i in range(n):
            size = record_bytes - (i % 7)  # padded bytes of varying width
            w.write({"idx": i, "data": pool[i : i + size], "vec": np.full(4, i, np.float32)})
    return root


# (record bytes, records, batch size): 600 kB at batch 8 makes one batch per
# loader-process chunk, the case that held all four shared-memory slots.
SIZES = {"100B": (100, 600, 64), "600kB": (600_000, 64, 8), "8MB": (8 << 20, 5, 1)}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("standin")
    return {name: _write(root / name, *spec[:2]) for name, spec in SIZES.items()}


def _collate(samples):
    return {
        "idx": torch.tensor([int(s["idx"]) for s in samples]),
        "data": [s["data"] for s in samples],
        "vec": torch.stack([torch.as_tensor(s["vec"]) for s in samples]),
    }


def _loader(kind, path, batch, monkeypatch):
    if kind == "threads":  # the Python thread pool
        monkeypatch.setenv("RECORDKIT_NATIVE_TASKS", "0")
        return RecordDataset(path, batch_size=batch, options=ReadOptions(num_threads=2))
    if kind == "native":  # the native task runner
        return RecordDataset(path, batch_size=batch, options=ReadOptions(num_threads=2))
    if kind == "process":
        return RecordDataset(
            path, batch_size=batch, options=ReadOptions(reader_process=True, num_threads=2)
        )
    if kind == "workers":
        ds = RecordDataset(path, batch_size=batch, options=ReadOptions(num_threads=1))
        return DataLoader(ds, num_workers=2)
    return torch.utils.data.DataLoader(
        RecordMapDataset(path), batch_size=batch, shuffle=True, collate_fn=_collate
    )


READERS = ["threads", "native", "process", "workers", "map"]


def _run(fake, loader, depth):
    """The record ids the consumer got, as copied to the (stand-in) device."""
    pf = DevicePrefetcher(loader, "cuda", depth=depth)
    got = list(pf)
    _check(fake, got)
    return sorted(int(i) for b in got for i in fake.values[id(b["idx"])].tolist())


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_large_records_late_copies(fake, datasets, monkeypatch, reader, depth):
    _, n, batch = SIZES["600kB"]
    assert _run(fake, _loader(reader, datasets["600kB"], batch, monkeypatch), depth) == list(
        range(n)
    )


@pytest.mark.parametrize("size", ["100B", "8MB"])
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_small_and_huge_records(fake, datasets, monkeypatch, reader, size):
    _, n, batch = SIZES[size]
    assert _run(fake, _loader(reader, datasets[size], batch, monkeypatch), 2) == list(range(n))


class Recycling:
    """Batches from one reused host buffer per pair of steps, tracked by weak references."""

    def __init__(self, n=12, size=1 << 16):
        self.n, self.size, self.refs = n, size, []

    def __iter__(self):
        for i in range(self.n):
            t = torch.full((self.size,), i, dtype=torch.int32)
            self.refs.append(weakref.ref(t))
            yield {"x": t, "i": i}


def test_host_batches_held_only_while_copies_are_pending(fake):
    loader = Recycling()
    pf = DevicePrefetcher(loader, "cuda", depth=4)
    it = iter(pf)
    for _ in range(8):
        next(it)
        time.sleep(LATE / 4)
    gc.collect()
    alive = sum(r() is not None for r in loader.refs)
    # queued (depth 4) and copied ahead: only the pending copies' sources may be held
    assert alive <= 3, alive
    pf.close()
    gc.collect()
    assert all(r() is None for r in loader.refs)  # close() lets go of every host batch
    assert fake.problems == []


def test_user_stream_current_at_next(fake):
    user = fake.Stream()
    got = []
    with fake.stream(user):
        for b in DevicePrefetcher(Recycling(), "cuda"):
            got.append(b)
    _check(fake, [{"x": b["x"]} for b in got], stream=user)
    assert fake.default.waited == []


def test_device_resolved_at_first_pass_and_set_in_producer(fake):
    pf = DevicePrefetcher(Recycling(), "cuda")  # made before set_device, as often happens
    fake.contexts.clear()
    fake.set_device(1)
    got = list(pf)
    assert pf.device == torch.device("cuda", 1)
    assert fake.contexts == {1}, "a device call was made with device 0 current"
    _check(fake, [{"x": b["x"]} for b in got])
    pinned = DevicePrefetcher(Recycling(), "cuda:0")
    assert pinned.device == torch.device("cuda", 0)


def test_padded_bytes_rows_are_copied_whole_not_staged(fake, monkeypatch):
    base = torch.arange(6 * 10, dtype=torch.uint8).reshape(6, 10)
    trimmed = base[1:5, :7]
    rows = _devcopy.full_rows(trimmed)
    assert rows is not None and rows.shape == (4, 10) and rows.data_ptr() == trimmed.data_ptr()
    assert torch.equal(rows[:, :7], trimmed)
    assert _devcopy.full_rows(base[:, :3]) is None  # rows 3x wider: staging moves fewer bytes
    assert _devcopy.full_rows(base[:5, 2:9]) is not None  # offset rows end inside the storage
    assert _devcopy.full_rows(base[:, 2:9]) is None  # the last full row would run past it
    assert _devcopy.full_rows(base.t()) is None
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    copier = _devcopy.StreamCopier(torch, fake, torch.device("cuda", 0), 3, True, True)
    copier.start()
    ready = copier({"data": trimmed, "n": torch.arange(4)})
    assert copier.slots[0].arena is None  # nothing staged
    assert ready.batch["data"].shape == (4, 7) and ready.batch["data"].is_contiguous()
    (sources,) = [s for _, s in copier.pending]
    assert [tuple(s.shape) for s in sources] == [(4, 10), (4,)]
    copier.finish()
    assert fake.problems == [] and not copier.pending


def test_new_pass_does_not_share_a_stuck_pass_copier(fake, monkeypatch, caplog):
    monkeypatch.setattr(prefetch, "_JOIN_SECONDS", 0.2)
    gate, reached = threading.Event(), threading.Event()

    class Stuck:
        def __init__(self):
            self.passes = 0

        def __iter__(self):
            self.passes += 1
            stuck = self.passes == 1
            for i in range(6):
                if stuck and i == 2:
                    reached.set()
                    gate.wait(30)
                yield {"x": torch.full((1 << 14,), i)}

    loader = Stuck()
    pf = DevicePrefetcher(loader, "cuda")
    first = iter(pf)
    next(first)
    assert reached.wait(10)
    with caplog.at_level(logging.WARNING, "recordkit.torch.prefetch"):
        second = list(pf)  # closes the first pass; its thread stays stuck
    assert "still running" in caplog.text
    gate.set()
    assert [int(b["x"].shape[0]) for b in second] == [1 << 14] * 6
    deadline = time.monotonic() + 10
    while [t for t in threading.enumerate() if t.name == "recordkit-prefetch"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert fake.problems == []


def test_loader_close_failure_is_raised():
    class BadClose:
        def __iter__(self):
            return self

        def __next__(self):
            raise StopIteration

        def close(self):
            raise OSError("could not stop the reader")

    with pytest.raises(OSError, match="could not stop"):
        list(DevicePrefetcher(BadClose(), "cpu"))


def test_devices_without_streams_copy_synchronously():
    loader = Recycling(n=4)
    got = list(DevicePrefetcher(loader, "meta"))
    assert [b["x"].device.type for b in got] == ["meta"] * 4
    assert _devcopy.device_module(torch, "meta") is None
    assert _devcopy.device_module(torch, "mps") is None  # events, but no streams
    if not torch.backends.mps.is_available():
        with pytest.raises(RuntimeError, match="MPS is not available"):
            DevicePrefetcher([], "mps")


def test_pinned_allocation_falls_back_once(monkeypatch, caplog):
    monkeypatch.setattr(_devcopy, "_fallback_logged", False)
    real = torch.empty

    def empty(*args, pin_memory=False, **kwargs):
        if pin_memory:
            raise RuntimeError("no pinned memory allocator")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    with caplog.at_level(logging.INFO, "recordkit.torch.prefetch"):
        a = _devcopy.pinned_slab(1 << 12)
        b = _devcopy.pinned_empty(torch, 10)
    assert a.nbytes == 1 << 12 and b.device.type == "cpu" and b.numel() == 10
    lines = [r for r in caplog.records if "pinned memory is not available" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


def test_mps_tensor_from_pinned_allocation_falls_back(monkeypatch):
    monkeypatch.setattr(_devcopy, "_fallback_logged", False)
    real = torch.empty
    monkeypatch.setattr(
        torch,
        "empty",
        lambda *a, pin_memory=False, **k: real(*a, **k).to("meta") if pin_memory else real(*a, **k),
    )
    assert _devcopy.pinned_slab(64).nbytes == 64  # would fail in .numpy() on a device tensor


@pytest.mark.parametrize(
    ("accelerator", "pins"), [(None, False), ("cuda", True), ("xpu", True), ("mps", False)]
)
def test_pin_only_for_accelerators_with_a_pinned_allocator(monkeypatch, accelerator, pins):
    dev = None if accelerator is None else torch.device(accelerator)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: dev)
    assert _devcopy.can_pin() is pins
