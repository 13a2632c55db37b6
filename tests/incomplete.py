"""Shared checks: a folder where a write did not finish is refused by every reader,
and read (what was published) with ``partial=True``. Used by the writer and convert tests."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import recordkit as rk
from recordkit.cli import main
from recordkit.errors import IncompleteDatasetError
from recordkit.reader import ReadOptions


def assert_refused_everywhere(path: Path, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every reader, ``verify`` and the CLI refuse ``path``; each message contains ``says``."""
    for read in (
        lambda: rk.Dataset(path),
        lambda: rk.Dataset(path, write_index=False),
    ):
        with pytest.raises(IncompleteDatasetError, match=re.escape(says)) as info:
            read()
        assert str(path) in str(info.value) and "partial=True" in str(info.value)
    report = rk.verify(path)
    assert not report.ok
    assert says in str(report.problems[0]) and ".recordkit-writing.json" in report.problems[0].path
    capsys.readouterr()
    assert main(["verify", str(path)]) == 1
    err = capsys.readouterr()
    assert says in err.out and "FAILED" in err.err
    for command in ("info", "head"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert f"recordkit {command}: error:" in err and says in err
    try:
        from recordkit.torch import RecordDataset, RecordMapDataset
    except ImportError:
        return
    for cls in (RecordDataset, RecordMapDataset):
        with pytest.raises(IncompleteDatasetError, match=re.escape(says)):
            cls(path)


def assert_partial_reads(
    path: Path, records: int, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``partial=True`` reads the ``records`` published, and says so at WARNING."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="recordkit"):
        with rk.Dataset(path, partial=True) as ds:
            assert len(ds) == records and len(list(ds)) == records
        report = rk.verify(path, partial=True)
        assert report.ok and report.records == records, str(report)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all(says in w for w in warnings), warnings
    assert main(["verify", "--partial", str(path)]) == 0
    assert main(["head", "--partial", "-n", "1", str(path)]) == 0
    try:
        from recordkit.torch import RecordDataset, RecordMapDataset
    except ImportError:
        return
    assert sum(1 for _ in RecordDataset(path, options=ReadOptions(partial=True))) == records
    assert len(RecordMapDataset(path, options=ReadOptions(partial=True))) == records
