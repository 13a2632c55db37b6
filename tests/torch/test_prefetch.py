"""DevicePrefetcher: order, errors, thread lifetime, state; on CUDA, values, overlap and memory."""

import gc
import threading
import time
from collections import namedtuple

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import CorruptRecordError
from recordkit.reader import ReadOptions

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

from recordkit.reader.buffers import BufferPool  # noqa: E402
from recordkit.torch import DataLoader, DevicePrefetcher, RecordDataset  # noqa: E402

SCHEMA = rk.Schema(idx=rk.Int64(), data=rk.Bytes(), img=rk.Tensor("float32", (16, 16)))
N = 300
CUDA = torch.cuda.is_available()


def _sample(i):
    return {
        "idx": i,
        "data": bytes([i % 251]) * (i % 29),
        "img": np.full((16, 16), i, np.float32),
    }


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefetch") / "ds"
    with rk.Writer(root, SCHEMA, max_records=64) as w:
        for i in range(N):
            w.write(_sample(i))
    return root


def _ids(batches):
    return [int(i) for b in batches for i in b["idx"].tolist()]


def _threads(prefix):
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def _no_threads_left():
    """Prefetch and reader threads are gone (reader threads exit with their executor)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = _threads("recordkit-prefetch") + _threads("recordkit-reader")
        if not left:
            return True
        time.sleep(0.01)
    return False


def _same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


class Counting:
    """An iterable of small tensors that counts what it has produced."""

    def __init__(self, n, fail_at=None):
        self.n, self.fail_at, self.produced = n, fail_at, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise ValueError(f"broken batch {i}")
            self.produced += 1
            yield torch.full((4,), i)


# -- CPU ------------------------------------------------------------------------------------


def test_same_batches_same_order(ds_path):
    want = list(RecordDataset(ds_path, batch_size=32, shuffle=True, seed=3))
    ds = RecordDataset(ds_path, batch_size=32, shuffle=True, seed=3)
    got = list(DevicePrefetcher(ds, "cpu"))
    _same_batches(got, want)
    assert sorted(_ids(got)) == list(range(N))
    assert _no_threads_left()


def test_nested_structures_pass_through():
    Pair = namedtuple("Pair", "x y")
    batches = [
        {"a": torch.arange(3) + i, "b": [torch.ones(2) * i, b"raw"], "c": (i, "s")}
        for i in range(5)
    ]
    batches.append(Pair(torch.zeros(1), [torch.ones(1)]))
    got = list(DevicePrefetcher(batches, "cpu", depth=3))
    assert len(got) == len(batches)
    for g, w in zip(got[:5], batches[:5]):
        assert torch.equal(g["a"], w["a"]) and g["b"][1] == b"raw" and g["c"] == w["c"]
    assert isinstance(got[5], Pair)


def test_loads_depth_ahead_in_the_background():
    loader = Counting(50)
    pf = DevicePrefetcher(loader, "cpu", depth=3)
    it = iter(pf)
    assert int(next(it)[0]) == 0
    # Without another next(), the thread fills the queue (3) and holds one more.
    deadline = time.monotonic() + 10
    while loader.produced < 1 + 3 + 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    assert loader.produced == 1 + 3 + 1
    assert [int(b[0]) for b in it] == list(range(1, 50))
    assert _no_threads_left()


def _overlap_steps(wrap, timeout):
    """Six steps; the loader yields batch i > 0 only while a compute step is running."""
    computing = threading.Event()
    produced = [0]

    class Loader:
        def __iter__(self):
            for i in range(6):
                if i and not computing.wait(timeout):
                    raise AssertionError(f"batch {i} was not loaded during a compute step")
                produced[0] += 1
                yield torch.full((1,), i)

    seen = []
    for batch in wrap(Loader()):
        computing.set()  # the step on this batch runs until the next batch is loaded
        deadline = time.monotonic() + timeout
        while produced[0] < min(len(seen) + 2, 6) and time.monotonic() < deadline:
            time.sleep(0.001)
        computing.clear()
        seen.append(int(batch[0]))
    return seen


def test_loading_overlaps_compute():
    assert _overlap_steps(lambda loader: DevicePrefetcher(loader, "cpu"), 10) == list(range(6))
    # The same loop without the prefetcher loads only between steps, and fails.
    with pytest.raises(AssertionError, match="not loaded during a compute step"):
        _overlap_steps(lambda loader: loader, 0.5)


def test_producer_error_is_raised_in_consumer():
    pf = DevicePrefetcher(Counting(10, fail_at=4), "cpu")
    it = iter(pf)
    assert [int(next(it)[0]) for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="broken batch 4"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert _no_threads_left()


def test_corrupt_record_is_raised_in_consumer(tmp_path):
    root = tmp_path / "bad"
    with rk.Writer(root, SCHEMA, max_records=1000) as w:
        for i in range(200):
            w.write(_sample(i))
    shard = next(root.glob("*.tfrecord"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    ds = RecordDataset(root, batch_size=16, schema=SCHEMA)
    with pytest.raises(CorruptRecordError, match=r"\.tfrecord:\d+:\d+"):
        for _ in DevicePrefetcher(ds, "cpu"):
            pass
    assert _no_threads_left()


@pytest.mark.parametrize("how", ["close", "break", "with"])
def test_closing_mid_epoch_leaves_no_thread(ds_path, how):
    ds = RecordDataset(ds_path, batch_size=8, options=ReadOptions(num_threads=2))
    pf = DevicePrefetcher(ds, "cpu")
    if how == "close":
        it = iter(pf)
        next(it)
        assert _threads("recordkit-prefetch")
        pf.close()
        with pytest.raises(StopIteration):
            next(it)
    elif how == "break":
        for i, _ in enumerate(pf):
            if i == 2:
                break
        gc.collect()  # the iterator is gone with the loop; nothing else holds it
    else:
        with pf:
            next(iter(pf))
    assert _no_threads_left(), threading.enumerate()


def test_dropping_prefetcher_stops_thread(ds_path):
    pf = DevicePrefetcher(RecordDataset(ds_path, batch_size=8), "cpu")
    it = iter(pf)
    next(it)
    del it, pf
    gc.collect()
    assert _no_threads_left(), threading.enumerate()


def test_new_pass_closes_the_previous(ds_path):
    ds = RecordDataset(ds_path, batch_size=50)
    pf = DevicePrefetcher(ds, "cpu")
    first = iter(pf)
    next(first)
    second = list(pf)
    assert first.done and len(_threads("recordkit-prefetch")) == 0
    assert len(second) == len(ds) == 6


def test_len_and_state_dict_pass_through(ds_path):
    ds = RecordDataset(ds_path, batch_size=16, shuffle=True, seed=5)
    everything = _ids(RecordDataset(ds_path, batch_size=16, shuffle=True, seed=5))
    pf = DevicePrefetcher(ds, "cpu", depth=4)
    assert len(pf) == len(ds) == 19
    seen = []
    for step, batch in enumerate(pf):
        seen += batch["idx"].tolist()
        if step == 6:
            time.sleep(0.05)  # let the thread run ahead: the state must not count that
            state = pf.state_dict()
            break
    assert state["consumed"] == 7 and state["epoch"] == 0
    ds2 = RecordDataset(ds_path, batch_size=16, shuffle=True, seed=5)
    pf2 = DevicePrefetcher(ds2, "cpu")
    pf2.load_state_dict(state)
    rest = _ids(pf2)
    assert seen + rest == everything
    assert pf2.state_dict()["epoch"] == 1 and pf2.state_dict()["consumed"] == 0


def test_state_dict_through_recordkit_dataloader(ds_path):
    loader = DataLoader(RecordDataset(ds_path, batch_size=16), num_workers=0)
    pf = DevicePrefetcher(loader, "cpu")
    it = iter(pf)
    for _ in range(3):
        next(it)
    assert pf.state_dict()["consumed"] == 3
    it.close()


def test_state_dict_of_other_loaders_is_taken_per_batch():
    class Stateful:
        def __init__(self):
            self.pos = 0

        def __iter__(self):
            for i in range(20):
                self.pos = i + 1
                yield torch.tensor([i])

        def state_dict(self):
            return {"pos": self.pos}

    pf = DevicePrefetcher(Stateful(), "cpu", depth=5)
    it = iter(pf)
    next(it), next(it)
    time.sleep(0.05)
    assert pf.state_dict() == {"pos": 2}
    it.close()


def test_bad_arguments():
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher([], "cpu", depth=0)
    if not CUDA:
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            DevicePrefetcher([], "cuda")


def test_pin_memory_dataset_without_accelerator_reads_the_same(ds_path):
    want = list(RecordDataset(ds_path, batch_size=32))
    got = list(
        DevicePrefetcher(
            RecordDataset(ds_path, batch_size=32, options=ReadOptions(pin_memory=True)), "cpu"
        )
    )
    _same_batches(got, want)


def test_buffer_pool_custom_allocator():
    made = []

    def allocate(n):
        made.append(np.zeros(n, np.uint8))
        return made[-1]

    pool = BufferPool(allocate=allocate, min_bytes=0)
    a = pool.alloc((10,), np.int64)
    assert len(made) == 1 and a.ctypes.data == made[0].ctypes.data
    a[:] = 7
    del a
    gc.collect()
    b = pool.alloc((10,), np.int64)
    assert len(made) == 1 and b.ctypes.data == made[0].ctypes.data  # reused
    c = pool.alloc((10,), np.int64)
    assert len(made) == 2 and c.ctypes.data != b.ctypes.data  # b still alive
    with pytest.raises(ValueError, match="1-D uint8"):
        BufferPool(allocate=lambda n: np.zeros(n // 8, np.int64)).alloc((1 << 20,), np.uint8)


# -- CUDA -----------------------------------------------------------------------------------


def _cycles_per_ms():
    """Calibrate torch.cuda._sleep: GPU clock cycles per millisecond."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / start.elapsed_time(end)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("pin", [True, False])
