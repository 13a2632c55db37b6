"""Source datasets for the converter tests: each writes files and returns the samples expected.

A case writes its source under a directory and returns ``(src_rel, expected)``:
``src_rel`` is what to convert relative to that directory (``""``: the directory
itself), and ``expected`` the samples in dataset order, as ``Dataset`` decodes
them up to dtype (``assert_samples_equal`` compares them).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import recordkit as rk
from recordkit.codec import encode_example
from recordkit.format import frame

Case = Callable[[Path], tuple[str, list[dict[str, Any]]]]


def jsonl(root: Path) -> tuple[str, list[dict[str, Any]]]:
    expected = []
    for name, n in (("a.jsonl", 7), ("b.jsonl", 5)):
        with open(root / name, "w") as f:
            for i in range(n):
                row = {
                    "id": len(expected),
                    "text": f"héllo {name} {i}",
                    "vec": [0.25 * i, -1.5, 2.0],
                    "tags": ["x"] * (i % 3),
                    "obj": {"k": i},
                }
                f.write(json.dumps(row) + "\n")
                expected.append({**row, "obj": json.dumps({"k": i}, separators=(",", ":"))})
    return "", expected


def csv_(root: Path) -> tuple[str, list[dict[str, Any]]]:
    expected = []
    for name, n in (("one.csv", 6), ("two.csv", 4)):
        with open(root / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "name", "score"])
            for i in range(n):
                row = {"id": len(expected), "name": f"n,{i}\nline", "score": i * 0.5}
                w.writerow([row["id"], row["name"], row["score"]])
                expected.append(row)
    return "", expected


def numpy_npz(root: Path) -> tuple[str, list[dict[str, Any]]]:
    rng = np.random.default_rng(0)
    expected = []
    for name, n in (("p0.npz", 9), ("p1.npz", 4)):
        image = rng.integers(0, 255, (n, 4, 4, 3), dtype=np.uint8)
        label = np.arange(n, dtype=np.int64) + len(expected)
        weight = rng.random(n).astype(np.float64)
        np.savez(root / name, image=image, label=label, weight=weight)
        expected += [{"image": image[i], "label": label[i], "weight": weight[i]} for i in range(n)]
    return "", expected


def numpy_columns(root: Path) -> tuple[str, list[dict[str, Any]]]:
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    y = np.arange(10, dtype=np.int32)
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    return "", [{"x": x[i], "y": y[i]} for i in range(10)]


def parquet(root: Path) -> tuple[str, list[dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"id": i, "name": f"row {i}", "score": np.float32(i / 4), "vec": [float(i)] * (i % 3)}
        for i in range(11)
    ]
    table = pa.table(
        {
            "id": pa.array([r["id"] for r in rows], pa.int64()),
            "name": pa.array([r["name"] for r in rows], pa.string()),
            "score": pa.array([r["score"] for r in rows], pa.float32()),
            "vec": pa.array([r["vec"] for r in rows], pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, root / "t.parquet", row_group_size=4)
    return "", rows


def imagefolder(root: Path) -> tuple[str, list[dict[str, Any]]]:
    from PIL import Image

    expected = []
    for label, cls in enumerate(["cat", "dog"]):
        (root / cls).mkdir()
        for i in range(3 + label):
            buf = io.BytesIO()
            Image.new("RGB", (4 + i, 3), (i * 40, label * 100, 7)).save(buf, format="PNG")
            (root / cls / f"{i:03d}.png").write_bytes(buf.getvalue())
            expected.append({"image": buf.getvalue(), "label": label, "path": f"{cls}/{i:03d}.png"})
    # the documented default order: interleaved by a keyed hash of the path (seed 0)
    expected.sort(key=lambda e: hashlib.blake2b(e["path"].encode(), key=b"0").digest())
    assert [e["label"] for e in expected] != sorted(e["label"] for e in expected)
    return "", expected


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def webdataset(root: Path) -> tuple[str, list[dict[str, Any]]]:
    expected = []
    for shard in range(2):
        with tarfile.open(root / f"shard-{shard:03d}.tar", "w") as tar:
            for i in range(4):
                key = f"s{shard}/{i:06d}"
                jpg = bytes([shard, i]) * 50
                cls = (shard * 4 + i) % 3
                _add(tar, f"{key}.jpg", jpg)
                _add(tar, f"{key}.cls", str(cls).encode())
                _add(tar, f"{key}.meta.json", json.dumps({"i": i}).encode())
                expected.append(
                    {"__key__": key, "jpg": jpg, "cls": cls, "meta.json": json.dumps({"i": i})}
                )
    return "", expected


def tfrecord(root: Path) -> tuple[str, list[dict[str, Any]]]:
    expected = []
    for shard in range(3):
        with open(root / f"data.tfrecord-{shard:05d}-of-00003", "wb") as f:
            for _ in range(5):
                n = len(expected)
                f.write(
                    frame(
                        encode_example(
                            {
                                "label": ("int64", [n]),
                                "text": ("bytes", [f"t{n}".encode()]),
                                "emb": ("float", [0.5, float(n)]),
                            }
                        )
                    )
                )
                expected.append({"label": n, "text": f"t{n}", "emb": [0.5, float(n)]})
    return "", expected


GOLDEN = Path(__file__).parent.parent / "data"


def mds_expected(folder: Path) -> list[dict[str, Any]]:
    """The samples of a golden MDS folder (tests/data/make_mds.py), as recordkit stores them:
    what mosaicml-streaming's reader gave, images as the bytes its writer stored."""
    import base64

    meta = json.loads((folder / "expected.json").read_text())
    with np.load(folder / "expected.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    out = []
    for i, row in enumerate(meta["samples"]):
        sample: dict[str, Any] = {}
        for key, value in arrays.items():
            n, _, name = key.partition("/")
            if int(n) == i and "/" not in name and name not in ("photo", "icon"):
                sample[name] = value
        for name, value in row.items():
            if name == "written":
                for col, data in value.items():
                    if isinstance(data, list):
                        sample[col] = [base64.b64decode(d) for d in data]
                    else:
                        sample[col] = base64.b64decode(data)
            elif name == "clips":
                continue
            elif "b64" in value:
                sample[name] = base64.b64decode(value["b64"])
            elif "decimal" in value:
                sample[name] = value["decimal"]
            elif "python" in value:
                sample[name] = (
                    str(int(value["repr"]))
                    if value["python"] == "int" and abs(int(value["repr"])) >= 2**63
                    else (int if value["python"] == "int" else float)(value["repr"])
                )
            elif name == "meta":
                sample[name] = json.dumps(value["value"])
            else:
                sample[name] = value["value"]
        out.append(sample)
    return out


def mds(root: Path) -> tuple[str, list[dict[str, Any]]]:
    """The golden zstd MDS dataset (several shards), written by mosaicml-streaming."""
    import shutil

    src = GOLDEN / "mds" / "zstd"
    for f in src.iterdir():
        if not f.name.startswith("expected."):
            shutil.copy(f, root / f.name)
    return "", mds_expected(src)


def hf_expected(folder: Path, split: str | None = None) -> list[dict[str, Any]]:
    """What ``datasets.load_from_disk`` reads, flattened as the hf converter names features
    (``outer/inner``), images as their stored bytes."""
    import datasets

    ds = datasets.load_from_disk(str(folder))
    if split is not None:
        ds = ds[split]
    for name, feature in ds.features.items():
        if isinstance(feature, datasets.Image):
            ds = ds.cast_column(name, datasets.Image(decode=False))
    out = []
    for row in ds:
        flat: dict[str, Any] = {}
        for key, value in row.items():
            if isinstance(value, dict) and set(value) == {"bytes", "path"}:
                flat[key] = value["bytes"]
            elif isinstance(value, dict):
                flat.update({f"{key}/{k}": v for k, v in value.items()})
            else:
                flat[key] = value
        out.append(flat)
    return out


def hf_save(root: Path, n: int = 9, **save: Any) -> Any:
    """A ``datasets.Dataset`` of every feature kind the converter maps, saved to ``root``."""
    import datasets
    from PIL import Image

    def png(i: int) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (3 + i % 4, 2), (i * 20 % 255, 7, 9)).save(buf, format="PNG")
        return buf.getvalue()

    features = datasets.Features(
        {
            "img": datasets.Image(),
            "label": datasets.ClassLabel(names=["cat", "dog", "bird"]),
            "text": datasets.Value("string"),
            "x": datasets.Value("float64"),
            "f": datasets.Value("float32"),
            "i8": datasets.Value("int8"),
            "flag": datasets.Value("bool"),
            "blob": datasets.Value("binary"),
            "tok": datasets.Sequence(datasets.Value("int32")),
            "fix": datasets.Sequence(datasets.Value("float32"), length=2),
            "words": datasets.List(datasets.Value("string")),
            "arr": datasets.Array2D(shape=(2, 3), dtype="float32"),
            "dyn": datasets.Array2D(shape=(None, 3), dtype="int16"),
            "grid": datasets.Sequence(datasets.Sequence(datasets.Value("int64"))),
            "obj": datasets.Sequence(
                {
                    "box": datasets.Sequence(datasets.Value("float32"), length=4),
                    "cat": datasets.ClassLabel(names=["p", "q"]),
                }
            ),
            "meta": {"a": datasets.Value("int64"), "b": datasets.Value("string")},
        }
    )
    rows = {
        "img": [{"bytes": png(i), "path": None} for i in range(n)],
        "label": [i % 3 for i in range(n)],
        "text": [f"héllo {i}" for i in range(n)],
        "x": [1 / (i + 3) for i in range(n)],
        "f": [i / 7 for i in range(n)],
        "i8": [-i for i in range(n)],
        "flag": [bool(i % 2) for i in range(n)],
        "blob": [bytes([i]) * (i % 3) for i in range(n)],
        "tok": [list(range(i % 4)) for i in range(n)],
        "fix": [[i, -i] for i in range(n)],
        "words": [["w"] * (i % 3) for i in range(n)],
        "arr": [np.full((2, 3), i, np.float32) for i in range(n)],
        "dyn": [np.full((i % 3, 3), i, np.int16) for i in range(n)],
        "grid": [[[i] * (i % 2 + 1)] * 2 for i in range(n)],
        "obj": [{"box": [[0.1, 0.2, 0.3, 0.4]] * (i % 3), "cat": [1] * (i % 3)} for i in range(n)],
        "meta": [{"a": i, "b": str(i)} for i in range(n)],
    }
    import pyarrow as pa

    ds = datasets.Dataset.from_dict(rows, features=features)
    # uint64 past int64's range: from_dict cannot make it, an Arrow table can
    big = datasets.Dataset(
        pa.table({"big": pa.array([2**64 - 1 - i for i in range(n)], pa.uint64())})
    )
    ds = datasets.concatenate_datasets([ds, big], axis=1)
    ds.save_to_disk(str(root), **save)
    return ds


