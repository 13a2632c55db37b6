"""Faults: processes SIGKILLed while pinning or downloading, a full disk."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import recordkit as rk
from recordkit.cache import CacheFullError, ShardCache, fetch
from recordkit.format.index import scan_index
from recordkit.format.manifest import read_manifest

from .conftest import disk_bytes, overhead, visible_shards, write_dataset

pytestmark = pytest.mark.timeout(120)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def remote(tmp_path):
    url = tmp_path / "remote"
    write_dataset(url, shards=8, records=20, size=2000)
    return url


def assert_intact(root, remote) -> None:
    """Every visible shard is complete, indexed, and byte-identical to the remote's."""
    for name in visible_shards(root):
        assert os.path.exists(os.path.join(root, name + ".idx")), name
        with open(os.path.join(root, name), "rb") as a, open(os.path.join(remote, name), "rb") as b:
            assert a.read() == b.read(), name
        scan_index(os.path.join(root, name), verify=True)


class Child:
    """A Python subprocess that prints a line when it is ready; killed in the end."""

    def __init__(self, code: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    def wait_for(self, word: str) -> None:
        line = self.proc.stdout.readline()  # bounded by the test timeout
        assert word in line, line + self.proc.stderr.read()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def child():
    made: list[Child] = []

    def start(code: str) -> Child:
        made.append(Child(code))
        return made[-1]

    yield start
    for c in made:
        c.close()


def test_reader_sigkilled_while_pinning_releases_its_pins(remote, tmp_path, child):
    root = tmp_path / "c"
    budget = 3 * max(s.bytes for s in read_manifest(remote).shards) + 2000 + overhead(remote)
    cache = ShardCache(remote, root, max_bytes=budget, fill_workers=0)
    assert cache.fill() == 3
    reader = child(
        f"""
        from recordkit.cache import ShardCache
        cache = ShardCache(None, {str(root)!r}, max_bytes={budget})
        snap = cache.snapshot(0)
        for s in snap.shards:
            snap.mark_consumed(s)   # read, but still pinned (mapped)
        print("pinned", len(snap), flush=True)
        import time; time.sleep(120)
        """
    )
    reader.wait_for("pinned 3")
    assert cache.fill_one() == "blocked"  # everything is pinned by a live reader
    assert cache.status().pinned == 3
    reader.kill()
    assert cache.fill_one() == "worked"  # the dead reader's pins are gone
    assert cache.status().pinned == 0
    assert disk_bytes(root) <= budget
    assert_intact(root, remote)


def test_filler_sigkilled_mid_download_leaves_nothing_visible(remote, tmp_path, child):
    root = tmp_path / "c"
    filler = child(
        f"""
        import time
        from recordkit.cache import ShardCache, fetch
        real = fetch._write_all
        calls = []
        def slow_write(fd, data):
            real(fd, data)
            calls.append(1)
            if len(calls) == 10:  # 4 writes a shard (3 chunks, 1 index): 2 done, 1 half
                print("downloading", flush=True)
                time.sleep(120)
        fetch._write_all = slow_write
        ShardCache({str(remote)!r}, {str(root)!r}, max_bytes="1GiB", fill_workers=1,
                   chunk_bytes="16KiB").fill()
        """
    )
    filler.wait_for("downloading")
    filler.kill()
    temps = [n for n in os.listdir(root) if ".tmp-" in n]
    assert temps and len(visible_shards(root)) == 2
    assert_intact(root, remote)
    complete = set(visible_shards(root))
    cache = ShardCache(remote, root, max_bytes="1GiB", fill_workers=2)
    cache.gc()
    assert [n for n in os.listdir(root) if ".tmp-" in n] == []
    assert complete <= set(visible_shards(root))  # no complete shard lost
    assert cache.status().downloading == 0
    assert cache.fill() == 8
    assert_intact(root, remote)


def test_two_processes_fill_one_directory(remote, tmp_path, child):
    root = tmp_path / "c"
    budget = 5 * max(s.bytes for s in read_manifest(remote).shards) + 3000 + overhead(remote)
    code = f"""
        from recordkit.cache import ShardCache
        n = ShardCache({str(remote)!r}, {str(root)!r}, max_bytes={budget}, fill_workers=2,
                       chunk_bytes="4KiB").fill()
        print("done", n, flush=True)
        """
    a, b = child(code), child(code)
    a.wait_for("done")
    b.wait_for("done")
    assert len(visible_shards(root)) == 5 and disk_bytes(root) <= budget
    assert_intact(root, remote)


def test_injected_enospc_is_a_clear_error(remote, tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fetch, "_write_all", full)
    cache = ShardCache(remote, tmp_path / "c", max_bytes="1GiB", fill_workers=1)
    with pytest.raises(CacheFullError, match=r"disk under .* is full") as info:
        cache.fill()
    assert info.value.errno == errno.ENOSPC and info.value.path.startswith("part-")
    assert [n for n in os.listdir(tmp_path / "c") if n != ".recordkit-cache"] == []
    # in the background the workers stop and a waiting reader gets the error
    cache.start()
    with pytest.raises(CacheFullError):
        cache.snapshot(0, timeout=60)
    cache.stop()


def test_enospc_evicts_read_shards_then_retries(remote, tmp_path, monkeypatch):
    root = tmp_path / "c"
    cache = ShardCache(remote, root, max_bytes="1GiB", fill_workers=0)
    cache.fill_one()
    cache.fill_one()
    with cache.snapshot(0) as snap:
        for s in snap.shards:
            snap.mark_consumed(s)
    real, failures = fetch._write_all, [1]

    def full_once(fd, data):
        if failures:
            failures.pop()
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(fetch, "_write_all", full_once)
    assert cache.fill_one() == "worked"
    assert len(visible_shards(root)) == 1  # both read shards went; the new one arrived
    assert_intact(root, remote)


def test_a_real_full_tmpfs(remote, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    tag = uuid.uuid4().hex[:8]
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=120k", f"rk{tag}", str(mnt)],
        capture_output=True,
        timeout=30,
    )
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.decode().strip()}")
    try:
        # the budget is larger than the disk: the disk fills first
        cache = ShardCache(remote, mnt / "c", max_bytes="1GiB", fill_workers=1)
        with pytest.raises(CacheFullError, match="is full"):
            cache.fill()
        assert 1 <= len(visible_shards(mnt / "c")) < 8
        assert [n for n in os.listdir(mnt / "c") if ".tmp-" in n] == []
        assert_intact(mnt / "c", remote)
        with cache.snapshot(0) as snap, rk.Dataset(snap.paths[0]) as ds:
            assert len(ds) == 20
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_sigkill_at_any_moment_loses_nothing_and_leaves_nothing(tmp_path, child):
    """A process that fills, reads and evicts is SIGKILLed at moments spread over its
    work, again and again: after each kill the directory holds every shard it held,
    whole, the store lists exactly those, no temp file stays, and the budget holds."""
    remote = tmp_path / "remote"
    manifest = write_dataset(remote, shards=40, records=2, size=200)
    root = tmp_path / "c"
    # (the store's history and change log grow a little as shards come and go)
    budget = 6 * max(s.bytes for s in manifest.shards) + 16 * 1024 + overhead(remote)
    code = f"""
        from recordkit.cache import ShardCache
        cache = ShardCache({str(remote)!r}, {str(root)!r}, max_bytes={budget}, fill_workers=2)
        cache.start()
        print("started", flush=True)
        epoch = 0
        while True:  # read everything there, so the filler may displace it
            with cache.snapshot(epoch, min_shards=1, timeout=60) as snap:
                for s in snap.shards:
                    snap.mark_consumed(s, release=True)
            epoch += 1
        """
    for delay in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2):
        filler = child(code)
        filler.wait_for("started")
        time.sleep(delay)
        filler.kill()
        before = set(visible_shards(root))
        cache = ShardCache(remote, root, max_bytes=budget, fill_workers=0)
        cache.gc()  # what a restart does
        after = set(visible_shards(root))
        assert before <= after, f"lost at {delay} s: {before - after}"
        assert [n for n in os.listdir(root) if ".tmp-" in n] == []
        assert_intact(root, remote)
        with cache.dir.lock():
            assert set(cache.dir.scan().complete) == after
        assert disk_bytes(root) <= budget
        cache.dir.store.close()
    assert ShardCache(remote, root, max_bytes=budget, fill_workers=0).fill() >= 1
