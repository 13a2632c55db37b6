"""What the commands print: progress (bar, log lines, plain line), -v/-q anywhere, summaries.

In-process runs give ``main`` a stderr that says it is a terminal (or not); a real
pseudo-terminal in a child process checks the bar and the no-tqdm fallback as a
user sees them. No assertion depends on wall-clock time.
"""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

import recordkit as rk
from recordkit._units import format_size
from recordkit.cli import build_parser, main, verbosity

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
# A size as every summary prints it: binary units, one decimal (or whole bytes).
SIZE = r"(\d+ B|\d+\.\d (KiB|MiB|GiB|TiB))"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def ds(tmp_path):
    schema = rk.Schema(text=rk.Bytes(), label=rk.Int64())
    with rk.Writer(tmp_path / "ds", schema, max_records=10) as w:
        for i in range(60):
            w.write({"text": b"x" * 100, "label": i})
    return tmp_path / "ds"


def _shard_bytes(ds: Path) -> int:
    return sum(p.stat().st_size for p in ds.glob("*.tfrecord"))


def _progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "recordkit.progress"]


def _plain(text: str) -> str:
    """No raw counts, no "(s)", no exponent: the shared formatting."""
    assert "(s)" not in text and "e+" not in text and " bytes" not in text, text
    return text


# -v / -q anywhere -------------------------------------------------------------------


def _commands() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found, todo = [], [((), build_parser())]
    while todo:
        path, parser = todo.pop()
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found.append((path, parser))
        for action in subs:
            todo += [((*path, name), sub) for name, sub in action.choices.items()]
    return sorted(found, key=lambda c: c[0])


def _operands(parser: argparse.ArgumentParser) -> list[str]:
    """Values for a command's positionals and required options (parsing only)."""
    argv = []
    for action in parser._actions:
        if not action.option_strings:
            argv.append("x")
        elif action.required:
            argv += [action.option_strings[0], "x"]
    return argv


COMMANDS = _commands()


def test_every_command_is_covered():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"convert", "write", "verify", "index", "info", "head", "cache fill"} <= names


@pytest.mark.parametrize("path,parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_v_and_q_before_or_after_the_subcommand(path, parser):
    rest = _operands(parser)
    for flag, want in (("-q", (0, 1)), ("-v", (1, 0)), ("--quiet", (0, 1)), ("--verbose", (1, 0))):
        # before the command, after each word of it, and after its operands
        for cut in range(len(path) + 1):
            argv = [*path[:cut], flag, *path[cut:], *rest]
            assert verbosity(build_parser().parse_args(argv)) == want, argv
        argv = [*path, *rest, flag]
        assert verbosity(build_parser().parse_args(argv)) == want, argv
    both = build_parser().parse_args(["-v", *path, *rest, "-v"])
    assert verbosity(both) == (2, 0)  # counted across levels: -vv


def test_v_and_q_together_is_a_usage_error(ds, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["-v", "verify", str(ds), "-q"])
    assert stop.value.code == 2
    assert "-v and -q contradict each other" in capsys.readouterr().err


def test_help_of_every_command_lists_v_and_q():
    for path, parser in COMMANDS:
        text = parser.format_help()
        assert "-v, --verbose" in text and "-q, --quiet" in text, path


# verify and index ---------------------------------------------------------------------


def test_verify_draws_a_bar_on_a_terminal(ds, monkeypatch):
    pytest.importorskip("tqdm")
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["verify", str(ds)]) == 0
    text = err.getvalue()
    assert "\rverify: 100%|" in text, text
    total = format_size(_shard_bytes(ds))
    assert f"{total}/{total}" in text
    summary = text.rsplit("\n", 2)[-2]
    assert summary == f"verified 6 shards, 60 records, {total}: OK"


def test_verify_logs_progress_when_not_a_terminal(ds, caplog, capsys):
    assert main(["verify", str(ds), "--log-interval", "0"]) == 0
    lines = _progress_lines(caplog)
    assert lines and all(line.startswith("verify: ") for line in lines)
    total = format_size(_shard_bytes(ds))
    assert f"/{total} (" in lines[0] and "/6 shards" in lines[0] and "/60 records" in lines[0]
    assert "ETA" in lines[0]
    assert lines[-1].startswith(f"verify: {total}/{total} (100%), 6/6 shards, 60/60 records")
    err = capsys.readouterr().err
    assert _plain(err) == f"verified 6 shards, 60 records, {total}: OK\n"  # no WARNING lines


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_silences_progress(ds, caplog, capsys, monkeypatch, where):
    monkeypatch.setattr(sys, "stderr", Terminal())
    argv = ["verify", str(ds), "--log-interval", "0"]
    assert main(["-q", *argv] if where == "before" else [*argv, "-q"]) == 0
    assert _progress_lines(caplog) == []
    text = sys.stderr.getvalue()
    assert "\r" not in text and text.startswith("verified 6 shards, 60 records, ")


