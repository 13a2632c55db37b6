"""Optional dependencies: import them on demand and name the command that installs them."""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import shlex
from importlib import metadata
from types import ModuleType

from .errors import MissingDependencyError

__all__ = ["install_command", "require"]


def require(module: str, *, extra: str, what: str = "this feature") -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` with the install command.

    Args:
        module: the importable module name, e.g. ``"torch"`` (of a submodule such as
            ``"pyarrow.parquet"`` the message names the package).
        extra: the recordkit extra that installs it, e.g. ``"torch"``.
        what: what needs it, in the message (``"the parquet converter"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{module.split('.')[0]!r} is required for {what} but is not installed: "
            f"{install_command(extra)}"
        ) from exc


def install_command(extra: str) -> str:
    """The command that installs ``extra`` for the way this recordkit was installed.

    recordkit is not on the package index, so ``pip install 'recordkit[torch]'`` fails
    verbatim. From a checkout (an editable install, or the source on ``sys.path``) the
    extra is installed from that checkout; from a wheel, the extra's packages by name.
    """
    checkout = _checkout()
    if checkout is not None:
        where = "." if os.path.abspath(os.getcwd()) == checkout else checkout
        return f"pip install -e {shlex.quote(f'{where}[{extra}]')}"
    packages = _extra_requirements(extra)
    if packages:
        return "pip install " + " ".join(shlex.quote(p) for p in packages)
    return f"pip install the packages of recordkit's {extra!r} extra"


@functools.lru_cache(maxsize=1)
def _checkout() -> str | None:
    """The source tree recordkit runs from, if it runs from one (else ``None``)."""
    try:
        direct = metadata.distribution("recordkit").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct = None
    if direct:  # PEP 610: written by pip for editable and local-directory installs
        info = json.loads(direct)
        url = str(info.get("url", ""))
        if info.get("dir_info", {}).get("editable") and url.startswith("file://"):
            return os.path.abspath(url[len("file://") :])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if direct is None and os.path.exists(os.path.join(here, "pyproject.toml")):
        return here  # not installed: run from the source tree on sys.path
    return None


def _extra_requirements(extra: str) -> list[str]:
    """The requirement strings of recordkit's ``extra`` from its installed metadata."""
    try:
        requires = metadata.requires("recordkit") or []
    except metadata.PackageNotFoundError:
        return []
    marker = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
    out = []
    for req in requires:
        spec, _, env = req.partition(";")
        found = marker.search(env)
        if found and found.group(1) == extra:
            out.append(spec.strip().replace(" ", ""))
    return out
