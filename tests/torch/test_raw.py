"""``RecordDataset(options=ReadOptions(raw=True))``: foreign records whose features differ
(a key missing from a third of them, as Beam and TFX data often are), read as stored,
every record once a pass, one by one or in lists, with workers too (issue 30)."""

from __future__ import annotations

import pytest

import recordkit as rk
from recordkit.codec.example import encode_example
from recordkit.format import frame
from recordkit.reader import ReadOptions

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from recordkit.torch import DataLoader, RecordDataset  # noqa: E402

N = 60


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    for k in range(2):  # Beam's names, no suffix
        with open(root / f"data-0000{k}-of-00002", "wb") as f:
            for i in range(k * N // 2, (k + 1) * N // 2):
                feats = {"id": ("int64", [i]), "score": ("float", [i / 2])}
                if i % 3:
                    feats["text"] = ("bytes", [b"t%d" % i, b""])
                f.write(frame(encode_example(feats)))
    return root


def _check(samples):
    assert sorted(int(s["id"][0]) for s in samples) == list(range(N))
    for s in samples:
        i = int(s["id"][0])
        assert float(s["score"][0]) == i / 2 and s["score"].dtype == torch.float32
        assert s.get("text") == ([b"t%d" % i, b""] if i % 3 else None)


def test_samples_as_stored(folder):
    _check(
        list(
            RecordDataset(
                folder, shuffle=True, seed=0, options=ReadOptions(raw=True, num_threads=1)
            )
        )
    )


def test_a_schema_bound_reader_infers_the_key_as_optional(folder):
    ds = RecordDataset(folder)  # the schema inferred: "text" in 40 of 60 records
    assert ds.schema["text"] == rk.Bytes((None,), default=[])
    got = {int(s["id"]): s["text"] for s in ds}
    assert got == {i: [b"t%d" % i, b""] if i % 3 else [] for i in range(N)}


def test_lists_of_samples_and_workers(folder):
    ds = RecordDataset(folder, batch_size=8, options=ReadOptions(raw=True, num_threads=1))
    batches = list(ds)
    assert all(isinstance(b, list) for b in batches) and [len(b) for b in batches][:7] == [8] * 7
    _check([s for b in batches for s in b])
    _check([s for b in DataLoader(ds, num_workers=2) for s in b])


def test_raw_takes_no_schema_and_no_loader_process(folder):
    with pytest.raises(ValueError, match="raw=True reads records whole"):
        RecordDataset(folder, columns=["id"], options=ReadOptions(raw=True))
    with pytest.raises(ValueError, match="raw=True"):
        next(iter(RecordDataset(folder, options=ReadOptions(raw=True, reader_process=True))))
