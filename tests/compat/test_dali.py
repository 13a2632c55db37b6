"""NVIDIA DALI reads a recordkit dataset through our ``.idx`` files, on the CPU, value for value.

Optional: needs the ``dali`` dependency group (``nvidia-dali-cuda120``, a ~425 MB
wheel), which the default test set-up does not install, so this module is skipped
there. ``scripts/test_dali.sh`` makes a throwaway venv with DALI and runs it.
DALI runs CPU-only pipelines without a GPU (``device_id=None``); the GPU-only
steps (``device="mixed"`` / ``"gpu"`` operators, nvJPEG) are not exercised here.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import recordkit as rk

dali = pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (dali group)")
Image = pytest.importorskip("PIL.Image")

from nvidia.dali import fn, pipeline_def  # noqa: E402
from nvidia.dali import tfrecord as tfrec  # noqa: E402

pytestmark = pytest.mark.dali

N = 600
BATCH = 64
SCHEMA = rk.Schema(
    image=rk.Bytes(),
    label=rk.Int64(),
    emb=rk.Float32((4,)),
    tokens=rk.Int64((None,)),
    raw=rk.Tensor("uint16", (2, 3)),
)


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    pixels = (rng.integers(0, 8, (12 + i % 5, 16, 3)) * 32).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _sample(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {
        "image": _jpeg(i),
        "label": int(rng.integers(-(2**40), 2**40)),
        "emb": rng.standard_normal(4).astype(np.float32),
        "tokens": rng.integers(0, 1000, i % 7).tolist(),
        "raw": rng.integers(0, 2**16, (2, 3), dtype=np.uint16),
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("dali") / "train"
    with rk.Writer(root, SCHEMA, max_records=97) as w:  # several shards, the last one short
        for i in range(N):
            w.write(_sample(i))
    manifest = json.loads((root / "recordkit.json").read_text())
    shards = [str(root / s["path"]) for s in manifest["shards"]]
    return root, shards


def _read_all(shards: list[str], decode: bool) -> list[dict]:
    """Every record once, in dataset order, through ``fn.readers.tfrecord`` on the CPU."""

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None)  # no GPU
    def pipe():
        f = fn.readers.tfrecord(
            path=shards,
            index_path=[s + ".idx" for s in shards],  # recordkit's index files, as they are
            features={
                "image": tfrec.FixedLenFeature((), tfrec.string, ""),
                "label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
                "emb": tfrec.FixedLenFeature([4], tfrec.float32, 0.0),
                "tokens": tfrec.VarLenFeature(tfrec.int64, 0),
                "raw": tfrec.FixedLenFeature((), tfrec.string, ""),
            },
            random_shuffle=False,
            name="reader",
        )
        outs = [f["image"], f["label"], f["emb"], f["tokens"], f["raw"]]
        if decode:
            outs.append(fn.decoders.image(f["image"], device="cpu", output_type=dali.types.RGB))
        return tuple(outs)

    p = pipe()
    p.build()
    assert p.epoch_size("reader") == N
    names = ["image", "label", "emb", "tokens", "raw", "decoded"]
    samples: list[dict] = []
    while len(samples) < N:
        outs = p.run()
        for i in range(len(outs[0])):
            samples.append({n: np.array(o.at(i)) for n, o in zip(names, outs)})
    return samples[:N]  # the last batch wraps around into the next epoch


def test_dali_reads_every_record_and_value_through_our_index(dataset):
    root, shards = dataset
    assert len(shards) == 7
    got = _read_all(shards, decode=False)
    want = rk.Dataset(root)
    assert len(got) == len(want) == N
    for i, (g, w) in enumerate(zip(got, (want[j] for j in range(N)))):
        assert g["image"].tobytes() == bytes(w["image"]), i
        assert g["label"].tolist() == [int(w["label"])], i
        np.testing.assert_array_equal(g["emb"], w["emb"])
        assert g["tokens"].tolist() == w["tokens"].tolist(), i
        # a Tensor feature is one bytes value: its raw little-endian bytes
        np.testing.assert_array_equal(g["raw"].view("<u2").reshape(2, 3), w["raw"])


def test_dali_decodes_the_images_on_the_cpu(dataset):
    """``fn.decoders.image(device="cpu")`` needs no GPU (``"mixed"``, nvJPEG, does)."""
    _, shards = dataset
    got = _read_all(shards, decode=True)
    for i, g in enumerate(got[:128]):
        with Image.open(io.BytesIO(_jpeg(i))) as img:
            want = np.asarray(img.convert("RGB"))
        assert g["decoded"].shape == want.shape
        assert np.abs(g["decoded"].astype(int) - want).mean() < 2.0, i
