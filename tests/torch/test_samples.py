"""Samples in one shape (issue 20, item 3): what ``RecordDataset(batch_size=None)`` yields
for every feature kind, through a plain ``torch.utils.data.DataLoader``, and
``recordkit.torch.collate`` giving exactly the batches ``batch_size=N`` gives."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import recordkit as rk
from recordkit.reader import ReadOptions

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch.utils.data import DataLoader  # noqa: E402

from recordkit.torch import RecordDataset, RecordMapDataset, collate  # noqa: E402

SCHEMA = rk.Schema(
    i=rk.Int64(),
    f=rk.Float32(),
    iv=rk.Int64((3,)),
    fv=rk.Float32((2,)),
    t=rk.Tensor("uint8", (2, 3)),
    h=rk.Tensor("float16", (4,)),
    b=rk.Bytes(),
    b2=rk.Bytes((2,)),
    bl=rk.Bytes((None,)),
    vf=rk.Float32((None,)),
    vi=rk.Int64((None,)),
    vt=rk.Tensor("float32", (None, 2)),
)
FIXED = ["i", "f", "iv", "fv", "t", "h", "b"]  # what a plain DataLoader collates by itself
N = 11
# (dtype, shape of record k) of every number feature in a sample
NUMBERS = {
    "i": (torch.int64, lambda k: ()),
    "f": (torch.float32, lambda k: ()),
    "iv": (torch.int64, lambda k: (3,)),
    "fv": (torch.float32, lambda k: (2,)),
    "t": (torch.uint8, lambda k: (2, 3)),
    "h": (torch.float16, lambda k: (4,)),
    "vf": (torch.float32, lambda k: (k,)),
    "vi": (torch.int64, lambda k: (k % 3,)),
    "vt": (torch.float32, lambda k: (k % 4, 2)),
}


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    root = tmp_path_factory.mktemp("samples")
    with rk.Writer(root, SCHEMA, max_records=4) as w:
        for k in range(N):
            w.write(
                {
                    "i": k,
                    "f": k / 2,
                    "iv": [k, k + 1, k + 2],
                    "fv": [k, -k],
                    "t": np.full((2, 3), k, np.uint8),
                    "h": np.full(4, k, np.float16),
                    "b": b"v" * k,
                    "b2": [b"a" * k, b"b"],
                    "bl": [b"x"] * (k % 3),
                    "vf": [float(k)] * k,
                    "vi": list(range(k % 3)),
                    "vt": np.full((k % 4, 2), k, np.float32),
                }
            )
    return root


def _check_sample(sample, k):
    assert list(sample) == list(SCHEMA.features)
    for name, (dtype, shape) in NUMBERS.items():
        value = sample[name]
        assert isinstance(value, torch.Tensor), (name, type(value))
        assert value.dtype == dtype and tuple(value.shape) == shape(k), name
    assert int(sample["i"]) == k and float(sample["f"]) == k / 2
    assert sample["b"] == b"v" * k
    assert sample["b2"] == [b"a" * k, b"b"] and sample["bl"] == [b"x"] * (k % 3)


def test_every_feature_kind_as_a_sample(path):
    for k, sample in enumerate(RecordDataset(path)):
        _check_sample(sample, k)
    mapped = RecordMapDataset(path)
    for k in range(N):
        _check_sample(mapped[k], k)


def test_plain_dataloader_collates_fixed_features(path):
    loader = DataLoader(RecordDataset(path, columns=FIXED), batch_size=4)
    batches = list(loader)
    assert [len(b["b"]) for b in batches] == [4, 4, 3]
    first = batches[0]
    assert first["i"].tolist() == [0, 1, 2, 3] and first["f"].dtype == torch.float32
    assert tuple(first["t"].shape) == (4, 2, 3) and tuple(first["h"].shape) == (4, 4)
    assert first["b"] == [b"", b"v", b"vv", b"vvv"]  # default_collate keeps bytes as a list


def _same(got, want, where):
    assert list(got) == list(want), where
    for name, w in want.items():
        g = got[name]
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor) and g.dtype == w.dtype, (where, name)
            assert torch.equal(g, w), (where, name)
        else:
            assert isinstance(g, list) and len(g) == len(w), (where, name)
            for x, y in zip(g, w):
                assert torch.equal(x, y) if isinstance(y, torch.Tensor) else x == y, (where, name)


@pytest.mark.parametrize("bytes_as", ["padded", "list"])
def test_collate_gives_the_batches_batch_size_gives(path, bytes_as):
    ds = RecordDataset(path, options=ReadOptions(bytes_as=bytes_as))
    loaded = list(DataLoader(ds, batch_size=4, collate_fn=ds.collate))
    batched = list(RecordDataset(path, batch_size=4, options=ReadOptions(bytes_as=bytes_as)))
    assert len(loaded) == len(batched) == 3
    for b, (got, want) in enumerate(zip(loaded, batched)):
        _same(got, want, f"batch {b}")
    if bytes_as == "padded":
        assert loaded[0]["b/lengths"].tolist() == [0, 1, 2, 3]


def test_collate_for_the_map_dataset(path):
    mapped = RecordMapDataset(path)
    loaded = list(DataLoader(mapped, batch_size=4, collate_fn=mapped.collate))
    batched = list(RecordDataset(path, batch_size=4))
    for b, (got, want) in enumerate(zip(loaded, batched)):
        _same(got, want, f"batch {b}")


def test_collate_without_a_schema_and_bad_input():
    same = [{"x": torch.ones(2)}, {"x": torch.zeros(2)}]
    assert tuple(collate(same)["x"].shape) == (2, 2)
    ragged = [{"x": torch.ones(2)}, {"x": torch.zeros(3)}]
    assert isinstance(collate(ragged)["x"], list)
    assert collate([]) == {}
    with pytest.raises(ValueError, match="bytes_as"):
        collate(same, bytes_as="text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sample 1 has keys"):
        collate([{"x": torch.ones(1)}, {"y": torch.ones(1)}])


def test_lists_of_bytes_pass_the_consuming_thread_without_a_look_at_each_value(path, monkeypatch):
    """Lists of bytes (and bytes_as="list") come in batches as the decoder made them:
    ``to_torch`` is never called on one of their values on the training thread."""
    collate_mod = importlib.import_module("recordkit.torch.collate")  # the name is a function
    seen = []
    real = collate_mod.to_torch

    def spy(value):
        seen.append(type(value))
        return real(value)

    monkeypatch.setattr(collate_mod, "to_torch", spy)
    ds = RecordDataset(path, batch_size=4, options=ReadOptions(bytes_as="list"))
    batches = list(ds)
    assert bytes not in seen and seen  # the number columns still go through it
    got = [v for b in batches for v in b["bl"]]
    assert got == [[b"x"] * (k % 3) for k in range(N)]
    assert [v for b in batches for v in b["b2"]] == [[b"a" * k, b"b"] for k in range(N)]
    assert [v for b in batches for v in b["b"]] == [b"v" * k for k in range(N)]
