"""Workloads and the readers ``read_bench.py`` compares, one per fresh process.

Each reader returns an iterator that yields, per batch of 64, the number of records
in it, after the batch has been made into framework tensors (or NumPy arrays) and
touched; the caller times the loop. Heavy imports happen inside the readers: the
``tfrecord`` package and TensorFlow cannot share a process (both register the same
protobuf symbols), and torch is not needed by ``tf.data``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from recordkit.reader import ReadOptions

BATCH = 64

# The default collate makes tensors of read-only arrays (np.frombuffer over bytes) before
# stacking them into a new batch tensor; the warning is about the former, which is never
# written to. Set here, before DataLoader workers fork, so they inherit it.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


@dataclass(frozen=True, slots=True)
class Workload:
    """A synthetic dataset: ``records`` Examples with ``data`` (random bytes), ``label``
    (int64) and, when ``vec`` > 0, ``vec`` (``vec`` float32s)."""

    name: str
    records: int
    payload: int
    vec: int = 0
    shards: int = 8

    def scaled(self, fraction: int) -> Workload:
        return replace(self, records=self.records // fraction)

    @property
    def per_shard(self) -> int:
        return self.records // self.shards

    def spec(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "payload": self.payload,
            "vec": self.vec,
            "shards": self.shards,
        }


WORKLOADS = {
    "W1": Workload("W1", records=8192, payload=256 << 10),  # 2 GiB of 256 KiB records
    "W2": Workload("W2", records=1_000_000, payload=1 << 10, vec=16),  # many small records
}
QUICK_FRACTION = 8


@dataclass(frozen=True, slots=True)
class Files:
    """Where a workload's shards live under the data directory."""

    root: str

    @property
    def tfrecord_dir(self) -> str:
        return os.path.join(self.root, "tfrecord")

    @property
    def wds_dir(self) -> str:
        return os.path.join(self.root, "wds")

    def tfrecords(self, wl: Workload) -> list[str]:
        return [os.path.join(self.tfrecord_dir, f"part-{s:05d}.tfrecord") for s in range(wl.shards)]

    def tars(self, wl: Workload) -> list[str]:
        return [os.path.join(self.wds_dir, f"part-{s:05d}.tar") for s in range(wl.shards)]

    def framed_bytes(self, wl: Workload) -> int:
        return sum(os.path.getsize(f) for f in self.tfrecords(wl))


def files_for(data: str, wl: Workload, quick: bool) -> Files:
    return Files(os.path.join(data, "quick" if quick else "", wl.name))


# -- readers ---------------------------------------------------------------------------------
#
# A reader imports its framework and builds its pipeline when called (outside the
# timed region), and returns the iterator that is timed: from its first ``next()``
# to exhaustion, DataLoader worker start-up and per-worker index loading included.

Reader = Callable[[Workload, Files], Iterator[int]]


def _count(batches: Iterable[Any], label: Callable[[Any], Any]) -> Iterator[int]:
    for batch in batches:
        labels = label(batch)
        int(labels.sum())  # touch the batch; it is already tensors, no copy
        yield int(labels.shape[0])


# Epochs per pass (the GIL run sets it: a training loop iterates one dataset object
# epoch after epoch, so only the first epoch pays for mapping the shards).
EPOCHS = 1


# How a TensorFlow reader's batches are taken (read_bench.py --tf-loop):
# "eager": a Python loop over the dataset takes each batch's tensors, as a custom training
#   loop hands them to a model (``label.numpy()`` touches the batch, as the torch readers'
#   loop does with ``labels.sum()``);
# "numpy": the same loop with ``.numpy()`` of every tensor (NumPy arrays, for a NumPy or
#   torch user). TensorFlow 2.21's ``EagerTensor.numpy()`` copies: a new array each call,
#   1.1-3 ms per 16 MiB here, a copy of every byte for every TensorFlow reader alike (the
#   torch readers' loop copies nothing);
# "graph": a ``tf.function`` takes GRAPH_STEPS batches per call, as Keras ``fit`` with
#   ``steps_per_execution`` does: TensorFlow's cost per batch without Python's.
TF_LOOP = "eager"
GRAPH_STEPS = 64


