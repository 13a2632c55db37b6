"""``{cli-reference}``: the CLI reference, generated from ``recordkit.cli.build_parser()``.

Every subcommand (including those hooked in by ``recordkit/cli/convert.py`` and
``recordkit/cli/cache.py``, and their own subcommands) gets a section with its
description and its full ``--help`` text, so the page cannot drift from the code.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from docutils import nodes
from docutils.parsers.rst import Directive


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public way to list subcommands
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Yield ``(command path, parser)`` for the parser and every subcommand, depth first."""
    yield path, parser
    for name, sub in _subparsers(parser).items():
        yield from walk(sub, (*path, name))


def help_text(parser: argparse.ArgumentParser) -> str:
    """``--help`` output at a fixed width, so the page does not depend on the terminal."""
    fmt = parser.formatter_class
    parser.formatter_class = lambda prog: fmt(prog, width=88)  # type: ignore[misc,assignment]
    try:
        return parser.format_help()
    finally:
        parser.formatter_class = fmt


def commands() -> list[str]:
    """Every subcommand of the ``recordkit`` CLI, as ``"convert"``, ``"cache fill"``, ..."""
    from recordkit.cli import build_parser

    return [" ".join(path) for path, _ in walk(build_parser()) if path]


class CliReference(Directive):
    """Render the whole ``recordkit`` command tree."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from recordkit.cli import build_parser

        out: list[nodes.Node] = []
        for path, parser in walk(build_parser()):
            name = " ".join(("recordkit", *path))
            section = nodes.section(ids=[nodes.make_id("cli " + name)], names=[name])
            section += nodes.title(text=name)
            if parser.description:
                section += nodes.paragraph(text=parser.description)
            text = help_text(parser)
            section += nodes.literal_block(text, text, language="text")
            out.append(section)
        return out


def setup(app):  # type: ignore[no-untyped-def]
    """Register the directive."""
    app.add_directive("cli-reference", CliReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
