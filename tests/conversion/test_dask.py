"""The Dask engine on a LocalCluster on loopback writes exactly what the local engine writes."""

from __future__ import annotations

import pytest

import recordkit as rk

from .cases import assert_samples_equal, numpy_npz, read_all
from .test_convert import _rows, tree


@pytest.mark.slow
def test_dask_local_cluster_is_byte_identical(tmp_path):
    distributed = pytest.importorskip("distributed")
    expected = _rows(tmp_path / "src", files=5)
    rk.convert(tmp_path / "src", tmp_path / "local", format="jsonl", workers=2, shard_size="2KiB")
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
    ):
        result = rk.convert(
            tmp_path / "src",
            tmp_path / "dask",
            format="jsonl",
            shard_size="2KiB",
            engine="dask",
            scheduler=cluster.scheduler_address,
        )
        assert result.partitions == 5
        # A second source through the same cluster: numpy with zstd tensors.
        numpy_src = tmp_path / "np"
        numpy_src.mkdir()
        _, np_expected = numpy_npz(numpy_src)
        rk.convert(
            numpy_src,
            tmp_path / "np-dask",
            format="numpy",
            compress="zstd",
            engine="dask",
            scheduler=cluster.scheduler_address,
            shard_size="1KiB",
        )
    assert tree(tmp_path / "dask") == tree(tmp_path / "local")
    assert_samples_equal(read_all(tmp_path / "dask"), expected)
    rk.convert(
        numpy_src,
        tmp_path / "np-local",
        format="numpy",
        compress="zstd",
        workers=0,
        shard_size="1KiB",
    )
    assert tree(tmp_path / "np-dask") == tree(tmp_path / "np-local")
    assert_samples_equal(read_all(tmp_path / "np-dask"), np_expected)


@pytest.mark.slow
def test_dask_without_scheduler_starts_a_local_cluster(tmp_path):
    pytest.importorskip("distributed")
    _rows(tmp_path / "src", files=2)
    rk.convert(tmp_path / "src", tmp_path / "a", format="jsonl", workers=0, shard_size="2KiB")
    rk.convert(
        tmp_path / "src",
        tmp_path / "b",
        format="jsonl",
        workers=2,
        engine="dask",
        shard_size="2KiB",
    )
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
