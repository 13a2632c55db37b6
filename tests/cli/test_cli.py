import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.cli import build_parser, main


@pytest.fixture
def ds(tmp_path):
    schema = rk.Schema(text=rk.Bytes(), label=rk.Int64(), emb=rk.Float32((3,)))
    with rk.Writer(tmp_path / "ds", schema, max_records=4, metadata={"classes": ["a", "b"]}) as w:
        for i in range(10):
            w.write({"text": f"hello {i}", "label": i, "emb": [0.5, 1.5, i]})
    return tmp_path / "ds"


def test_info(ds, capsys):
    assert main(["info", str(ds)]) == 0
    out = capsys.readouterr().out
    assert "records  10" in out and "shards   3" in out and "label" in out
    assert "recordkit 0." in out and "numpy" in out
    assert main(["info", str(ds), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["records"] == 10 and doc["complete"] and doc["metadata"]["classes"] == ["a", "b"]


def test_head(ds, capsys):
    assert main(["head", str(ds), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "[1]" in out and "[2]" not in out
    assert "b'hello 1'" in out and "label: 1" in out and "float32[3]" in out


def test_index_writes_dali_files(ds, capsys):
    for p in ds.glob("*.idx"):
        p.unlink()
    assert main(["index", str(ds / "part-00000.tfrecord"), str(ds / "part-00001.tfrecord")]) == 0
    assert (ds / "part-00001.tfrecord.idx").read_text().startswith("0 ")
    assert main(["index", str(ds)]) == 0
    assert len(list(ds.glob("*.idx"))) == 3


def test_errors_are_messages_not_tracebacks(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing")]) == 2
    assert "error: no such dataset" in capsys.readouterr().err


def test_every_subcommand_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) >= {"index", "info", "verify", "head"}
    for name, p in sub.choices.items():
        assert p.description, name


def test_console_entry_points(ds):
    # The console script installed beside this interpreter (the venv need not be on PATH).
    script = str(Path(sys.executable).with_name("recordkit"))
    for cmd in ([sys.executable, "-m", "recordkit"], [script]):
        out = subprocess.run([*cmd, "verify", str(ds)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "OK" in out.stderr


def test_verify_max_decode_bytes(tmp_path, capsys):
    schema = rk.Schema(x=rk.Tensor("uint8", (None,), compression="zstd"))
    with rk.Writer(tmp_path / "z", schema) as w:
        w.write({"x": np.zeros(1000, np.uint8)})
    assert main(["verify", str(tmp_path / "z")]) == 0
    assert main(["verify", str(tmp_path / "z"), "--max-decode-bytes", "999"]) == 1
    out = capsys.readouterr().out
    assert ".tfrecord:0:0: feature 'x'" in out and "record_bytes=999" in out
    assert main(["verify", str(tmp_path / "z"), "--max-decode-bytes", "1KiB"]) == 0


def _mistake(argv, capsys):
    """Run a mistaken command line: exit status and stderr."""
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        status = exc.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["convert", "{src}", "{tmp}/o", "--from", "imagefoldr"], "did you mean 'imagefolder'?"),
        (["convert", "{src}", "{tmp}/o", "--from", "jsonl", "-o", "nokey"], "expected KEY=VALUE"),
        (["convert", "{src}", "{tmp}/o", "--from", "jsonl", "-o", "no_such=1"], "unknown option"),
        (["convert", "{src}", "{tmp}/o", "-o", "chunk_bytes=64MiB"], "must be a number"),
        (["convert", "{src}", "{tmp}/o", "--schema", "@{tmp}/none.json"], "cannot read"),
        (["convert", "{src}", "{tmp}/o", "--schema", "x:int64[2"], "cannot parse"),
        (["convert", "{src}", "{tmp}/o", "--storage-options", "{{bad"], "not valid JSON"),
        (["convert", "{src}", "{tmp}/o", "--shard-size", "12XB"], "cannot parse size '12XB'"),
        (["convert", "{src}", "{tmp}/o", "--workers", "-1"], "argument --workers: must be >= 0"),
        (["convert", "{tmp}/missing", "{tmp}/o"], "does not exist"),
        (["convert", "{src}"], "the following arguments are required: dst"),
        (["convert", "{src}", "{tmp}/o", "--engine", "spark"], "invalid choice: 'spark'"),
        (["head", "{ds}", "-n", "-1"], "argument -n: must be >= 0"),
        (["verify", "{ds}", "--max-decode-bytes", "lots"], "cannot parse size 'lots'"),
        (["info", "{tmp}/missing"], "no such dataset"),
        (["cache", "status", "{tmp}/nocache"], "is not a cache"),
        (["cache", "fill", "{ds}", "{tmp}/c", "--max-bytes", "5XB"], "cannot parse size '5XB'"),
        (["nosuchcommand"], "invalid choice: 'nosuchcommand'"),
    ],
)
def test_every_mistake_is_one_line_and_status_2(argv, says, ds, tmp_path, capsys):
    (tmp_path / "src.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    fill = {"src": tmp_path / "src.jsonl", "tmp": tmp_path, "ds": ds}
    status, err = _mistake([a.format(**fill) for a in argv], capsys)
    assert status == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("recordkit convert: --from")]
    assert len(lines) == 1 and says in lines[0], err
    assert lines[0].startswith("recordkit") and "Traceback" not in err


def test_a_typo_in_the_converter_name_suggests_the_nearest(tmp_path):
    (tmp_path / "imgs").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "recordkit", "convert", "imgs", "out", "--from", "imagefoldr"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(
        "recordkit convert: error: no converter named 'imagefoldr' (did you mean 'imagefolder'?);"
    )


def test_verbose_adds_the_traceback(tmp_path, capsys):
    status = main(["-v", "info", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" in err
    assert err.endswith(f"no such dataset: {tmp_path / 'missing'}\n")


def test_from_is_inferred_and_said(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(5)))
    argv = ["convert", str(tmp_path / "rows.jsonl"), str(tmp_path / "out"), "--workers", "0"]
    assert main([*argv, "--progress", "none"]) == 0
    assert "recordkit convert: --from jsonl, told from rows.jsonl" in capsys.readouterr().err
    assert [int(s["x"]) for s in rk.Dataset(tmp_path / "out")] == list(range(5))


@pytest.mark.parametrize(
    ("argv", "hint"),
    [(["covert"], "'convert'"), (["cache", "fil", "x"], "'fill'"), (["zzz"], None)],
)
def test_a_misspelt_subcommand_gets_a_suggestion(argv, hint, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    if hint is None:
        assert "did you mean" not in err
    else:
        assert f"did you mean {hint}?" in err


def test_convert_says_its_plan_as_its_own_lines(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "recordkit convert: plan " in err and "INFO" not in err
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err.count("recordkit convert: plan ") == 1  # no handler left over
