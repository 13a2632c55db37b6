"""``recordkit.tf.dataset`` refuses a folder where a write did not finish, unless ``partial``."""

from __future__ import annotations

import pytest

import recordkit as rk
from recordkit.errors import IncompleteDatasetError
from recordkit.reader import ReadOptions

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")

pytestmark = pytest.mark.tf


def test_tf_dataset_refuses_an_unfinished_writer(tmp_path, caplog):
    schema = rk.Schema(label=rk.Int64())
    with pytest.raises(KeyError), rk.Writer(tmp_path, schema, max_records=4) as w:
        for i in range(10):
            w.write({"label": i})
        raise KeyError("stop")
    with pytest.raises(IncompleteDatasetError, match="a Writer did not finish here"):
        rtf.dataset(tmp_path)
    ds = rtf.dataset(tmp_path, options=ReadOptions(partial=True))
    assert sorted(int(x["label"]) for x in ds) == list(range(8))
    assert any("unfinished Writer" in r.getMessage() for r in caplog.records)
