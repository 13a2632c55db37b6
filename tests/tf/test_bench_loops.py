"""``benchmarks/read_bench.py --tf-loop``: each way of taking a TensorFlow reader's batches
(a Python loop over the tensors, the same with ``.numpy()``, a ``tf.function`` taking
``GRAPH_STEPS`` per call) counts every record once, a short last batch and a last call
of exactly ``GRAPH_STEPS`` batches included: a loop that dropped or repeated batches
would make the read table wrong."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import recordkit as rk
from recordkit import Bytes, Int64, Schema

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")

pytestmark = pytest.mark.tf

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def readers(monkeypatch_module: pytest.MonkeyPatch) -> object:
    monkeypatch_module.syspath_prepend(str(BENCHMARKS))
    import _readers

    return _readers


@pytest.fixture(scope="module")
def monkeypatch_module() -> object:
    with pytest.MonkeyPatch.context() as mp:
        yield mp
    sys.modules.pop("_readers", None)


def _folder(root: Path, records: int) -> Path:
    with rk.Writer(root, Schema(label=Int64(), data=Bytes()), max_records=50) as w:
        for k in range(records):
            w.write({"label": k, "data": bytes([k % 256]) * (k % 9)})
    return root


@pytest.mark.parametrize("loop", ["eager", "numpy", "graph"])
@pytest.mark.parametrize(
    "records",
    [0, 1, 64 * 4 + 5, 64 * 8, 64 * 8 + 1],  # steps of 4 batches: one call exactly full
)
def test_every_loop_counts_every_record_once(
    readers: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: str, records: int
) -> None:
    folder = _folder(tmp_path / "d", records) if records else None
    monkeypatch.setattr(readers, "TF_LOOP", loop)
    monkeypatch.setattr(readers, "GRAPH_STEPS", 4)
    if folder is None:  # an empty pipeline: nothing counted, no error
        ds = tf.data.Dataset.from_tensor_slices({"label": tf.zeros([0], tf.int64)}).batch(64)
        assert sum(readers._tf_count(ds)) == 0
        return
    ds = rtf.dataset(folder, batch_size=64)
    counts = list(readers._tf_count(ds))
    assert sum(counts) == records
    batches = -(-records // 64)
    if loop == "graph":
        assert len(counts) == -(-batches // 4)  # 4 batches per call, the last call short
    else:
        assert len(counts) == batches
