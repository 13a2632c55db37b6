"""Ragged number features in torch batches (issue 30, item 1): ``ragged_as``.

``"padded"`` (the default with ``batch_size``): one zero-padded tensor per feature,
as wide as the batch's widest record, and ``name + "/lengths"`` (``(n,)`` for one
``None`` dim, ``(n, k)`` for ``k``). ``"list"``: a list of per-record tensors. Both
hold exactly the values of the records, with threads, worker processes, the reader
process, shuffled, and through ``collate``.
"""

from __future__ import annotations

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import SchemaError
from recordkit.reader import ReadOptions, ragged

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

from recordkit.torch import DataLoader, RecordDataset  # noqa: E402

SCHEMA = rk.Schema(
    id=rk.Int64(),
    tokens=rk.Int64((None,)),
    boxes=rk.Float32((None, 4)),
    mask=rk.Tensor("uint8", (None, None, 2)),
    fixed=rk.Float32((3,)),
)
N = 157


def _sample(i: int) -> dict:
    rng = np.random.default_rng(i)
    h, w = (i * 7) % 5, (i * 3) % 4  # some empty in either dim
    return {
        "id": i,
        "tokens": np.arange(i % 9, dtype=np.int64) - i,
        "boxes": rng.normal(size=(i % 4, 4)).astype(np.float32),
        "mask": rng.integers(1, 255, (h, w, 2), dtype=np.uint8),
        "fixed": np.full(3, i, np.float32),
    }


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    root = tmp_path_factory.mktemp("ragged") / "d"
    with rk.Writer(root, SCHEMA, max_records=40) as w:
        for i in range(N):
            w.write(_sample(i))
    return root


def _unpad(batch: dict) -> dict[int, dict]:
    """Each record's values cut out of a padded batch, by id; checks the padding is zero."""
    out = {}
    n = len(batch["id"])
    assert batch["tokens/lengths"].shape == (n,) and batch["boxes/lengths"].shape == (n,)
    assert batch["mask/lengths"].shape == (n, 2) and batch["mask/lengths"].dtype == torch.int64
    for name in ("tokens", "boxes", "mask"):  # as wide as the widest record, no wider
        widest = batch[name + "/lengths"].reshape(n, -1).amax(0) if n else None
        dims = [d for d, size in enumerate(SCHEMA[name].shape) if size is None]
        assert [batch[name].shape[1 + d] for d in dims] == widest.tolist()
    for r, i in enumerate(batch["id"].tolist()):
        t, b = int(batch["tokens/lengths"][r]), int(batch["boxes/lengths"][r])
        h, w = batch["mask/lengths"][r].tolist()
        assert not batch["tokens"][r, t:].any() and not batch["boxes"][r, b:].any()
        m = batch["mask"][r]
        assert not m[h:].any() and not m[:, w:].any()
        out[i] = {
            "tokens": batch["tokens"][r, :t], "boxes": batch["boxes"][r, :b],
            "mask": m[:h, :w], "fixed": batch["fixed"][r],
        }  # fmt: skip
    return out


def _check(rows: dict[int, dict]) -> None:
    assert sorted(rows) == list(range(N))  # each record once
    for i, row in rows.items():
        want = _sample(i)
        for name, value in row.items():
            assert value.dtype == torch.from_numpy(want[name]).dtype, name
            assert torch.equal(value, torch.from_numpy(want[name])), (i, name)


def _listed(batch: dict) -> dict[int, dict]:
    names = ("tokens", "boxes", "mask")
    assert not any(n + "/lengths" in batch for n in names)
    return {
        i: {**{n: batch[n][r] for n in names}, "fixed": batch["fixed"][r]}
        for r, i in enumerate(batch["id"].tolist())
    }


@pytest.mark.parametrize("shuffle", [False, True])
def test_padded_batches_hold_every_value(path, shuffle):
    rows: dict[int, dict] = {}
    for batch in RecordDataset(path, batch_size=16, shuffle=shuffle, seed=2):
        rows.update(_unpad(batch))
    _check(rows)