def test_cuda_values_equal_host_values(ds_path, pin):
    host = list(RecordDataset(ds_path, batch_size=32, shuffle=True, seed=1))
    ds = RecordDataset(
        ds_path, batch_size=32, shuffle=True, seed=1, options=ReadOptions(pin_memory=pin)
    )
    got = []
    for batch in DevicePrefetcher(ds, "cuda", pin_memory=pin):
        assert all(t.device.type == "cuda" for t in batch.values())
        got.append({k: v.cpu() for k, v in batch.items()})
    _same_batches(got, host)
    assert _no_threads_left()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_step_time_is_max_not_sum():
    """Load 20 ms (host, GIL free) and compute 30 ms (GPU): a step is ~30 ms, not ~50 ms.

    The test compares durations measured in the same run (ratios), not a fixed time.
    """
    load_s, compute_ms, steps = 0.020, 30.0, 20
    cycles = int(_cycles_per_ms() * compute_ms)

    class SlowLoader:
        def __iter__(self):
            for i in range(steps + 1):
                time.sleep(load_s)  # reading / decoding, GIL released
                yield {"x": torch.full((1 << 20,), float(i))}

    def run(batches):
        it = iter(batches)
        first = next(it)
        if first["x"].device.type == "cpu":
            first["x"].cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in it:
            x = b["x"].to("cuda", non_blocking=True)
            torch.cuda._sleep(cycles)
            x.sum().item()  # the step ends when the GPU is done with it
        return (time.perf_counter() - t0) / steps

    plain = run(SlowLoader())
    pf = DevicePrefetcher(SlowLoader(), "cuda")
    overlapped = run(pf)
    ideal = max(load_s, compute_ms / 1e3)
    assert plain > 1.3 * ideal  # the measurement sees the sum without a prefetcher
    assert overlapped <= 1.15 * ideal, (overlapped, ideal, plain)
    assert pf.wait_seconds < steps * load_s / 2


