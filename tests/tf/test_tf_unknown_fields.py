"""recordkit.tf and records holding a field their message does not define (issue 15).

TensorFlow's parsers skip such a field. Where ``recordkit.tf`` reads through the epoch
plan (shuffled, split over pipelines, tfds folders), it checks each task's records
natively before handing them to TensorFlow, and refuses such a record by name, as every
other recordkit reader does. The plain ``TFRecordDataset`` path (one pipeline, in order;
the shard cache; ``gs://``) hands the records to TensorFlow unread, so TensorFlow's
parser decides: it drops the field, as ``docs/howto/foreign-tfrecords.md`` says.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ..reader.test_unknown_fields import BAD, SCHEMA, WHERE, N, write_source

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")

pytestmark = pytest.mark.tf


@pytest.fixture(params=list(WHERE))
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def src(tmp_path: Path, where: str) -> Path:
    return write_source(tmp_path / "src", where)


def _ids(ds: object) -> list[int]:
    return [int(i) for b in ds for i in np.atleast_1d(b["id"].numpy())]  # type: ignore[attr-defined]


@pytest.mark.parametrize("batch_size", [None, 4])
def test_the_plan_ordered_path_refuses_it(src: Path, where: str, batch_size: int | None) -> None:
    ds = rtf.dataset(src, schema=SCHEMA, shuffle=True, seed=3, batch_size=batch_size)
    with pytest.raises(tf.errors.OpError) as info:
        _ids(ds)
    text = str(info.value)
    assert "UnknownFieldError" in text
    assert f"{src / 'data.tfrecord'}:" in text and f":{BAD}: {WHERE[where]}" in text


def test_the_plain_path_reads_what_tensorflow_reads(src: Path, where: str) -> None:
    """Unshuffled, one pipeline: TensorFlow parses the records itself and drops the
    field (the documented limit of that path)."""
    ids = _ids(rtf.dataset(src, schema=SCHEMA, batch_size=4))
    assert ids == list(range(N))