def test_list_batches_hold_every_value(path):
    rows: dict[int, dict] = {}
    for batch in RecordDataset(path, batch_size=16, options=ReadOptions(ragged_as="list")):
        assert isinstance(batch["tokens"], list)
        rows.update(_listed(batch))
    _check(rows)


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("where", ["workers", "reader_process"])
def test_workers_and_the_reader_process_give_the_same_batches(path, where):
    kw = dict(batch_size=16, shuffle=True, seed=5)
    want = list(RecordDataset(path, **kw))
    if where == "workers":
        got = list(DataLoader(RecordDataset(path, **kw), num_workers=2))
        rows: dict[int, dict] = {}
        for batch in got:
            rows.update(_unpad(batch))
        _check(rows)
        key = sorted(b["id"].tolist() for b in want)
        assert sorted(b["id"].tolist() for b in got) == key  # the same batches
        by_first = {b["id"][0].item(): b for b in want}
        _same([by_first[b["id"][0].item()] for b in got], got)
    else:
        _same(list(RecordDataset(path, **kw, options=ReadOptions(reader_process=True))), want)


def test_collate_gives_the_batch_layout(path):
    from torch.utils.data import DataLoader as TorchLoader

    ds = RecordDataset(path, shuffle=True, seed=5)
    got = list(TorchLoader(ds, batch_size=16, collate_fn=ds.collate))
    rows: dict[int, dict] = {}
    for batch in got:
        rows.update(_unpad(batch))
    _check(rows)


def test_a_batch_is_cut_to_its_own_widest_record(path):
    """A reader pads to its decoding task's widest record; each batch is trimmed."""
    for batch in RecordDataset(path, batch_size=3):
        assert batch["tokens"].shape[1] == int(batch["tokens/lengths"].max())


def test_samples_without_a_batch_size_are_arrays_of_their_own_shape(path):
    got = {int(s["id"]): s for s in RecordDataset(path)}
    assert got[10]["mask"].shape == (0, 2, 2) and got[4]["tokens"].shape == (4,)
    assert "tokens/lengths" not in got[4]


def test_a_lengths_name_taken_by_a_feature_is_refused(tmp_path):
    schema = rk.Schema(x=rk.Int64((None,)), **{"x/lengths": rk.Int64()})
    with rk.Writer(tmp_path / "d", schema) as w:
        w.write({"x": [1, 2], "x/lengths": 7})
    with pytest.raises(SchemaError, match=r"'x/lengths' collides.*ragged_as='list'"):
        list(RecordDataset(tmp_path / "d", batch_size=2))
    (batch,) = RecordDataset(tmp_path / "d", batch_size=2, options=ReadOptions(ragged_as="list"))
    assert batch["x"][0].tolist() == [1, 2] and batch["x/lengths"].tolist() == [7]


def test_ragged_as_is_checked():
    with pytest.raises(ValueError, match="ragged_as must be 'padded' or 'list'"):
        RecordDataset("nowhere", batch_size=2, options=ReadOptions(ragged_as="nested"))  # type: ignore[arg-type]


def test_pad_and_trim_agree_on_every_shape():
    values = [np.arange(k * 2, dtype=np.int16).reshape(k, 2) for k in (3, 0, 5, 1)]
    padded, lengths = ragged.pad(values, (None, 2), np.int16)
    assert padded.shape == (4, 5, 2) and lengths.tolist() == [3, 0, 5, 1]
    for v, row, n in zip(values, padded, lengths):
        assert (row[:n] == v).all() and not row[n:].any()
    cut = ragged.trim(padded[:2], (0,), 3)
    assert cut.shape == (2, 3, 2)
    # No records (every one bad): the feature's fixed dims, its None dims 0.
    none, lengths = ragged.pad([], (2, None, None), np.float32)
    assert none.shape == (0, 2, 0, 0) and lengths.shape == (0, 2)
    none, lengths = ragged.pad([], (None,), np.int64)
    assert none.shape == (0, 0) and lengths.shape == (0,)
