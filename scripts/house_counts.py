"""Counts that say how walkable the package is, from the source alone (nothing imported).

    python scripts/house_counts.py [ROOT]

- loose files at the top of recordkit/ (and how many are underscored);
- import circles between files: Python (every import, lazy and TYPE_CHECKING ones
  included) and C (a unit using a function, macro or type another unit defines; a
  declaration of another unit's function or variable is not a use of it, a call in an
  inline body is; comments are not read);
- parameters of ``RecordDataset.__init__`` and ``recordkit.tf.dataset``;
- lines of recordkit + converters (.py, .c, .h, .cc; links not followed);
- the files within 30 lines of the 600-line limit, or past it;
- imports of another module's private name.

docs/architecture.md quotes these before and after the redesign (issue 32).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # main() takes another from the command line
SOURCE = (".py", ".c", ".h", ".cc")


def files() -> list[Path]:
    out = []
    for base in ("recordkit", "converters"):
        for path in sorted((ROOT / base).rglob("*")):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents):
                continue
            if path.is_file() and path.suffix in SOURCE and "__pycache__" not in path.parts:
                out.append(path)
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "converters":
        parts = ["recordkit", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def python_graph(paths: list[Path]) -> tuple[dict[str, set[str]], list[str]]:
    modules = {module_name(p): p for p in paths if p.suffix == ".py"}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    private = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                if mod.startswith("converters"):
                    mod = "recordkit." + mod
                for a in node.names:
                    full = f"{mod}.{a.name}"
                    targets.append(full if full in modules else mod)
                    private_name = a.name.startswith("_") and not a.name.startswith("__")
                    # a package's own private module (from . import _contract) is its business
                    own_module = full in modules and name.startswith(mod + ".")
                    ours = mod != name and mod.startswith("recordkit")
                    if private_name and not own_module and ours:
                        private.append(f"{path.relative_to(ROOT)}:{node.lineno}: {full}")
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):
                    # a package's __init__ importing its own submodules is its face, not a tie
                    graph[name].add(t)
    return graph, private


# What a C file defines: a macro; a type (the name after a struct/union/enum body, a
# function pointer's name, or the last word of a plain typedef); a function (its
# parameters followed by its body: a prototype, ending in ";", defines nothing); a
# variable given a value outside any function (a function pointer's among them).
C_DEF = re.compile(
    r"^(?:#define\s+(\w+)"
    r"|typedef\s+(?:struct|union|enum)\b[^{;]*\{.*?\}\s*(\w+)\s*;"
    r"|typedef\b[^;{]*?\(\s*\*\s*(\w+)\s*\)[^;{]*;"
    r"|typedef\b[^;{(]*?\b(\w+)\s*;"
    r"|(?:static\s+inline\s+|inline\s+)?[A-Za-z_][\w\s\*]*?\b(\w+)\s*\([^;{]*\)\s*\{"
    r"|(?!static\b|extern\b|typedef\b|return\b)(?:RK_HIDDEN\s+)?(?:const\s+)?[A-Za-z_]\w*"
    r"[ \t\*]+(\w+)\s*(?:\[[^\]]*\])?\s*=)",
    re.M | re.S,
)
# A declaration names a function or variable another file defines without using it:
# a prototype (its parameters, then ";") or an extern, at the start of a line.
C_DECL = re.compile(
    r"^(?:RK_HIDDEN\s+)?(?:extern\s+[^;(){}]*?\b(\w+)\s*(?:\[\s*\])?\s*;"
    r"|[A-Za-z_][\w\s\*]*?\b(\w+)\s*\([^;{}]*\)\s*;)",
    re.M,
)


C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def without_declared_names(text: str) -> str:
    """``text`` with the name in each declaration blanked (its parameter types still count)."""

    def blank(m: re.Match[str]) -> str:
        group = 1 if m.group(1) else 2
        start, end = m.start(group) - m.start(), m.end(group) - m.start()
        return m.group(0)[:start] + " " + m.group(0)[end:]

    return C_DECL.sub(blank, text)


def c_graph(paths: list[Path]) -> dict[str, set[str]]:
    units = [p for p in paths if p.suffix in (".c", ".h")]
    defined: dict[str, str] = {}
    texts = {}
    for p in units:
        text = C_COMMENT.sub(" ", p.read_text())  # a name in a comment is no use of it
        texts[p.name] = text
        for m in C_DEF.finditer(text):
            sym = next(g for g in m.groups() if g)
            if p.suffix == ".c" and re.search(rf"^static\b[^\n]*\b{sym}\s*\(", text, re.M):
                continue
            defined.setdefault(sym, p.name)
    graph: dict[str, set[str]] = {p.name: set() for p in units}
    for name, text in texts.items():
        for sym in set(re.findall(r"\b[A-Za-z_]\w+\b", without_declared_names(text))):
            owner = defined.get(sym)
            if owner and owner != name:
                graph[name].add(owner)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def parameters(paths: list[Path], where: str, owner: str | None, func: str) -> int | None:
    for p in paths:
        if p.suffix != ".py" or not module_name(p).startswith(where):
            continue
        tree = ast.parse(p.read_text())
        scopes = [tree]
        if owner:
            scopes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
        for scope in scopes:
            for n in scope.body:
                if isinstance(n, ast.FunctionDef) and n.name == func:
                    a = n.args
                    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                    names = [x for x in names if x.arg != "self"]
                    return len(names) + bool(a.vararg) + bool(a.kwarg)
    return None


def main() -> None:
    global ROOT
    if len(sys.argv) > 1:
        ROOT = Path(sys.argv[1]).resolve()
    paths = files()
    top = [p for p in (ROOT / "recordkit").iterdir() if p.is_file() and p.suffix in SOURCE]
    under = [p for p in top if p.name.startswith("_") and p.name != "__init__.py"]
    graph, private = python_graph(paths)
    py_circles = circles(graph)
    c_circles = circles(c_graph(paths))
    lines = {p: len(p.read_text().splitlines()) for p in paths}
    near = sorted(
        (f"{p.relative_to(ROOT)} {n}" for p, n in lines.items() if n >= 570),
        key=lambda s: -int(s.rsplit(" ", 1)[1]),
    )
    ds = parameters(paths, "recordkit.torch", "RecordDataset", "__init__")
    tf = parameters(paths, "recordkit.tf", None, "dataset")
    print(f"loose files at the top of recordkit/: {len(top)} ({len(under)} underscored)")
    print(f"Python import circles: {len(py_circles)}")
    for c in py_circles:
        print("  " + " <-> ".join(c))
    print(f"C circles: {len(c_circles)}")
    for c in c_circles:
        print("  " + " <-> ".join(c))
    print(f"RecordDataset parameters: {ds}; recordkit.tf.dataset parameters: {tf}")
    print(f"lines (recordkit + converters, .py .c .h .cc): {sum(lines.values())}")
    print(f"files at 570 lines or more: {len(near)}")
    for s in near:
        print("  " + s)
    print(f"imports of another module's private name: {len(private)}")


if __name__ == "__main__":
    main()