def _pinned(nbytes):
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()


def _want(n, i):
    return int((np.arange(n, dtype=np.int64) ^ i).sum())


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["wait", "keep", "user_stream", "record"])
def test_cuda_races(monkeypatch, case):
    """Deterministic races, one per line that prevents it; checksums of every batch.

    - ``wait``: the side stream's copies run 30 ms late and the consumer reads
      at once: only the consumer stream's ``wait_event`` orders the read after them.
    - ``keep``: copies run late, the consumer synchronizes before reading, and
      the loader drops each pinned buffer before allocating the next, so the
      pool hands it out again at once: only the copier's keep stops the
      rewrite before the late copy has read it.
    - ``user_stream``: as ``wait``, on a stream the user made current around
      the loop: the wait must be on the stream current at ``next()``.
    - ``record``: copies on time; the consumer's stream is busy 30 ms, then
      reads, and the batch is dropped while that read is queued; the producer
      then allocates device memory of the same size: only ``record_stream``
      keeps the allocator from handing the dropped block to the next copy.
    """
    from recordkit.torch import devcopy as _devcopy

    ms, n = _cycles_per_ms(), 1 << 22
    if case != "record":
        call = _devcopy.StreamCopier.__call__

        def late(self, batch):
            with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
                torch.cuda._sleep(int(30 * ms))  # every batch's copies queue behind this
            return call(self, batch)

        monkeypatch.setattr(_devcopy.StreamCopier, "__call__", late)
    pool = BufferPool(allocate=_pinned, min_bytes=0, max_free_bytes=8 * n)

    def batches():  # a slab is rewritten as soon as its lease dies
        for i in range(24):
            a = pool.alloc((n,), np.int32)
            a[:] = np.arange(n, dtype=np.int32) ^ i
            batch = {"x": torch.from_numpy(a), "i": i}
            del a
            yield batch
            del batch  # the loader keeps nothing: only the prefetcher may

    stream = torch.cuda.Stream() if case == "user_stream" else torch.cuda.current_stream()
    got = []
    with torch.cuda.stream(stream):
        for b in DevicePrefetcher(batches(), "cuda"):
            if case == "keep":
                torch.cuda.synchronize()  # no read can overtake a copy: only the keep counts
            if case == "record":
                torch.cuda._sleep(int(30 * ms))  # the consumer is busy, then reads, then drops
            got.append((b["i"], b["x"].to(torch.int64).sum()))
            del b
            if case == "record":
                time.sleep(0.02)  # the producer allocates (the freed block?) and copies
    torch.cuda.synchronize()
    assert len(got) == 24
    bad = [i for i, v in got if int(v) != _want(n, i)]
    assert bad == [], f"batches with wrong contents: {bad}"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_close_frees_device_and_host_memory():
    import weakref

    n, refs = 1 << 20, []
    pool = BufferPool(allocate=_pinned, min_bytes=0)

    def batches():
        for i in range(20):
            a = pool.alloc((n,), np.float32)
            a[:] = i
            batch = {"x": torch.from_numpy(a), "y": torch.full((1000,), i)}  # y is staged
            refs.extend(weakref.ref(t) for t in batch.values() if isinstance(t, torch.Tensor))
            yield batch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    pf = DevicePrefetcher(batches(), "cuda", depth=3)
    it = iter(pf)
    for i in range(5):
        b = next(it)
        assert torch.all(b["x"] == i) and torch.all(b["y"] == i)
    del b
    pf.close()
    torch.cuda.synchronize()
    gc.collect()
    assert torch.cuda.memory_allocated() == base
    assert [r for r in refs if r() is not None] == []  # no host batch held past close()
    stats = torch.cuda.memory_stats()
    assert stats.get("num_alloc_retries", 0) == 0 and stats.get("num_ooms", 0) == 0


