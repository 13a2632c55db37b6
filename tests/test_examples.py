"""Every example runs, as a user would run it: an example that is not run is broken."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(
    os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="error::DeprecationWarning:recordkit"
)


def _run(script, *args, timeout=300):
    out = subprocess.run(
        [sys.executable, str(ROOT / script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.tf
@pytest.mark.torch
@pytest.mark.slow
def test_quickstart(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    # As a user runs it: no TF_CPP_MIN_LOG_LEVEL of ours, and TensorFlow prints nothing.
    env = {k: v for k, v in ENV.items() if not k.startswith("TF_")}
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples/quickstart.py"),
            "--out",
            str(tmp_path / "q"),
            "-n",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stderr == "", run.stderr
    out = run.stdout
    assert "verify  " in out and ": OK" in out
    assert "torch   read 300 samples" in out
    assert "tf.data read 300 samples" in out
    assert "recordkit.tf.dataset read 300 samples" in out


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_pytorch_train(tmp_path, workers):
    pytest.importorskip("torch")
    out = _run(
        "examples/pytorch/train.py",
        "--data",
        tmp_path / "d",
        "--samples",
        2048,
        "--epochs",
        3,
        "--workers",
        workers,
    )
    assert "epoch 2:" in out and "resume state after training: epoch 3, consumed 0" in out


@pytest.mark.tf
@pytest.mark.slow
def test_keras_train(tmp_path):
    pytest.importorskip("tensorflow")
    out = _run("examples/tensorflow/train_keras.py", "--data", tmp_path / "d", "--epochs", 3)
    assert "64 batches per epoch" in out
    accuracy = float(out.strip().splitlines()[-1].rsplit(" ", 1)[1])
    assert accuracy > 0.9, out  # the classes are separable: a model that learns gets there


@pytest.mark.slow
def test_convert_numpy(tmp_path):
    out = _run("examples/convert/convert_numpy.py", "--out", tmp_path)
    assert "into 2000 records" in out and ": OK" in out
    assert "rerun   4 of 4 partitions already done" in out


@pytest.mark.torch
@pytest.mark.slow
def test_pytorch_convert_and_train(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    out = _run("examples/pytorch/convert_and_train.py", "--workdir", tmp_path, "--epochs", 3)
    assert "converted 600 items" in out and "classes ['blue', 'green', 'red']" in out
    accuracy = float(out.strip().splitlines()[-1].rsplit(" ", 1)[1])
    assert accuracy > 0.9, out  # colours are separable: a model that learns gets there


@pytest.mark.tf
@pytest.mark.slow
def test_tensorflow_convert_and_train(tmp_path):
    pytest.importorskip("tensorflow")
    out = _run("examples/tensorflow/convert_and_train.py", "--workdir", tmp_path)
    assert "into 4000 records" in out, out
    assert "63 batches per epoch" in out
    accuracy = float(out.strip().splitlines()[-1].rsplit(" ", 1)[1])
    assert accuracy > 0.9, out  # a linear rule: logistic regression learns it


@pytest.mark.torch
@pytest.mark.slow
def test_pytorch_ddp(tmp_path):
    pytest.importorskip("torch")
    out = _run("examples/pytorch/ddp.py", "--data", tmp_path / "d", "--epochs", 2, timeout=180)
    for rank in (0, 1):
        assert f"rank {rank}: epoch 1: 30 batches" in out, out
        assert f"rank {rank}: read 1500 records" in out, out
    assert "all ranks: 3000 records, each exactly once" in out


@pytest.mark.slow
def test_grain_train(tmp_path):
    pytest.importorskip("grain")
    out = _run("examples/grain/train.py", "--data", tmp_path / "d", "--workers", 2)
    assert "stopped after step 45 (epoch 1)" in out and "resumed: 51 more steps" in out
    assert "6144 ids: the uninterrupted run's, each record once per epoch" in out
    accuracy = float(out.strip().splitlines()[-1].rsplit(" ", 1)[1])
    assert accuracy > 0.9, out  # a linear rule: logistic regression learns it


def test_every_example_is_tested():
    tested = {
        "examples/quickstart.py",
        "examples/pytorch/train.py",
        "examples/tensorflow/train_keras.py",
        "examples/convert/convert_numpy.py",
        "examples/pytorch/convert_and_train.py",
        "examples/tensorflow/convert_and_train.py",
        "examples/pytorch/ddp.py",
        "examples/grain/train.py",
        # driven by tests/frameworks, their label streams against uninterrupted runs
        "examples/pytorch/lightning_train.py",
        "examples/pytorch/accelerate_train.py",
        "examples/pytorch/hf_trainer.py",
    }
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("*.py")}
    assert found <= tested, f"examples without a test: {sorted(found - tested)}"


# Import names whose distribution is named otherwise.
_DISTRIBUTION = {"PIL": "pillow", "tensorflow": "tensorflow"}


def _requirement_names(requirements, extras):
    """Distribution names, ``recordkit[...]`` self-references expanded."""
    names = set()
    for req in requirements:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
        if name == "recordkit":
            inner = re.search(r"\[(.*?)\]", req).group(1).split(",")
            for extra in inner:
                names |= _requirement_names(extras[extra.strip()], extras)
        else:
            names.add(name)
    return names


def test_the_examples_extra_installs_what_every_example_imports():
    """``pip install '.[examples]'`` (what README and getting-started tell users) is
    enough to run every script in examples/."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    extras = project["optional-dependencies"]
    have = _requirement_names(project["dependencies"], extras)
    have |= _requirement_names(extras["examples"], extras)
    missing = {}
    for script in sorted((ROOT / "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(script.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "recordkit" or top == "__future__":
                    continue
                if _DISTRIBUTION.get(top, top).lower() not in have:
                    missing.setdefault(str(script.relative_to(ROOT)), []).append(top)
    assert not missing, f"imports the examples extra does not install: {missing}"
    for doc in ("README.md", "docs/getting-started.md"):
        assert "`examples`" in (ROOT / doc).read_text("utf-8"), doc
