"""``recordkit cache fill | status | gc``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from recordkit.cli import main

from .conftest import disk_bytes, overhead, visible_shards, write_dataset

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def remote(tmp_path):
    url = tmp_path / "remote"
    write_dataset(url, shards=6, records=10, size=1000)
    return url


def test_fill_status_gc(remote, tmp_path, capsys):
    local = tmp_path / "c"
    budget = 40 * 1024 + overhead(remote)
    assert main(["cache", "fill", str(remote), str(local), "--max-bytes", str(budget)]) == 0
    err = capsys.readouterr().err
    assert "of 6 shards cached" in err
    n = len(visible_shards(local))
    assert 1 <= n < 6 and disk_bytes(local) <= budget

    assert main(["cache", "status", str(local), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["complete"] == n and doc["remote_shards"] == 6 and doc["max_bytes"] == budget
    meta = disk_bytes(local / ".recordkit-cache")
    assert doc["used"] - doc["bookkeeping"] == disk_bytes(local) - meta
    assert disk_bytes(local) <= doc["used"] and doc["remote"] == str(remote)
    assert main(["cache", "status", str(local)]) == 0
    assert f"shards       {n} of 6" in capsys.readouterr().out

    (local / "part-00005.tfrecord.tmp-0123456789ab").write_bytes(b"left by a killed fill")
    assert main(["cache", "gc", str(local)]) == 0
    assert "part-00005.tfrecord.tmp-0123456789ab" in capsys.readouterr().out
    assert len(visible_shards(local)) == n

    assert main(["cache", "gc", str(local), "--max-bytes", "1"]) == 0
    assert visible_shards(local) == []
    assert disk_bytes(local) == disk_bytes(local / ".recordkit-cache")  # bookkeeping only


def test_errors_are_messages(tmp_path, capsys):
    assert main(["cache", "status", str(tmp_path / "nothing")]) == 2
    assert "recordkit cache status: error:" in capsys.readouterr().err
    assert (
        main(["cache", "fill", str(tmp_path / "none"), str(tmp_path / "c"), "--max-bytes", "1MiB"])
        == 2
    )


def test_fill_from_the_console_script(remote, tmp_path):
    script = str(os.path.join(os.path.dirname(sys.executable), "recordkit"))
    out = subprocess.run(
        [script, "cache", "fill", str(remote), str(tmp_path / "c"), "--max-bytes", "1MiB"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "6 of 6 shards cached" in out.stderr
    assert len(visible_shards(tmp_path / "c")) == 6
