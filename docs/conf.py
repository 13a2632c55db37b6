"""Sphinx configuration of the recordkit documentation site.

Build it with ``bash scripts/docs.sh`` (warnings are errors). Pages are MyST
Markdown, so the Markdown files under ``docs/`` are the site; the Python API
comes from docstrings (autodoc + napoleon, Google style) and the CLI reference
from ``recordkit.cli.build_parser()`` (``_ext/cli_reference.py``).
"""

from __future__ import annotations

import builtins
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # recordkit and converters from this checkout
sys.path.insert(0, str(HERE / "_ext"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # autodoc imports recordkit.tf
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # and its oneDNN notice (absl's log)

from recordkit import __version__  # noqa: E402

project = "recordkit"
author = "The recordkit developers"
copyright = "The recordkit developers"
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "cli_reference",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

# MyST: ``[text](page.md#a-heading)`` links, ``{literalinclude}`` of examples,
# ``:::{note}`` blocks.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# Google-style docstrings; args are documented in the class docstring.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "show-inheritance": True}
autoclass_content = "class"

# No intersphinx: the docs build offline (CI has no internet). References to
# other projects' types (numpy, torch, tensorflow, fsspec, the standard
# library's collections.abc) therefore stay plain text instead of warnings.
nitpick_ignore_regex = [
    ("py:.*", r"(np|numpy|torch|tf|tensorflow|keras|fsspec|distributed|dask|tqdm|pyarrow)\..*"),
    ("py:.*", r"(collections\.abc|typing|types|os|io|pathlib|concurrent\.futures|mmap|abc)\..*"),
    ("py:.*", r"(Path|PathLike|Sequence|Mapping|Iterable|Iterator|Callable|ArrayLike|Any)"),
    # Private helpers and type aliases that annotations and base lists name.
    ("py:.*", r"(.*\.)?_\w+(\.\w+)*"),
    (
        "py:.*",
        r"(.*\.)?(FeatureType|OnError|Policy|HeldFile|Alloc|Feature name -> value"
        r"|ShardSet|BatchDecoder|DecodedBatch|BufferPool|ProcessReader|LocalDirectory|FsspecDirectory"
        r"|ProcessLocalShards|Remote|CacheDir|StreamHost|FeatureBase|Position|EpochSource"
        r"|recordkit\.reader\.buffers)",
    ),
]


def _resolve_by_public_name(app, env, node, contnode):  # type: ignore[no-untyped-def]
    """Resolve ``recordkit.format.manifest.ShardInfo`` to where it is documented.

    Annotations name an object by its defining module (``recordkit.codec.schema.Tensor``);
    the reference documents it where users import it (``recordkit.Tensor``). A target
    resolves to the one documented object with the same final name in recordkit (or
    converters); anything ambiguous stays a warning.
    """
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    if "." not in target and hasattr(builtins, target):  # ``bytes``, ``int``, ...
        return None
    if "." in target and target.split(".")[0] not in ("recordkit", "converters"):
        return None
    last = target.rsplit(".", 1)[-1]
    domain = env.get_domain("py")
    matches = {
        name
        for name, obj in domain.objects.items()
        if (name == last or name.endswith("." + last))
        and name.split(".")[0] in ("recordkit", "converters")
        and not obj.aliased  # ``recordkit.codec.features.Tensor`` is ``recordkit.Tensor``
        and (obj.objtype == "module") == (node["reftype"] == "mod")
    }
    if "." not in target and node.get("py:class"):  # a method of the class at hand
        own = {m for m in matches if m.startswith(f"{node.get('py:module')}.{node['py:class']}.")}
        matches = own or matches
    if len(matches) != 1:
        return None
    from sphinx.util.nodes import make_refnode

    (name,) = matches
    obj = domain.objects[name]
    return make_refnode(app.builder, node["refdoc"], obj.docname, obj.node_id, contnode, name)


def _builtins_exactly(app, doctree):  # type: ignore[no-untyped-def]
    """Make ``bytes`` in a type mean the builtin, not any attribute named ``bytes``.

    Sphinx looks up a type field's target by suffix within the documented objects, so
    ``:rtype: bytes`` would match ``ShardInfo.bytes`` and ``VerifyReport.bytes``.
    """
    from sphinx.addnodes import pending_xref

    for node in doctree.findall(pending_xref):
        if node.get("refdomain") == "py" and hasattr(builtins, node.get("reftarget", "")):
            node.attributes.pop("refspecific", None)


def setup(app):  # type: ignore[no-untyped-def]
    """Hook the resolver in after Sphinx's own."""
    app.connect("doctree-read", _builtins_exactly)
    app.connect("missing-reference", _resolve_by_public_name, priority=950)  # after builtins


html_theme = "furo"
html_title = f"recordkit {__version__}"
html_static_path = ["_static"]
pygments_style = "sphinx"
