"""Settings as frozen objects (issue 17, issue 32): ReadOptions / CacheOptions of the
readers, and ProducerOptions of ShardCache; each setting is accepted one way."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

import recordkit as rk
from recordkit.cache import ProducerOptions, ShardCache
from recordkit.errors import OptionError
from recordkit.reader import CacheOptions, ReadOptions


@pytest.fixture
def rkt():
    """recordkit.torch, or a skip without torch (the rest of this file needs no torch)."""
    return pytest.importorskip("recordkit.torch")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("opts") / "ds"
    schema = rk.Schema(x=rk.Int64(), v=rk.Float32((2,)))
    with rk.Writer(root, schema, max_records=40) as w:
        for i in range(100):
            w.write({"x": i, "v": np.array([i, -i], np.float32)})
    return str(root)


def _records(ds):
    return [int(x) for b in ds for x in b["x"]]


@pytest.mark.torch
def test_options_whole_read_what_the_flat_keywords_read(data, rkt):
    """One ReadOptions, shared or derived with dataclasses.replace, reads the same."""
    flat = rkt.RecordDataset(
        data, batch_size=16, shuffle=True, seed=3, columns=["x"], options=ReadOptions(num_threads=2)
    )
    opts = dataclasses.replace(ReadOptions(num_threads=1), num_threads=2)
    whole = rkt.RecordDataset(
        data, batch_size=16, shuffle=True, seed=3, columns=["x"], options=opts
    )
    assert whole.read_options == flat.read_options == opts
    mixed = ReadOptions(weights=[1, 2])
    assert mixed.weights == (1, 2)  # kept as a tuple: the object is frozen through and through
    assert _records(whole) == _records(flat)
    assert sorted(_records(whole)) == list(range(100))
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.num_threads = 1  # type: ignore[misc]


@pytest.mark.torch
@pytest.mark.parametrize(
    "field, named",
    [
        ({"shuffle_buffer": 500}, "shuffle_buffer=500"),  # tf's
        ({"deterministic": False}, "deterministic=False"),  # tf's
        ({"decode_images": "image"}, "decode_images='image'"),  # names: tf's form
    ],
)
def test_a_setting_for_the_other_reader_is_refused_by_name(data, rkt, field, named):
    """A setting has one place, and one reader that reads it: set for the other reader
    it is refused by name, never silently ignored."""
    with pytest.raises(ValueError, match="^" + re.escape(f"ReadOptions({named})")):
        rkt.RecordDataset(data, options=ReadOptions(**field))
    with pytest.raises(
        ValueError, match=r"^ReadOptions\(num_threads=2\): recordkit\.torch\.RecordMapDataset"
    ):
        rkt.RecordMapDataset(data, options=ReadOptions(num_threads=2))


@pytest.mark.torch
def test_cache_settings_are_checked_when_made(data, rkt, tmp_path):
    with pytest.raises(ValueError, match="not both"):
        CacheOptions(dir=tmp_path / "c", limit="1MiB", cache=object())
    with pytest.raises(ValueError, match="cache_dir"):
        CacheOptions(limit="1MiB")
    with pytest.raises(TypeError, match="cache= takes a ShardCache or a CacheOptions"):
        rkt.RecordDataset(data, cache=str(tmp_path / "c"))  # type: ignore[arg-type]


@pytest.mark.torch
def test_options_are_checked_when_made_and_typed(data, rkt):
    with pytest.raises(ValueError, match="on_error"):
        ReadOptions(on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_threads"):
        ReadOptions(num_threads=0)
    with pytest.raises(ValueError, match="sequence_example=True reads records whole"):
        rkt.RecordDataset(data, columns=["x"], options=ReadOptions(sequence_example=True))
    with pytest.raises(ValueError, match="cache_epochs"):
        CacheOptions(epochs="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options= takes a ReadOptions"):
        rkt.RecordDataset(data, options={"shuffle": True})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shuffle_buffer"):
        ReadOptions(shuffle_buffer=0)


def _jsonl(root, files=2):
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        rows = [json.dumps({"i": f * 10 + k, "s": "x" * k}) for k in range(10)]
        (root / f"part-{f}.jsonl").write_text("\n".join(rows) + "\n")
    return str(root)


def test_producer_options_whole_or_flat(tmp_path):
    src = _jsonl(tmp_path / "raw")
    convert = rk.conversion.ConvertOptions(shard_size="16KiB")
    whole = ShardCache(
        src,
        tmp_path / "a",
        max_bytes="1MiB",
        producer=ProducerOptions(format="jsonl", convert_options=convert),
    )
    flat = ShardCache(src, tmp_path / "b", max_bytes="1MiB", format="jsonl", shard_size="16KiB")
    assert whole.mode == flat.mode == "producer"
    assert whole._filler.options == flat._filler.options  # type: ignore[attr-defined]
    assert whole._filler.options.shard_size == 16 << 10  # type: ignore[attr-defined]
    assert whole.fill() == flat.fill() >= 1  # the same shards, either way
    default = ShardCache(src, tmp_path / "c", max_bytes="1MiB", producer=ProducerOptions("jsonl"))
    assert default._filler.options.shard_size == 256 << 20  # type: ignore[attr-defined]


def test_producer_settings_are_accepted_one_way(tmp_path):
    src = _jsonl(tmp_path / "raw", 1)
    producer = ProducerOptions(format="jsonl")
    with pytest.raises(OptionError, match=r"^format= given beside producer="):
        ShardCache(src, tmp_path / "c", max_bytes="1MiB", producer=producer, format="jsonl")
    with pytest.raises(OptionError, match=r"^shard_size= given beside producer="):
        ShardCache(src, tmp_path / "c", max_bytes="1MiB", producer=producer, shard_size="1MiB")
    options = rk.conversion.ConvertOptions(shard_size="16KiB")
    for kw in ({"shard_size": "256MiB"}, {"compress": None}):  # the defaults: still two ways
        with pytest.raises(OptionError, match="given beside convert_options="):
            ShardCache(
                src, tmp_path / "c", max_bytes="1MiB", format="jsonl", convert_options=options, **kw
            )
    # shard mode has no producer settings
    with pytest.raises(ValueError, match="inactivity_timeout: producer mode only"):
        ShardCache(src, tmp_path / "c", max_bytes="1MiB", inactivity_timeout=5.0)
    with pytest.raises(ValueError, match="max_records"):
        ProducerOptions("jsonl", convert_options=rk.conversion.ConvertOptions(max_records=3))
    with pytest.raises(ValueError, match="inactivity_timeout"):
        ProducerOptions("jsonl", inactivity_timeout=0)
    with pytest.raises(TypeError, match="producer= takes a ProducerOptions"):
        ShardCache(src, tmp_path / "c", max_bytes="1MiB", producer={"format": "jsonl"})  # type: ignore[arg-type]
    frozen = ProducerOptions("jsonl", source_options={"a": 1})
    with pytest.raises(TypeError):
        frozen.source_options["a"] = 2  # type: ignore[index]


def _double(x):
    return {"x": x * 2}


def test_convert_and_write_take_shard_size_one_way(tmp_path):
    """``shard_size=``/``compress=`` are fields of ``options=``: beside it, even at their
    defaults, they are refused by name instead of silently losing to it."""
    src = _jsonl(tmp_path / "raw", 1)
    options = rk.conversion.ConvertOptions(shard_size="64KiB")
    with pytest.raises(OptionError, match=r"^shard_size= given beside options="):
        rk.convert(src, tmp_path / "out", format="jsonl", shard_size="256MiB", options=options)
    with pytest.raises(OptionError, match=r"^compress= given beside options="):
        rk.write(
            _double,
            [1, 2],
            tmp_path / "w",
            schema=rk.Schema(x=rk.Int64()),
            compress=None,
            options=options,
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "w").exists()