def _tf_count(ds: Any) -> Iterator[int]:
    if TF_LOOP == "numpy":
        arrays = ({k: v.numpy() for k, v in batch.items()} for batch in ds)
        return _count(arrays, lambda a: a["label"])
    if TF_LOOP == "graph":
        return _graph_count(ds)
    return _count(ds, lambda b: b["label"].numpy())


def _graph_count(ds: Any) -> Iterator[int]:
    import tensorflow as tf

    @tf.function
    def steps(it: Any) -> Any:
        n = tf.constant(0, tf.int64)
        for _ in tf.range(GRAPH_STEPS):
            got = it.get_next_as_optional()
            if not got.has_value():
                break
            labels = got.get_value()["label"]
            n += tf.shape(labels, out_type=tf.int64)[0] + 0 * tf.reduce_sum(labels)
        return n

    it = iter(ds)
    run = steps.get_concrete_function(it)  # traced here, outside the timed loop

    def loop() -> Iterator[int]:
        while n := int(run(it)):
            yield n

    return loop()


def _epochs(ds: Iterable[Any]) -> Iterator[Any]:
    for _ in range(EPOCHS):
        yield from ds


def _recordkit(wl: Workload, files: Files) -> Iterator[int]:
    import recordkit.torch as rkt

    ds = rkt.RecordDataset(files.tfrecord_dir, batch_size=BATCH)
    return _count(_epochs(ds), lambda b: b["label"])


def _recordkit_shuffle(wl: Workload, files: Files) -> Iterator[int]:
    """``RecordDataset(shuffle=True)``: the default shuffle (see ``shuffle_bench.py``)."""
    import recordkit.torch as rkt

    ds = rkt.RecordDataset(files.tfrecord_dir, batch_size=BATCH, shuffle=True, seed=0)
    return _count(_epochs(ds), lambda b: b["label"])


def _recordkit_bytes_list(wl: Workload, files: Files) -> Iterator[int]:
    """``ReadOptions(bytes_as="list")``: each ``Bytes()`` value a ``bytes`` object, as
    tf.data's ``tf.string`` holds one per value (the like-for-like layout)."""
    import recordkit.torch as rkt
    from recordkit.reader import ReadOptions

    options = ReadOptions(bytes_as="list")
    ds = rkt.RecordDataset(files.tfrecord_dir, batch_size=BATCH, options=options)
    return _count(_epochs(ds), lambda b: b["label"])


def _recordkit_pool(wl: Workload, files: Files) -> Iterator[int]:
    """``RecordDataset`` with the earlier reader: a thread pool that takes the GIL
    between native calls (``RECORDKIT_NATIVE_TASKS=0``), for same-run comparisons."""
    os.environ["RECORDKIT_NATIVE_TASKS"] = "0"  # this child process only
    return _recordkit(wl, files)


def _recordkit_proc(wl: Workload, files: Files) -> Iterator[int]:
    """``ReadOptions(reader_process=True)``: decoding in a loader process (its own GIL)."""
    import recordkit.torch as rkt

    ds = rkt.RecordDataset(
        files.tfrecord_dir, batch_size=BATCH, options=ReadOptions(reader_process=True)
    )
    return _count(_epochs(ds), lambda b: b["label"])


