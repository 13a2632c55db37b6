"""The documentation site builds with warnings as errors, and its reference is complete.

The fast tests check the sources (every public symbol has a docstring, every public
module and every CLI subcommand is in the reference); the ``slow`` one runs the same
``sphinx-build -W -n`` as ``scripts/docs.sh`` and checks the built pages.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import cli_reference  # noqa: E402  (docs/_ext: the directive that renders the CLI page)

# The public modules: each has a sorted __all__ and a section in docs/reference/api.md.
PUBLIC = {
    "recordkit": "docs/reference/api.md",
    "recordkit.torch": "docs/reference/api.md",
    "recordkit.tf": "docs/reference/api.md",
    "recordkit.conversion": "docs/reference/api.md",
    "recordkit.cache": "docs/reference/api.md",
    "recordkit.converters": "docs/reference/api.md",
    "recordkit.errors": "docs/reference/errors.md",
    "recordkit.codec.messages": "docs/reference/lowlevel.md",
    "recordkit.codec.wire": "docs/reference/lowlevel.md",
}
_NEEDS = {"recordkit.torch": "torch", "recordkit.tf": "tensorflow"}


def _module(name):
    if name in _NEEDS:
        pytest.importorskip(_NEEDS[name])
    return importlib.import_module(name)


def _undocumented(qualname, obj):
    """``qualname`` and those of its public methods and properties that lack a docstring."""
    if inspect.ismodule(obj) or not (callable(obj) or isinstance(obj, type)):
        return []
    missing = [] if (obj.__doc__ or "").strip() else [qualname]
    if isinstance(obj, type):
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            elif isinstance(value, property):
                value = value.fget
            if inspect.isfunction(value) and not (value.__doc__ or "").strip():
                missing.append(f"{qualname}.{attr}")
    return missing


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_symbols_have_docstrings(name):
    module = _module(name)
    assert (module.__doc__ or "").strip(), f"module {name} has no docstring"
    missing = []
    for symbol in module.__all__:
        missing += _undocumented(f"{name}.{symbol}", getattr(module, symbol))
    assert not missing, f"public symbols without a docstring: {missing}"


def test_undocumented_symbols_are_caught():
    """The check above is not vacuous: it sees a method without a docstring."""

    class Public:
        """Documented."""

        def method(self):
            pass

        @property
        def prop(self):
            return 1

    assert _undocumented("Public", Public) == ["Public.method", "Public.prop"]


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_module_is_in_the_reference(name):
    page = (ROOT / PUBLIC[name]).read_text("utf-8")
    assert re.search(rf"^\.\. automodule:: {re.escape(name)}$", page, re.M), (name, PUBLIC[name])


def test_cli_reference_lists_every_subcommand():
    from recordkit.cli import build_parser

    page = (DOCS / "reference" / "cli.md").read_text("utf-8")
    assert "```{cli-reference}" in page  # the page is generated from the parser
    listed = cli_reference.commands()
    top = set(cli_reference._subparsers(build_parser()))
    assert {"index", "info", "verify", "head", "convert", "cache"} <= top
    assert top <= set(listed)
    assert {"cache fill", "cache status", "cache gc"} <= set(listed)


def _sphinx_available():
    for mod in ("sphinx", "myst_parser", "furo"):
        pytest.importorskip(mod, reason="the docs dependency group is not installed")


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.tf
def test_site_builds_without_warnings(tmp_path):
    """What ``bash scripts/docs.sh`` runs: any warning (a broken link, a bad reference,
    an orphan page, an autodoc import failure) fails the build."""
    _sphinx_available()
    out = tmp_path / "html"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         str(DOCS), str(out)],
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    pages = {p.relative_to(out).as_posix() for p in out.rglob("*.html")}
    sources = {
        p.relative_to(DOCS).with_suffix(".html").as_posix()
        for p in DOCS.rglob("*.md")
        if "_build" not in p.parts
    }
    assert sources <= pages, f"pages not built: {sorted(sources - pages)}"

    cli = (out / "reference" / "cli.html").read_text("utf-8")
    for command in cli_reference.commands():
        heading = re.compile(rf"<h\d>recordkit {re.escape(command)}<")
        assert heading.search(cli), f"the CLI reference lacks `recordkit {command}`"
    api = (out / "reference" / "api.html").read_text("utf-8")
    for name in ("recordkit", "recordkit.torch", "recordkit.tf", "recordkit.cache"):
        for symbol in _module(name).__all__:
            if symbol.startswith("__") or symbol in ("errors", "convert"):
                continue
            assert f'id="{name}.{symbol}"' in api, f"{name}.{symbol} is not in the API page"
    perf = (out / "performance.html").read_text("utf-8")
    assert "throughput.png" in perf
    assert (out / "_images" / "throughput.png").is_file() or (
        out / "_static" / "throughput.png"
    ).is_file()
