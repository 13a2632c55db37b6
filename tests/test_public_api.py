import json
import subprocess
import sys

import pytest

import recordkit


def test_import_is_light():
    code = (
        "import sys, json, recordkit; "
        "heavy = ('torch', 'tensorflow', 'fsspec', 'dask', 'ray', 'zstandard'); "
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(json.loads(out.stdout)) <= {"zstandard"}


def test_all_is_sorted_and_complete():
    assert recordkit.__all__ == sorted(recordkit.__all__)
    for name in recordkit.__all__:
        assert getattr(recordkit, name) is not None


def test_public_symbols_have_docstrings():
    for name in recordkit.__all__:
        obj = getattr(recordkit, name)
        if callable(obj) or isinstance(obj, type):
            assert obj.__doc__ and obj.__doc__.strip(), name


def test_errors_subclass_builtins():
    from recordkit import errors

    assert issubclass(errors.CorruptRecordError, ValueError)
    assert issubclass(errors.ShardNotFoundError, FileNotFoundError)
    assert issubclass(errors.MissingDependencyError, ImportError)
    assert issubclass(errors.DatasetExistsError, FileExistsError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.RecordkitError)


def test_located_errors_pickle_for_worker_processes():
    import pickle

    from recordkit.errors import CorruptRecordError

    err = CorruptRecordError(
        "payload CRC mismatch", path="a", offset=3, record=1, expected_crc=1, actual_crc=2
    )
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.record == 1 and back.actual_crc == 2


def test_lazy_submodules_import_on_first_use():
    code = (
        "import sys, recordkit\n"
        "assert 'recordkit.cache' not in sys.modules\n"
        "print(recordkit.cache.ShardCache.__name__, recordkit.converters.get('csv').__name__)\n"
        "print(set(dir(recordkit)) >= {'cache', 'convert', 'converters', 'tf', 'torch'})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ShardCache", "CsvSource", "True"]


def test_a_users_own_converters_module_shadows_nothing(tmp_path):
    """The converters install as recordkit.converters: a converters.py beside the
    user's script (first on sys.path) is never imported in its place."""
    (tmp_path / "converters.py").write_text("raise ImportError('the user converters.py')\n")
    (tmp_path / "data.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(30)))
    code = (
        "import recordkit as rk\n"
        "r = rk.convert('data.jsonl', 'out', format='jsonl', workers=1)\n"
        "print(r.records, sorted(int(s['x']) for s in rk.Dataset('out')) == list(range(30)))\n"
    )
    run = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120}
    out = subprocess.run([sys.executable, "-c", code], **run)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["30", "True"]
    cli = [sys.executable, "-m", "recordkit", "convert", "data.jsonl", "out2", "--from", "jsonl"]
    out = subprocess.run(cli, **run)
    assert out.returncode == 0, out.stderr[-2000:]


def _error_classes():
    from recordkit import errors

    return {
        name: obj
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, BaseException) and not name.startswith("_")
    }


def test_every_exception_is_in_errors_and_on_the_errors_page():
    """One error tree: every exception class recordkit defines lives in recordkit.errors,
    is public there, and has a row in docs/reference/errors.md."""
    import ast
    from pathlib import Path

    from recordkit import errors

    root = Path(recordkit.__file__).parent
    elsewhere = []
    for path in [*root.rglob("*.py"), *(root.parent / "converters").glob("*.py")]:
        if path.name == "errors.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception"))
                for b in node.bases
            ):
                elsewhere.append(f"{path.relative_to(root.parent)}:{node.name}")
    # The native extension's fault signal (and its stand-ins), turned into a
    # ShardChangedError inside recordkit.format.guard: never raised to a caller.
    # A child process's traceback travels as the __cause__ of what it raised (as
    # concurrent.futures' _RemoteTraceback does); the MDS decoder's _Bad becomes a
    # SourceError naming the sample before it leaves converters/mds.py.
    internal = {
        "recordkit/format/guard.py:_NeverRaised",
        "recordkit/reader/_fallback.py:MapFault",
        "recordkit/_procs.py:RemoteTraceback",
        "converters/mds.py:_Bad",
    }
    elsewhere = [c for c in elsewhere if c not in internal]
    assert elsewhere == [], f"exception classes outside recordkit/errors.py: {elsewhere}"
    classes = _error_classes()
    assert sorted(classes) == errors.__all__
    page = (root.parent / "docs" / "reference" / "errors.md").read_text("utf-8")
    page = page[: page.index("\n## ")]  # the table of classes, before the other sections
    rows = {line.split("`")[1] for line in page.splitlines() if line.startswith("| `")}
    assert rows == set(classes), f"errors.md rows differ: {sorted(rows ^ set(classes))}"
    tree = errors.__doc__
    assert all(f" {name} " in tree or f" {name}\n" in tree for name in classes), tree


def test_old_error_import_paths_are_the_same_classes():
    from recordkit import cache, convert, converters, errors
    from recordkit.convert import _errors as convert_errors

    for module, names in [
        (cache, ["CacheFullError", "DownloadError", "ProduceError"]),
        (convert, ["ConvertError", "DiskFullError", "PartitionsFailedError"]),
        (convert_errors, ["ConvertError", "DiskFullError", "PartitionsFailedError"]),
        (converters, ["SourceError", "SourceNotFoundError"]),
    ]:
        for name in names:
            assert getattr(module, name) is getattr(errors, name), (module.__name__, name)
    assert issubclass(errors.CacheFullError, errors.DiskFullError)
    assert issubclass(errors.DiskFullError, OSError)
    assert not issubclass(errors.DiskFullError, errors.ConvertError)


def test_every_error_subclasses_a_builtin_beyond_exception():
    for name, cls in _error_classes().items():
        if name == "RecordkitError":
            continue
        builtins = [
            c for c in cls.__mro__ if c.__module__ == "builtins" and c not in (Exception, object)
        ]
        assert [c for c in builtins if c is not BaseException], name


@pytest.mark.slow  # imports TensorFlow where it is installed
def test_every_name_the_api_reference_lists_imports():
    """Each module the reference pages document, and every name in its ``__all__``,
    imports as the page says (from a fresh interpreter, through ``import recordkit``)."""
    import importlib.util
    import re
    from pathlib import Path

    pages = (Path(recordkit.__file__).parents[1] / "docs" / "reference").glob("*.md")
    modules = sorted(
        {m for p in pages for m in re.findall(r"^\.\. automodule:: (\S+)$", p.read_text(), re.M)}
    )
    assert {"recordkit", "recordkit.torch", "recordkit.cache", "recordkit.converters"} <= set(
        modules
    )
    needs = {"recordkit.torch": "torch", "recordkit.tf": "tensorflow"}
    present = [m for m in modules if importlib.util.find_spec(needs.get(m, "recordkit"))]
    code = (
        "import importlib, json, sys, recordkit\n"
        "out = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    parts = name.split('.')\n"
        "    module = recordkit\n"
        "    for part in parts[1:]:\n"  # attribute access: the lazy submodules load
        "        module = getattr(module, part, None) or importlib.import_module(\n"
        "            module.__name__ + '.' + part)\n"
        "    assert module.__name__ == name, (module.__name__, name)\n"
        "    out[name] = [s for s in module.__all__ if getattr(module, s, None) is None]\n"
        "    exec(f'from {name} import *', {})\n"
        "print(json.dumps(out))\n"
    )
    env = dict(__import__("os").environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(present)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    missing = {m: names for m, names in json.loads(proc.stdout.splitlines()[-1]).items() if names}
    assert not missing, f"names in __all__ that do not import: {missing}"
