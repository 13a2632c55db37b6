"""recordkit._procs: the one way recordkit runs child processes."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from recordkit._procs import (
    Child,
    Deadline,
    RemoteTraceback,
    pack_exception,
    stop_all,
    unpack_exception,
)
from recordkit.errors import ConvertError

ROOT = str(Path(__file__).resolve().parents[1])
pytestmark = pytest.mark.timeout(120)


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":  # exited, not yet reaped
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_child_answers_and_exits_when_asked(caplog):
    child = Child("tests._children:echo", what="test process")
    assert child.send({"x": [1, 2]}) and child.conn.recv() == {"x": [1, 2]}
    with caplog.at_level(logging.DEBUG, logger="recordkit._procs"):
        child.close(None)
    assert child.proc.returncode == 0 and not child.alive()
    assert "terminate" not in caplog.text and not child.send("late")  # closed


def test_a_child_whose_parent_closed_its_end_exits_without_a_traceback(capfd):
    # Ctrl-C: the parent closes the connection while a writer still reports progress.
    child = Child("tests._children:chatty", what="test process")
    assert child.conn.recv() == "ready"
    child.conn.close()
    assert child.wait(60) == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_join_terminate_kill_each_logged(caplog):
    child = Child("tests._children:stubborn", what="test process")
    assert child.conn.recv() == "ready"
    t0 = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="recordkit._procs"):
        stop_all([child], "asked to exit", join=0.2)
    lines = [r.getMessage() for r in caplog.records]
    pid = child.pid
    assert f"test process {pid}: asked to exit: join" in lines
    assert f"test process {pid}: still running 0 s after being asked to exit: terminate" in lines
    assert f"test process {pid} ignored SIGTERM for 5 s: kill" in lines
    assert child.proc.returncode == -signal.SIGKILL and time.monotonic() - t0 < 60


def test_several_children_stop_together(caplog):
    children = [Child("tests._children:echo", what="test process") for _ in range(3)]
    with caplog.at_level(logging.WARNING, logger="recordkit._procs"):
        stop_all(children, "no progress for 9 s")
    pids = ", ".join(str(c.pid) for c in children)
    assert f"3 test processes ({pids}): no progress for 9 s: terminate" in caplog.text
    assert all(c.proc.returncode == -signal.SIGTERM for c in children)


def test_children_exit_when_the_parent_is_killed(tmp_path):
    code = textwrap.dedent(
        """
        import sys, time
        from recordkit._procs import Child
        child = Child("tests._children:echo")
        print(child.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        pid = int(parent.stdout.readline())
        assert not _gone(pid, 0.5)
        parent.kill()  # SIGKILL: no chance to stop its child
        parent.wait(30)
        assert _gone(pid, 10), "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()


_SCRIPT = """
import json, sys
from pathlib import Path
from recordkit._procs import Child

with open(Path(__file__).with_name("loads.txt"), "a") as f:
    f.write(__name__ + "\\n")

def triple(x):
    return 3 * x

{body}
"""
_GUARDED = """
if __name__ == "__main__":
    child = Child("tests._children:call")
    child.send((len, "abcd"))  # nothing from this script: it is not loaded
    print(json.dumps(child.conn.recv()))
    child.send((triple, 5))
    print(json.dumps(child.conn.recv()))
    child.send((triple, 6))
    print(json.dumps(child.conn.recv()))
    child.close()
"""
_UNGUARDED = """
child = Child("tests._children:call")
child.send((triple, 5))
kind, packed = child.conn.recv()
print(kind, packed[1])
child.close()
"""


def _run_script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "job.py"
    script.write_text(_SCRIPT.format(body=body))
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_function_from_the_users_script_loads_it_once_and_only_then(tmp_path):
    lines = _run_script(tmp_path, _GUARDED)
    assert [json.loads(x) for x in lines] == [["ok", 4], ["ok", 15], ["ok", 18]]
    # The script ran as __main__ here, and once as __mp_main__ in the child (guard skipped).
    assert (tmp_path / "loads.txt").read_text().split() == ["__main__", "__mp_main__"]


def test_an_unguarded_script_that_starts_children_again_is_told_the_fix(tmp_path):
    (line,) = _run_script(tmp_path, _UNGUARDED)
    assert line.startswith("error RuntimeError: ")
    assert "job.py started a child process while a recordkit child process imported it" in line
    assert 'if __name__ == "__main__":' in line


class _Picky(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")
        self.lock = threading.Lock()  # pickle cannot take it across


def test_exceptions_cross_with_notes_and_the_remote_traceback():
    def raised(exc: BaseException) -> BaseException:
        try:
            raise exc
        except BaseException as caught:
            return caught

    err = raised(ValueError("bad row"))
    err.add_note("while converting input 'x'")
    back = unpack_exception(pack_exception(err), ConvertError)
    assert type(back) is ValueError and back.__notes__ == ["while converting input 'x'"]
    assert isinstance(back.__cause__, RemoteTraceback) and "raise exc" in str(back.__cause__)
    picky = raised(_Picky(1, 2))
    picky.add_note("partition 3")
    back = unpack_exception(pack_exception(picky), ConvertError)
    assert type(back) is ConvertError and str(back) == "_Picky: 1/2"
    assert back.__notes__ == ["partition 3"]


def test_deadline():
    never = Deadline(None)
    assert not never.expired() and never.poll(0.25) == 0.25
    soon = Deadline(0.05)
    assert soon.poll(1.0) == 0.0125
    time.sleep(0.1)
    assert soon.expired()
    soon.touch()
    assert not soon.expired()
    with pytest.raises(ValueError, match="must be > 0 or None"):
        Deadline(0)
