"""A missing extra's error gives a command that works for how recordkit was installed."""

from __future__ import annotations

import os

import pytest

from recordkit import _deps
from recordkit.errors import MissingDependencyError


def test_from_a_checkout_the_extra_comes_from_it(tmp_path, monkeypatch):
    root = _deps._checkout()
    assert root is not None and os.path.exists(os.path.join(root, "pyproject.toml"))
    monkeypatch.chdir(tmp_path)
    assert _deps.install_command("torch") == f"pip install -e '{root}[torch]'"
    monkeypatch.chdir(root)
    assert _deps.install_command("dask") == "pip install -e '.[dask]'"


def test_from_a_wheel_the_extras_packages_by_name(monkeypatch):
    # An installed wheel has no checkout: name what the extra installs, from the metadata.
    monkeypatch.setattr(_deps, "_checkout", lambda: None)
    assert _deps.install_command("dask") == "pip install 'dask[distributed]>=2024.2'"
    assert _deps.install_command("parquet") == "pip install 'pyarrow>=15'"
    assert (
        _deps.install_command("nonesuch")
        == "pip install the packages of recordkit's 'nonesuch' extra"
    )


def test_require_raises_with_the_command(monkeypatch):
    monkeypatch.setattr(_deps, "_checkout", lambda: None)
    with pytest.raises(
        MissingDependencyError, match=r"'no_such_mod' is required .*: pip install 'tqdm>=4\.66'"
    ):
        _deps.require("no_such_mod", extra="progress")
