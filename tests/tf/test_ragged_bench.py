"""``benchmarks/ragged_bench.py``: each reader it times reads every record of both
generated datasets once (a reader that dropped records, or a hand-tuned spec that read
another layout, would make its table wrong), and the TensorFlow readers give the same
batches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("recordkit.tf")

pytestmark = pytest.mark.tf

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> object:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCHMARKS))
        import ragged_bench

        yield ragged_bench
    sys.modules.pop("ragged_bench", None)
    sys.modules.pop("_common", None)


@pytest.mark.parametrize("which", ["numbers", "lists"])
def test_every_reader_reads_every_record(
    bench: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    bench._generate(str(tmp_path), 300)  # type: ignore[attr-defined]
    monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1")  # restored after the -parse reader's 0
    for reader in bench.READERS:  # type: ignore[attr-defined]
        if reader == "recordkit":
            pytest.importorskip("torch")
        got = bench.child(reader, str(tmp_path / which), which)  # type: ignore[attr-defined]
        assert got["records"] == 300, reader
        monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1")
    import recordkit.tf as rktf

    ours = [b for b in rktf.dataset(tmp_path / which, batch_size=64)]
    theirs = list(bench._hand_tuned(str(tmp_path / which), which))  # type: ignore[attr-defined]
    assert len(ours) == len(theirs) == 5
    for a, b in zip(ours, theirs):
        for name in b:
            x, y = a[name], b[name]
            if isinstance(y, tf.RaggedTensor):
                assert x.to_list() == y.to_list(), name
            else:
                assert x.numpy().tolist() == y.numpy().tolist(), name
