"""One generation per reader: a dataset replaced under an open reader is read whole from
the files it had mapped, or refused by name; never a mix of the two (issue 29)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import recordkit as rk
from recordkit.errors import ShardChangedError
from recordkit.reader import ReadOptions

SCHEMA = rk.Schema(i=rk.Int64())
N = 2000


def _write(path, base: int, overwrite: bool = False) -> None:
    with rk.Writer(path, SCHEMA, max_records=100, overwrite=overwrite, fsync=False) as w:
        for i in range(N):
            w.write({"i": base + i})


def _generation(ids: list[int]) -> set[int]:
    return {i // 100_000 for i in ids}


def test_a_dataset_opened_before_an_overwrite_is_never_read_as_a_mix(tmp_path):
    d = tmp_path / "d"
    _write(d, 0)
    ds = rk.Dataset(d)
    first = [int(ds[i]["i"]) for i in range(100)]  # one shard mapped
    _write(d, 100_000, overwrite=True)
    got = list(first)
    with pytest.raises(ShardChangedError, match="was replaced after this reader opened it") as e:
        for i in range(100, N):
            got.append(int(ds[i]["i"]))
    assert "part-00001.tfrecord" in str(e.value) and "generation" in str(e.value)
    assert _generation(got) == {0}  # what it did read is the old data only
    assert [int(s["i"]) for s in rk.Dataset(d)] == list(range(100_000, 100_000 + N))


def test_the_same_records_written_again_are_the_same_generation(tmp_path):
    d = tmp_path / "d"
    _write(d, 0)
    ds = rk.Dataset(d)
    assert int(ds[0]["i"]) == 0
    _write(d, 0, overwrite=True)  # byte for byte the same dataset
    assert [int(s["i"]) for s in ds] == list(range(N))


def test_recorddataset_does_not_read_its_next_epoch_from_another_dataset(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")  # noqa: F841
    from recordkit.torch import RecordDataset

    monkeypatch.setenv("RECORDKIT_MAX_OPEN_SHARDS", "4")  # most shards unmapped again
    d = tmp_path / "d"
    _write(d, 0)
    ds = RecordDataset(d, batch_size=50, shuffle=True, seed=0, options=ReadOptions(num_threads=1))
    epoch0 = [i for b in ds for i in b["i"].tolist()]
    assert sorted(epoch0) == list(range(N))
    _write(d, 100_000, overwrite=True)
    seen = []
    with pytest.raises(ShardChangedError):
        for b in ds:
            seen += b["i"].tolist()
    assert _generation(seen) <= {0}


_PAUSED = textwrap.dedent(
    """
    import sys, time
    import recordkit.torch as rkt
    ds = rkt.RecordDataset(
        sys.argv[1], batch_size=50, shuffle=True, seed=0, options=rkt.ReadOptions(num_threads=1)
    )
    it = iter(ds)
    seen = []
    for _ in range(5):
        seen += next(it)["i"].tolist()
    print("paused", flush=True)
    sys.stdin.readline()  # the dataset is converted again meanwhile
    try:
        for b in it:
            seen += b["i"].tolist()
        print("finished", len(seen), sorted({i // 100000 for i in seen}))
    except Exception as exc:
        print("refused", type(exc).__name__, sorted({i // 100000 for i in seen}))
    """
)


def test_a_training_process_paused_across_convert_overwrite(tmp_path):
    """As a user hits it: a training process pauses, `recordkit convert --overwrite`
    rewrites its dataset, training goes on: the old data whole, or a clear error."""
    pytest.importorskip("torch")
    src = tmp_path / "rows"
    src.mkdir()
    for base, name in ((0, "v1"), (100_000, "v2")):
        (src / name).mkdir()
        for f in range(10):
            rows = "".join(f'{{"i": {base + f * 300 + r}}}\n' for r in range(300))
            (src / name / f"f{f}.jsonl").write_text(rows)
    d = tmp_path / "d"
    cli = [sys.executable, "-m", "recordkit", "convert"]
    opts = ["--from", "jsonl", "--workers", "0", "--partition-size", "1", "--progress", "none"]
    subprocess.run([*cli, str(src / "v1"), str(d), *opts], check=True, capture_output=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", _PAUSED, str(d)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "paused"
        run = subprocess.run(
            [*cli, str(src / "v2"), str(d), *opts, "--overwrite"], capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        out, _ = proc.communicate("go\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    kind, *rest = out.split()
    assert kind in ("finished", "refused"), out
    if kind == "finished":
        assert rest == ["3000", "[0]"], out
    else:
        assert rest[0] == "ShardChangedError" and rest[1:] in (["[0]"], ["[]"]), out
