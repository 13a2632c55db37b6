"""The one progress meter (``recordkit._progress``) and the one size / grammar helper.

Every display is driven here with a stream that says it is (or is not) a terminal,
with tqdm present or hidden; nothing asserts on wall-clock time.
"""

from __future__ import annotations

import io
import logging
import sys
import threading

import pytest

from recordkit._progress import Meter, NoTracker, resolve_mode
from recordkit._units import format_duration, format_rate, format_size, noun, plural

pytestmark = pytest.mark.timeout(60)


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as a user's stderr does."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def no_tqdm(monkeypatch):
    """tqdm not installed: importing it raises ImportError."""
    monkeypatch.setitem(sys.modules, "tqdm", None)


def test_sizes_are_binary_and_one_function():
    assert format_size(0) == "0 B"
    assert format_size(1023) == "1023 B"
    assert format_size(1024) == "1.0 KiB"
    assert format_size(236093952) == "225.2 MiB"
    assert format_size(3 << 30) == "3.0 GiB"
    assert format_size(5 << 40) == "5.0 TiB"
    assert format_rate(12.5 * 2**20) == "12.5 MiB/s"


def test_durations():
    assert format_duration(0.4) == "0 s"
    assert format_duration(42) == "42 s"
    assert format_duration(185) == "3 min 05 s"
    assert format_duration(2 * 3600 + 7 * 60 + 59) == "2 h 07 min"
    assert format_duration(-3) == "0 s"


def test_grammar():
    assert plural(1, "shard") == "1 shard"
    assert [plural(n, "shard") for n in (0, 2)] == ["0 shards", "2 shards"]
    assert plural(1, "partition") == "1 partition" and plural(3, "index file") == "3 index files"
    assert plural(2, "index", "indexes") == "2 indexes" and noun(1, "record") == "record"


def test_modes_resolve_from_the_stream_and_tqdm(no_tqdm):
    assert resolve_mode("auto", io.StringIO()) == "log"  # a pipe, a file, CI
    assert resolve_mode("auto", Terminal()) == "plain"  # a terminal without tqdm
    assert resolve_mode("bar", Terminal()) == "plain"  # never refuse to run
    assert resolve_mode("none", Terminal()) == "none"
    with pytest.raises(ValueError, match="progress mode must be one of"):
        resolve_mode("fancy")


def test_auto_is_a_bar_on_a_terminal_with_tqdm():
    pytest.importorskip("tqdm")
    assert resolve_mode("auto", Terminal()) == "bar"


def test_bar_on_a_terminal_in_binary_units():
    pytest.importorskip("tqdm")
    out = Terminal()
    meter = Meter("verify", mode="auto", stream=out)
    assert meter.mode == "bar"
    meter.start(bytes=10 << 20, shards=2, records=400)
    meter.add(bytes=5 << 20, shards=1, records=200)
    meter.add(bytes=5 << 20, shards=1, records=200)
    meter.close()
    text = out.getvalue()
    assert "verify: 100%|" in text and "10.0 MiB/10.0 MiB" in text
    assert "MB" not in text.replace("MiB", "")  # binary units only, tqdm's decimal ones unused
    assert text.endswith("\n")  # the bar stays, the summary goes below it


def test_plain_line_without_tqdm(no_tqdm):
    out = Terminal()
    meter = Meter("cache fill", mode="auto", stream=out)
    assert meter.mode == "plain"
    meter.start(bytes=3 << 20, done={"shards": 0})
    meter.add(bytes=3 << 20, shards=3)
    meter.close()
    text = out.getvalue()
    assert text.startswith("\rcache fill: ") and text.endswith("\n")
    last = text.rstrip("\n").rsplit("\r", 1)[-1]
    assert last.startswith("cache fill: 3.0 MiB/3.0 MiB (100%), 3 shards, ")
    assert "elapsed" in last and meter.lines >= 2


def test_plain_to_a_file_writes_whole_lines():
    out = io.StringIO()
    meter = Meter("index", mode="plain", stream=out, interval=3600)
    meter.start(bytes=100, shards=1)
    meter.add(bytes=100, shards=1)
    meter.close()
    assert "\r" not in out.getvalue()
    (line,) = out.getvalue().splitlines()  # one an interval, and the final one
    assert line.startswith("index: 100 B/100 B (100%), 1/1 shard, ") and line.endswith("elapsed")


