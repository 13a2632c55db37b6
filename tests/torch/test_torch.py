import json
import os
import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import CorruptRecordError
from recordkit.reader import ReadOptions

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from recordkit.torch import DataLoader, RecordDataset, RecordMapDataset  # noqa: E402

SCHEMA = rk.Schema(
    idx=rk.Int64(),
    data=rk.Bytes(),
    vec=rk.Float32((4,)),
    img=rk.Tensor("uint8", (2, 3)),
    var=rk.Float32((None,)),
)
N = 157


def _sample(i):
    rng = np.random.default_rng(i)
    return {
        "idx": i,
        "data": bytes(rng.integers(0, 256, i % 37, dtype=np.uint8)),
        "vec": rng.standard_normal(4).astype(np.float32),
        "img": rng.integers(0, 256, (2, 3), dtype=np.uint8),
        "var": np.arange(i % 5, dtype=np.float32),
    }


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchds") / "ds"
    with rk.Writer(root, SCHEMA, max_records=20) as w:
        for i in range(N):
            w.write(_sample(i))
    return root


def _ids(batches):
    return [int(i) for b in batches for i in b["idx"].reshape(-1).tolist()]


def test_batches_equal_written_values(ds_path):
    ds = RecordDataset(ds_path, batch_size=16)
    batches = list(ds)
    assert len(batches) == len(ds) == 10
    assert _ids(batches) == list(range(N))
    for b in batches:
        assert b["vec"].dtype == torch.float32 and b["img"].shape[1:] == (2, 3)
        for j, i in enumerate(b["idx"].tolist()):
            want = _sample(i)
            n = int(b["data/lengths"][j])
            assert bytes(b["data"][j, :n].numpy()) == want["data"]
            assert not b["data"][j, n:].any()
            assert torch.equal(b["vec"][j], torch.from_numpy(want["vec"]))
            assert torch.equal(b["img"][j], torch.from_numpy(want["img"]))
            k = int(b["var/lengths"][j])  # ragged: padded, with lengths
            assert torch.equal(b["var"][j, :k], torch.from_numpy(want["var"]))
            assert not b["var"][j, k:].any()
    assert ds.stats.records == N and ds.stats.batches == 10 and ds.stats.bytes > 0


def test_bytes_as_list_and_columns(ds_path):
    ds = RecordDataset(
        ds_path, batch_size=50, columns=["idx", "data"], options=ReadOptions(bytes_as="list")
    )
    b = next(iter(ds))
    assert set(b) == {"idx", "data"}
    assert b["data"][:3] == [_sample(i)["data"] for i in range(3)]


def test_samples(ds_path):
    samples = list(RecordDataset(ds_path))
    assert [int(s["idx"]) for s in samples] == list(range(N))
    assert samples[5]["data"] == _sample(5)["data"]
    assert samples[5]["idx"].shape == ()


def test_shuffle_deterministic_and_epochs_differ(ds_path):
    a = RecordDataset(ds_path, batch_size=8, shuffle=True, seed=1)
    e0, e1 = _ids(a), _ids(a)  # the epoch advances after a full pass
    assert sorted(e0) == sorted(e1) == list(range(N)) and e0 != e1
    b = RecordDataset(ds_path, batch_size=8, shuffle=True, seed=1)
    assert _ids(b) == e0
    b.set_epoch(1)
    assert _ids(b) == e1


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_dataloader_workers_give_the_same_stream(ds_path, workers):
    ds = RecordDataset(
        ds_path, batch_size=8, shuffle=True, seed=4, options=ReadOptions(num_threads=1)
    )
    want = _ids(RecordDataset(ds_path, batch_size=8, shuffle=True, seed=4))
    loader = DataLoader(ds, num_workers=workers)
    assert _ids(loader) == want
    assert ds.epoch == 1  # the loader advanced it


def test_resume_in_process(ds_path):
    full = _ids(RecordDataset(ds_path, batch_size=8, shuffle=True, seed=2))
    ds = RecordDataset(ds_path, batch_size=8, shuffle=True, seed=2)
    it = iter(ds)
    head = [next(it) for _ in range(5)]
    state = ds.state_dict()
    it.close()
    fresh = RecordDataset(ds_path, batch_size=8, shuffle=True, seed=2)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert _ids(head) + _ids(fresh) == full


RESUME_SCRIPT = """
import json, sys
from recordkit.torch import DataLoader, ReadOptions, RecordDataset
path, state_file, mode, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ds = RecordDataset(path, batch_size=8, shuffle=True, seed=3, options=ReadOptions(num_threads=2))
loader = DataLoader(ds, num_workers=workers)
ids = []
if mode == "first":
    for k, batch in enumerate(loader):
        ids += batch["idx"].tolist()
        if k == 6:
            break
    json.dump({"state": loader.state_dict(), "ids": ids}, open(state_file, "w"))
else:
    loader.load_state_dict(json.load(open(state_file))["state"])
    for batch in loader:
        ids += batch["idx"].tolist()
    print(json.dumps(ids))
"""


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_in_a_new_process(ds_path, tmp_path, workers):
    full = _ids(RecordDataset(ds_path, batch_size=8, shuffle=True, seed=3))
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    state = tmp_path / "state.json"
    run = [sys.executable, str(script), str(ds_path), str(state)]
    subprocess.run([*run, "first", str(workers)], check=True, timeout=120)
    out = subprocess.run(
        [*run, "second", str(workers)], check=True, timeout=120, capture_output=True, text=True
    )
    first = json.loads(state.read_text())["ids"]
    assert first + json.loads(out.stdout) == full