def _tfdata(wl: Workload, files: Files) -> Iterator[int]:
    import tensorflow as tf

    spec = {
        "data": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    if wl.vec:
        spec["vec"] = tf.io.FixedLenFeature([wl.vec], tf.float32)
    ds = (
        tf.data.TFRecordDataset(files.tfrecords(wl), num_parallel_reads=2)
        .batch(BATCH)
        .map(lambda b: tf.io.parse_example(b, spec), num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
        .repeat(EPOCHS)
    )
    return _tf_count(ds)


def _recordkit_tf(wl: Workload, files: Files) -> Iterator[int]:
    """``recordkit.tf.dataset`` over the same folder (schema inferred), same conversion."""
    import recordkit.tf as rktf

    ds = rktf.dataset(files.tfrecord_dir, batch_size=BATCH)
    return _tf_count(ds)


def _recordkit_tf_shuffle(wl: Workload, files: Files) -> Iterator[int]:
    """``recordkit.tf.dataset(shuffle=True)``: the plan's order (the target: >= 0.9x plain)."""
    import recordkit.tf as rktf

    ds = rktf.dataset(files.tfrecord_dir, batch_size=BATCH, shuffle=True, seed=0)
    return _tf_count(ds)


def _recordkit_tf_padded(wl: Workload, files: Files) -> Iterator[int]:
    """``bytes_as="padded"``: ``data`` as zero-padded ``uint8`` rows plus lengths, the
    layout the torch reader gives (and ``tf.data-raw`` makes by hand)."""
    import recordkit.tf as rktf

    ds = rktf.dataset(files.tfrecord_dir, batch_size=BATCH, options=ReadOptions(bytes_as="padded"))
    return _tf_count(ds)


def _recordkit_tf_padded_shuffle(wl: Workload, files: Files) -> Iterator[int]:
    """``bytes_as="padded"`` in the plan's shuffled order."""
    import recordkit.tf as rktf

    padded = ReadOptions(bytes_as="padded")
    ds = rktf.dataset(files.tfrecord_dir, batch_size=BATCH, shuffle=True, seed=0, options=padded)
    return _tf_count(ds)


def _tfdata_raw(wl: Workload, files: Files) -> Iterator[int]:
    """Hand-tuned ``tf.data`` giving ``data`` as ``uint8`` rows (``decode_raw``, every value
    the same length here), the layout ``recordkit.tf-padded`` and the torch reader give."""
    import tensorflow as tf

    spec = {
        "data": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    if wl.vec:
        spec["vec"] = tf.io.FixedLenFeature([wl.vec], tf.float32)

    def parse(b: Any) -> Any:
        out = tf.io.parse_example(b, spec)
        out["data"] = tf.io.decode_raw(out["data"], tf.uint8)
        return out

    ds = (
        tf.data.TFRecordDataset(files.tfrecords(wl), num_parallel_reads=2)
        .batch(BATCH)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
        .repeat(EPOCHS)
    )
    return _tf_count(ds)


def _tf_ceiling(wl: Workload, files: Files) -> Iterator[int]:
    """No reading at all: one batch of the workload's shapes, made once and repeated, through
    the same loop (``TF_LOOP``): what that loop over any tf.data pipeline gets at most here
    (TensorFlow's per-element cost, and what the loop does with each batch)."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    batch = {
        "data": tf.constant([rng.bytes(wl.payload) for _ in range(BATCH)]),
        "label": tf.zeros([BATCH], tf.int64),
    }
    return _ceiling(wl, batch)


def _tf_ceiling_padded(wl: Workload, files: Files) -> Iterator[int]:
    """``tf-ceiling`` with ``data`` as ``uint8`` rows plus lengths (``bytes_as="padded"``)."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    batch = {
        "data": tf.constant(rng.integers(0, 256, (BATCH, wl.payload), np.uint8)),
        "data/lengths": tf.fill([BATCH], tf.constant(wl.payload, tf.int64)),
        "label": tf.zeros([BATCH], tf.int64),
    }
    return _ceiling(wl, batch)


def _ceiling(wl: Workload, batch: dict[str, Any]) -> Iterator[int]:
    import tensorflow as tf

    if wl.vec:
        batch["vec"] = tf.zeros([BATCH, wl.vec], tf.float32)
    full, last = divmod(wl.records, BATCH)  # --quick's W2 ends in a short batch
    ds = tf.data.Dataset.from_tensors(batch).repeat(full)
    if last:
        ds = ds.concatenate(tf.data.Dataset.from_tensors({k: v[:last] for k, v in batch.items()}))
    ds = ds.prefetch(2)
    return _tf_count(ds)


def _tfr_transform(sample: dict[str, Any]) -> dict[str, Any]:
    # The package yields a single bytes value as ``bytes``; make it an array so the
    # default collate stacks it into a uint8 tensor.
    sample["data"] = np.frombuffer(sample["data"], dtype=np.uint8)
    return sample


def _tfrecord_pkg(num_workers: int) -> Reader:
    def read(wl: Workload, files: Files) -> Iterator[int]:
        import torch.utils.data as tud
        from tfrecord.torch.dataset import TFRecordDataset

        desc = {"data": "byte", "label": "int"}
        if wl.vec:
            desc["vec"] = "float"
        # One dataset per shard; each shards itself across workers through its index.
        chain = tud.ChainDataset(
            [
                TFRecordDataset(f, f + ".idx", desc, transform=_tfr_transform)
                for f in files.tfrecords(wl)
            ]
        )
        loader = tud.DataLoader(chain, batch_size=BATCH, num_workers=num_workers)
        return _count(loader, lambda b: b["label"])

    return read


def _wds_collate(samples: list[tuple[bytes, ...]]) -> tuple[Any, ...]:
    import torch

    cols = list(zip(*samples, strict=True))
    longest = max(len(b) for b in cols[0])
    ragged = any(len(b) != longest for b in cols[0])
    data = (np.zeros if ragged else np.empty)((len(samples), longest), dtype=np.uint8)
    for i, b in enumerate(cols[0]):
        data[i, : len(b)] = np.frombuffer(b, dtype=np.uint8)
    out = [torch.from_numpy(data), torch.tensor([int(c) for c in cols[1]], dtype=torch.int64)]
    if len(cols) > 2:
        vec = np.frombuffer(b"".join(cols[2]), dtype="<f4").reshape(len(samples), -1)
        out.append(torch.from_numpy(vec.copy()))
    return tuple(out)


def _webdataset(wl: Workload, files: Files) -> Iterator[int]:
    import torch.utils.data as tud
    import webdataset as wds

    keys = ("bin", "cls", "f32") if wl.vec else ("bin", "cls")
    ds = wds.WebDataset(files.tars(wl), shardshuffle=False).to_tuple(*keys)
    loader = tud.DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=_wds_collate)
    return _count(loader, lambda b: b[1])


class _MapStyle:
    """``DataLoader``'s map-style baseline: record ``i`` through ``recordkit.Dataset[i]``."""

    def __init__(self, folder: str) -> None:
        import recordkit

        self.folder = folder
        with recordkit.Dataset(folder) as ds:
            self.n = len(ds)
        self._ds: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._pid != os.getpid():  # the Dataset holds mmaps: open one per worker
            import recordkit

            self._ds, self._pid = recordkit.Dataset(self.folder), os.getpid()
        sample = self._ds[i]
        sample["data"] = np.frombuffer(sample["data"], dtype=np.uint8)
        return sample


def _dataloader_map(wl: Workload, files: Files) -> Iterator[int]:
    import torch.utils.data as tud

    loader = tud.DataLoader(_MapStyle(files.tfrecord_dir), batch_size=BATCH, num_workers=2)
    return _count(loader, lambda b: b["label"])


READERS: dict[str, Reader] = {
    "recordkit": _recordkit,
    "recordkit-shuffle": _recordkit_shuffle,
    "recordkit-bytes-list": _recordkit_bytes_list,
    "recordkit-proc": _recordkit_proc,
    "recordkit-pool": _recordkit_pool,
    "tf.data": _tfdata,
    "recordkit.tf": _recordkit_tf,
    "recordkit.tf-shuffle": _recordkit_tf_shuffle,
    "tf-ceiling": _tf_ceiling,
    "recordkit.tf-padded": _recordkit_tf_padded,
    "recordkit.tf-padded-shuffle": _recordkit_tf_padded_shuffle,
    "tf.data-raw": _tfdata_raw,
    "tf-ceiling-padded": _tf_ceiling_padded,
    "tfrecord-dl0": _tfrecord_pkg(0),
    "tfrecord-dl2": _tfrecord_pkg(2),
    "webdataset": _webdataset,
    "dataloader-map": _dataloader_map,
}
# Readers whose decoding happens in DataLoader worker processes: their RSS and CPU
# figures below are the main process's only.
WORKER_READERS = frozenset({"tfrecord-dl2", "webdataset", "dataloader-map"})