def test_log_lines_at_info_with_rate_and_eta(caplog):
    caplog.set_level(logging.INFO, logger="recordkit.progress")
    meter = Meter("verify", mode="auto", stream=io.StringIO(), interval=0)
    assert meter.mode == "log"
    meter.start(bytes=4 << 30, shards=4, records=None, done={"records": 0})
    meter.add(bytes=1 << 30, shards=1, records=1000)
    meter.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "recordkit.progress"]
    assert all(r.levelno == logging.INFO for r in caplog.records)
    assert lines[0].startswith("verify: 0 B/4.0 GiB (0%), 0/4 shards, 0 records")
    assert "ETA" in lines[0]
    assert lines[-1].startswith("verify: 1.0 GiB/4.0 GiB (25%), 1/4 shards, 1000 records, ")
    assert lines[-1].endswith("elapsed")


def test_a_run_shorter_than_the_interval_logs_nothing(caplog):
    """Its summary line says it all: no progress line at WARNING or at INFO."""
    caplog.set_level(logging.DEBUG)
    meter = Meter("verify", mode="log", stream=io.StringIO(), interval=3600)
    meter.start(bytes=10, shards=1)
    meter.add(bytes=10, shards=1)
    meter.close()
    assert [r for r in caplog.records if r.name == "recordkit.progress"] == []


def test_none_counts_without_drawing():
    out = Terminal()
    meter = Meter("verify", mode="none", stream=out)
    meter.start(bytes=10)
    meter.add(bytes=7, records=3)
    meter.close()
    assert out.getvalue() == ""
    assert meter.counts() == {"bytes": 7, "records": 3, "shards": 0, "items": 0}


def test_text_counts_items_and_grammar():
    meter = Meter("write", unit="items", mode="none", item="input")
    meter.start(items=1, done={"records": 0})
    assert meter.text().startswith("0/1 input (0%), 0 records")
    meter.add(items=1, records=1)
    assert meter.text(final=True).startswith("1/1 input (100%), 1 record, ")
    assert " inputs/s, " in meter.text(final=True)


def test_counts_from_many_threads_are_exact():
    meter = Meter("cache fill", mode="none")
    meter.start(bytes=None)

    def work():
        for _ in range(5000):
            meter.add(bytes=3, shards=1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert meter.counts()["bytes"] == 8 * 5000 * 3 and meter.counts()["shards"] == 40000


class StalledTerminal(Terminal):
    """A terminal whose writes hang until released (a paused ssh session, Ctrl-S)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, s: str) -> int:
        self.entered.set()
        assert self.release.wait(30)
        return super().write(s)


@pytest.mark.parametrize("mode", ["plain", "bar"])
def test_a_stalled_terminal_never_blocks_the_work(mode):
    if mode == "bar":
        pytest.importorskip("tqdm")
    out = StalledTerminal()
    meter = Meter("verify", mode=mode, stream=out)
    meter.start(bytes=100_000, shards=1000)
    assert out.entered.wait(30)  # the meter's thread is stuck in a write
    for _ in range(1000):  # and every count still returns at once
        meter.add(bytes=100, shards=1)
    assert meter.counts()["shards"] == 1000
    out.release.set()
    meter.close()


class BrokenPipe(Terminal):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_broken_stream_turns_the_display_off_not_the_work():
    meter = Meter("verify", mode="plain", stream=BrokenPipe())
    meter.start(bytes=10)
    meter.add(bytes=10)
    meter.close()
    assert meter.counts()["bytes"] == 10


def test_no_tracker_and_bad_arguments():
    tracker = NoTracker()
    tracker.start(bytes=1)
    tracker.add(bytes=1)
    tracker.close()
    with pytest.raises(ValueError, match="unit must be one of"):
        Meter("x", unit="files")
    with pytest.raises(ValueError, match="interval must be >= 0"):
        Meter("x", interval=-1)