def test_resume_refuses_other_settings(ds_path):
    state = RecordDataset(ds_path, batch_size=8).state_dict()
    with pytest.raises(ValueError, match="global_batch was 8 when saved, is 4 now"):
        RecordDataset(ds_path, batch_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        RecordDataset(ds_path, batch_size=8, seed=1).load_state_dict(state)
    old = {**state, "version": 1}
    with pytest.raises(ValueError, match="older version's epoch order differs"):
        RecordDataset(ds_path, batch_size=8).load_state_dict(old)


@pytest.fixture
def corrupt_path(ds_path, tmp_path):
    root = tmp_path / "corrupt"
    root.mkdir()
    for f in ds_path.iterdir():
        (root / f.name).write_bytes(f.read_bytes())
    shard = root / "part-00001.tfrecord"
    offsets = [
        int(x.split()[0]) for x in (root / "part-00001.tfrecord.idx").read_text().split("\n") if x
    ]
    data = bytearray(shard.read_bytes())
    data[offsets[4] + 20] ^= 0x10  # payload of record 4 of shard 1 = global 24
    shard.write_bytes(bytes(data))
    return root, offsets[4]


@pytest.mark.timeout(60)
def test_on_error_raise(corrupt_path):
    root, offset = corrupt_path
    with pytest.raises(CorruptRecordError) as info:
        list(RecordDataset(root, batch_size=8))
    err = info.value
    assert err.path.endswith("part-00001.tfrecord") and (err.offset, err.record) == (offset, 4)
    assert "payload CRC mismatch" in str(err)
    # no reader thread is left behind after the error
    assert not [t for t in threading.enumerate() if t.name.startswith("recordkit-reader")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_on_error_skip_and_warn(corrupt_path, policy):
    root, _ = corrupt_path
    ds = RecordDataset(root, batch_size=8, options=ReadOptions(on_error=policy))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = _ids(ds)
    assert ids == [i for i in range(N) if i != 24]
    assert ds.stats.skipped == 1
    assert (len([w for w in caught if "part-00001.tfrecord" in str(w.message)]) == 1) == (
        policy == "warn"
    )


def test_map_dataset(ds_path):
    ds = RecordMapDataset(ds_path)
    assert len(ds) == N
    s = ds[42]
    assert int(s["idx"]) == 42 and s["data"] == _sample(42)["data"]
    assert int(ds[-1]["idx"]) == N - 1
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=10,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        collate_fn=lambda xs: [int(x["idx"]) for x in xs],
    )
    assert sorted(i for b in loader for i in b) == list(range(N))
    with pytest.raises(IndexError):
        ds[N]


def test_import_names_the_extra():
    # recordkit is not on the package index: the advice installs the extra from the
    # checkout this recordkit runs from (the test environment's editable install).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "import sys; sys.modules['torch'] = None; import recordkit.torch"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    from recordkit._deps import install_command

    assert f"is not installed: {install_command('torch')}" in out.stderr
    assert "pip install -e '" in out.stderr and "[torch]'" in out.stderr


DDP_SCRIPT = """
import json, os, sys
import torch.distributed as dist
from recordkit.torch import DataLoader, ReadOptions, RecordDataset
dist.init_process_group("gloo", init_method="env://")
ds = RecordDataset(sys.argv[1], batch_size=4, shuffle=True, seed=11, drop_last=False,
                   options=ReadOptions(num_threads=1))
loader = DataLoader(ds, num_workers=2)
epochs = [[i for b in loader for i in b["idx"].tolist()] for _ in range(2)]
json.dump(epochs, open(sys.argv[2] + f".{dist.get_rank()}", "w"))
dist.barrier()
dist.destroy_process_group()
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_run(ds_path, tmp_path, tag):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE="2",
            GLOO_SOCKET_IFNAME="lo",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(ds_path), str(tmp_path / tag)], env=env
            )
        )
    for p in procs:
        assert p.wait(timeout=180) == 0
    return [json.loads(Path(f"{tmp_path / tag}.{r}").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ddp_two_ranks_two_workers(ds_path, tmp_path):
    runs = [_ddp_run(ds_path, tmp_path, tag) for tag in ("a", "b")]
    first, second = runs
    assert first == second  # same seed, same order on every rank
    for epoch in range(2):
        union = first[0][epoch] + first[1][epoch]
        assert sorted(union) == list(range(N))  # exactly once over ranks x workers
    assert first[0][0] != first[0][1]  # a new order each epoch


def _collate_ids(samples):
    return [int(x["idx"]) for x in samples]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_spawned_workers(ds_path):
    """Workers started with spawn get the dataset by pickle: it must travel without its maps."""
    ds = RecordDataset(ds_path, batch_size=16, options=ReadOptions(num_threads=1))
    loader = DataLoader(ds, num_workers=2, multiprocessing_context="spawn")
    assert _ids(loader) == list(range(N))
    maps = RecordMapDataset(ds_path)
    plain = torch.utils.data.DataLoader(
        maps,
        batch_size=32,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=_collate_ids,
    )
    assert [i for b in plain for i in b] == list(range(N))
