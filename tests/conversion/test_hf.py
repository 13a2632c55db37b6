"""``--from hf``: Hugging Face ``datasets`` saved with ``save_to_disk``, by the real library.

The conformance suite (``test_formats.py``) converts a saved ``Dataset`` of every
feature kind locally, from S3 and over HTTP and compares every value with
``datasets.load_from_disk``'s; here: a ``DatasetDict``'s splits, the metadata,
and what is refused, by name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import recordkit as rk
from recordkit.converters.base import SourceError
from recordkit.errors import PartitionsFailedError

from .cases import _hf_as_stored, assert_samples_equal, hf_expected, hf_save, read_all

datasets = pytest.importorskip("datasets")
pytest.importorskip("PIL")


def test_dataset_dict_split(tmp_path: Path) -> None:
    ds = hf_save(tmp_path / "one", n=5)
    datasets.DatasetDict({"train": ds, "test": ds.select([3, 1])}).save_to_disk(
        str(tmp_path / "dd")
    )
    with pytest.raises(SourceError, match="DatasetDict with the splits train, test: choose one"):
        rk.convert(tmp_path / "dd", tmp_path / "x", format="hf", workers=0)
    rk.convert(
        tmp_path / "dd", tmp_path / "test", format="hf", workers=0, source_options={"split": "test"}
    )
    got = read_all(tmp_path / "test")
    assert_samples_equal(got, _hf_as_stored(hf_expected(tmp_path / "dd", "test")))
    meta = rk.Dataset(tmp_path / "test").metadata["hf"]
    assert meta["split"] == "test"
    assert meta["class_names"] == {"label": ["cat", "dog", "bird"], "obj/cat": ["p", "q"]}
    assert meta["features"]["label"]["_type"] == "ClassLabel"
    # The split's own folder reads as a Dataset.
    rk.convert(tmp_path / "dd" / "train", tmp_path / "train", format="hf", workers=0)
    assert len(read_all(tmp_path / "train")) == 5
    schema = rk.Dataset(tmp_path / "train").schema
    assert schema["dyn"] == rk.Tensor("int16", (None, 3)) and schema["big"] == rk.Tensor(
        "uint64", ()
    )
    assert schema["x"] == rk.Tensor("float64", ()) and schema["obj/box"] == rk.Float32((None, 4))


def _refused(tmp_path: Path, rows: dict, features: object, match: str) -> None:
    """Refused at planning (a SourceError) or by the writer (one, in the group)."""
    folder = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(folder))
    with pytest.raises((SourceError, PartitionsFailedError)) as info:
        rk.convert(folder, tmp_path / f"{folder.name}-out", format="hf", workers=0)
    err = info.value
    if isinstance(err, PartitionsFailedError):
        (err,) = err.exceptions
    assert isinstance(err, SourceError) and re.search(match, str(err)), str(err)


def test_refusals_are_named(tmp_path: Path) -> None:
    value = datasets.Value
    _refused(
        tmp_path,
        {"v": [1, None, 3]},
        datasets.Features({"v": value("int64")}),
        r"row 1: feature 'v' holds a null",
    )
    _refused(
        tmp_path,
        {"g": [[[1, 2], [3]]]},
        datasets.Features({"g": datasets.Sequence(datasets.Sequence(value("int64")))}),
        r"row 0: feature 'g' is ragged",
    )
    _refused(
        tmp_path,
        {"t": [{"en": "a", "fr": "b"}]},
        datasets.Features({"t": datasets.Translation(languages=["en", "fr"])}),
        r"feature 't': datasets Translation is not supported; give a schema",
    )
    _refused(
        tmp_path,
        {"d": ["2024-01-01"]},
        datasets.Features({"d": value("date32")}),
        r"Value\('date32'\) has no recordkit type",
    )
    # An image given by path: save_to_disk embeds the file's bytes, which convert keeps.
    img = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (2, 2)).save(img)
    folder = tmp_path / "bypath"
    feats = datasets.Features({"i": datasets.Image()})
    datasets.Dataset.from_dict({"i": [str(img)]}, features=feats).save_to_disk(str(folder))
    img.unlink()
    rk.convert(folder, tmp_path / "bypath-out", format="hf", workers=0)
    assert read_all(tmp_path / "bypath-out")[0]["i"] == hf_expected(folder)[0]["i"]


def test_state_json_names_only_its_files(tmp_path: Path) -> None:
    hf_save(tmp_path / "saved", n=3)
    state = json.loads((tmp_path / "saved" / "state.json").read_text())
    state["_data_files"].append({"filename": "../../etc/passwd"})
    (tmp_path / "saved" / "state.json").write_text(json.dumps(state))
    with pytest.raises(SourceError, match=r"state.json lists '\.\./\.\./etc/passwd'"):
        rk.convert(tmp_path / "saved", tmp_path / "out", format="hf", workers=0)
    with pytest.raises(FileNotFoundError, match="not a folder written by save_to_disk"):
        rk.convert(tmp_path, tmp_path / "out2", format="hf", workers=0)
