"""The pins of .ci/constraints.txt cover every requirement the set-up installs.

scripts/bootstrap.sh resolves against them so that pip never backtracks; a requirement
added to pyproject.toml without `bash scripts/lock.sh` would be resolved freely again
(and, for the test group, slowly). This fails until the lock is regenerated.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - CI runs 3.11
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement string."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(1)).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line!r}"
            pins[_name(name)] = version
    return pins


def _requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(project["project"]["dependencies"])
    for extra, items in project["project"]["optional-dependencies"].items():
        if extra in ("tf", "all"):  # the GPU-capable tensorflow; `all` is made of the others
            continue
        reqs += items
    for group in project["dependency-groups"].values():
        reqs += [r for r in group if isinstance(r, str)]
    return {_name(r) for r in reqs if not r.startswith("recordkit")}


def test_every_requirement_is_pinned() -> None:
    missing = sorted(_requirements() - set(_pins()))
    assert not missing, f"not in .ci/constraints.txt (run bash scripts/lock.sh): {missing}"


def test_torch_is_the_cpu_pin() -> None:
    # The only torch on our machines' disk; any other version downloads a CUDA build.
    assert _pins()["torch"] == "2.13.0"