_SECOND_GPU = r"""
import sys
import numpy as np
import torch
import recordkit as rk
from recordkit.torch import DevicePrefetcher, ReadOptions, RecordDataset

root = sys.argv[1]
with rk.Writer(root, rk.Schema(x=rk.Tensor("float32", (256,)))) as w:
    for i in range(64):
        w.write({"x": np.full(256, i, np.float32)})
# pinned in reader threads
ds = RecordDataset(root, batch_size=8, options=ReadOptions(pin_memory=True))
staged = [{"y": torch.full((1000,), i)} for i in range(8)]  # pageable: staged
pf = DevicePrefetcher(ds, "cuda")  # made before set_device, resolved at the first pass
torch.cuda.set_device(1)
seen = sorted(int(v) for b in pf for v in b["x"][:, 0].tolist())
assert seen == list(range(64)), seen
assert pf.device == torch.device("cuda", 1), pf.device
for i, b in enumerate(DevicePrefetcher(staged, "cuda")):
    assert b["y"].device == torch.device("cuda", 1) and int(b["y"][0]) == i
torch.cuda.synchronize()
assert not torch._C._cuda_hasPrimaryContext(0), "a context was opened on GPU 0"
print("ok")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_second_gpu_opens_no_context_on_the_first(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _SECOND_GPU, str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