def test_verify_summary_of_problems(ds, capsys):
    shard = sorted(ds.glob("*.tfrecord"))[0]
    data = bytearray(shard.read_bytes())
    data[40] ^= 0xFF  # a payload byte of the first record
    shard.write_bytes(bytes(data))
    assert main(["verify", str(ds), "-q"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert re.fullmatch(rf"verified 6 shards, 60 records, {SIZE}: FAILED: 2 problems", err), err


def test_index_shows_progress_and_a_summary(ds, caplog, capsys):
    for idx in ds.glob("*.idx"):
        idx.unlink()
    assert main(["index", str(ds), "--log-interval", "0"]) == 0
    lines = _progress_lines(caplog)
    assert lines[-1].startswith("index: ") and "6/6 shards, 60 records" in lines[-1]
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 6
    total = format_size(_shard_bytes(ds))
    assert _plain(out.err) == f"wrote 6 index files for 60 records ({total} of shards)\n"
    shard = sorted(ds.glob("*.tfrecord"))[0]
    assert main(["index", str(shard), "-q"]) == 0
    assert capsys.readouterr().err.startswith("wrote 1 index file for 10 records (")


def test_verbose_lists_each_shard(ds):
    out = subprocess.run(
        [sys.executable, "-m", "recordkit", "verify", str(ds), "-v", "--progress", "none"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    checked = [line for line in out.stderr.splitlines() if "checked part-" in line]
    assert len(checked) == 6 and checked[0].startswith("INFO recordkit.verify: checked ")
    assert re.search(rf": 10 records, {SIZE}: OK$", checked[0]), checked[0]


# cache fill ----------------------------------------------------------------------------


def test_cache_fill_logs_progress_not_a_warning_per_shard(ds, tmp_path, caplog, capsys):
    local = tmp_path / "cache"
    argv = ["cache", "fill", str(ds), str(local), "--max-bytes", "1MiB", "--log-interval", "0"]
    assert main(argv) == 0
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    lines = _progress_lines(caplog)
    assert lines[-1].startswith("cache fill: ") and "6 shards, cache " in lines[-1]
    err = _plain(capsys.readouterr().err)
    assert re.fullmatch(
        rf"6 of 6 shards cached in {re.escape(str(local))}: {SIZE} of 1.0 MiB used\n", err
    )
    assert main(["cache", "gc", str(local), "-q"]) == 0
    assert re.fullmatch(rf"removed 0 files; 6 shards, {SIZE} left\n", capsys.readouterr().err)


# a real terminal ----------------------------------------------------------------------


def _on_a_terminal(code: str, cwd: Path) -> tuple[int, str]:
    """Run ``code`` in a child whose stderr is a pseudo-terminal of 100 x 30."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stderr=follower, stdout=subprocess.DEVNULL, cwd=cwd, env=env
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=60), out.decode()


_MAIN = "import sys; from recordkit.cli import main; sys.exit(main({argv!r}))"
_NO_TQDM = "import sys; sys.modules['tqdm'] = None; "


def test_cache_fill_runs_on_a_terminal_without_tqdm(ds, tmp_path):
    argv = ["cache", "fill", str(ds), str(tmp_path / "c"), "--max-bytes", "1MiB"]
    status, text = _on_a_terminal(_NO_TQDM + _MAIN.format(argv=argv), tmp_path)
    assert status == 0, text
    assert "\rcache fill: " in text and "6 shards" in text  # the plain line
    assert "6 of 6 shards cached" in text and "install" not in text


def test_verify_bar_on_a_real_terminal(ds, tmp_path):
    pytest.importorskip("tqdm")
    status, text = _on_a_terminal(_MAIN.format(argv=["verify", str(ds)]), tmp_path)
    assert status == 0, text
    total = format_size(_shard_bytes(ds))
    assert "\rverify: 100%|" in text and f"{total}/{total}" in text, text
    assert text.endswith(f"verified 6 shards, 60 records, {total}: OK\r\n")


def test_verify_plain_line_on_a_real_terminal_without_tqdm(ds, tmp_path):
    status, text = _on_a_terminal(_NO_TQDM + _MAIN.format(argv=["verify", str(ds)]), tmp_path)
    assert status == 0, text
    assert "\rverify: " in text and "(100%), 6/6 shards, 60/60 records" in text, text


# convert and write ---------------------------------------------------------------------


def test_convert_summary_grammar(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text('{"x": 1}\n')
    argv = ["convert", str(tmp_path / "rows.jsonl"), str(tmp_path / "out"), "--workers", "0"]
    assert main([*argv, "-q"]) == 0
    err = _plain(capsys.readouterr().err)
    assert "--from jsonl, told from" not in err  # -q: the summary only
    assert re.match(rf"converted 1 item \({SIZE}\) into 1 record in 1 shard \({SIZE}\) at ", err)
    assert ": 1 partition, " in err


def test_convert_logs_progress_lines(tmp_path, caplog, capsys):
    (tmp_path / "rows.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(5)))
    argv = ["convert", str(tmp_path / "rows.jsonl"), str(tmp_path / "out"), "--workers", "0"]
    assert main([*argv, "--log-interval", "0"]) == 0
    lines = _progress_lines(caplog)
    assert lines[-1].startswith("convert: ") and "1/1 item, 5 records" in lines[-1], lines
    assert "converted 1 item" in capsys.readouterr().err


# the library's side --------------------------------------------------------------------


def test_verify_and_build_index_count_into_a_tracker(ds):
    from recordkit._progress import Meter

    meter = Meter("verify", mode="none")
    report = rk.verify(ds, progress=meter)
    assert meter.counts() == {"bytes": report.bytes, "records": 60, "shards": 6, "items": 0}
    shards = sorted(ds.glob("*.tfrecord"))
    data = bytearray(shards[1].read_bytes())
    data[40] ^= 0xFF  # a bad payload CRC: the walk goes on past it
    shards[1].write_bytes(bytes(data))
    Path(f"{shards[2]}.idx").unlink()  # no index: the walk cannot resync, counts still add up
    shards[3].unlink()  # listed, missing
    meter = Meter("verify", mode="none")
    report = rk.verify(ds, progress=meter)
    assert not report.ok and meter.counts()["shards"] == 6
    listed = json.loads((ds / "recordkit.json").read_text())["shards"]
    assert meter.counts()["bytes"] == sum(s["bytes"] for s in listed)  # the total it started with
    meter = Meter("index", mode="none")
    written = rk.build_index([shards[0], shards[4]], progress=meter)
    assert len(written) == 2 and meter.counts()["records"] == 20 and meter.counts()["shards"] == 2