def hf(root: Path) -> tuple[str, list[dict[str, Any]]]:
    """A Dataset saved by the real ``datasets`` in two Arrow files."""
    hf_save(root / "saved", num_shards=2)
    return "saved", _hf_as_stored(hf_expected(root / "saved"))


def _hf_as_stored(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        row = dict(row)
        row["flag"] = int(row["flag"])
        row["dyn"] = np.asarray(row["dyn"], np.int16).reshape(-1, 3)
        row["obj/box"] = np.asarray(row["obj/box"], np.float32).reshape(-1, 4)
        out.append(row)
    return out


def arrayrecord(root: Path) -> tuple[str, list[dict[str, Any]]]:
    """tf.train.Example records in two ArrayRecord files, written by ``array-record``."""
    from array_record.python.array_record_module import ArrayRecordWriter

    expected = []
    for shard in range(2):
        writer = ArrayRecordWriter(str(root / f"part-{shard}.array_record"), "group_size:3")
        for _ in range(7 + shard):
            n = len(expected)
            feats = {"label": ("int64", [n]), "text": ("bytes", [f"t{n}".encode()])}
            writer.write(encode_example({**feats, "emb": ("float", [0.5, float(n)])}))
            expected.append({"label": n, "text": f"t{n}", "emb": [0.5, float(n)]})
        writer.close()
    return "", expected


CASES: dict[str, tuple[str, Case]] = {
    "jsonl": ("jsonl", jsonl),
    "csv": ("csv", csv_),
    "numpy-npz": ("numpy", numpy_npz),
    "numpy-npy": ("numpy", numpy_columns),
    "parquet": ("parquet", parquet),
    "imagefolder": ("imagefolder", imagefolder),
    "webdataset": ("webdataset", webdataset),
    "tfrecord": ("tfrecord", tfrecord),
    "mds": ("mds", mds),
    "hf": ("hf", hf),
    "arrayrecord": ("arrayrecord", arrayrecord),
}


def _norm(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list) and value and isinstance(value[0], (str, bytes)):
        return [_norm(v) for v in value]
    return value


def assert_samples_equal(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """Sample by sample, feature by feature; numbers compared in the stored dtype."""
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert set(g) == set(e), (i, sorted(g), sorted(e))
        for name, want in e.items():
            have, want = _norm(g[name]), _norm(want)
            if isinstance(have, (bytes, list)) and not isinstance(have, np.ndarray):
                assert have == want, (i, name, have, want)
            else:
                have = np.asarray(have)
                want = np.asarray(want, dtype=have.dtype).reshape(have.shape)
                np.testing.assert_array_equal(have, want, err_msg=f"sample {i} {name}")


def read_all(path: str | Path) -> list[dict[str, Any]]:
    """Every sample of a local dataset, in order."""
    with rk.Dataset(path) as ds:
        return list(ds)
