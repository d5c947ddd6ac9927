"""The shape of a package's code, for reviews of its structure: the import graph between its modules (and the
cycles in it, with and without type-only imports), the files over a line limit, and how many comment and
docstring lines it carries per line of code. Run: ``python tools/code_shape.py engine``.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, here: str, is_pkg: bool) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = here.split(".")
        parts = parts if is_pkg else parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def imports(path: Path, here: str, known: set[str]) -> dict[str, str]:
    """Modules of `known` that `path` imports, each with how: 'runtime', 'lazy' (inside a function) or 'type'."""
    tree = ast.parse(path.read_text())
    found: dict[str, str] = {}
    rank = {"runtime": 0, "lazy": 1, "type": 2}

    def visit(node: ast.AST, how: str) -> None:
        for child in ast.iter_child_nodes(node):
            kind = how
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, "type")
                for stmt in child.orelse:
                    visit_stmt(stmt, how)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "lazy" if how == "runtime" else how
            visit_stmt(child, kind)

    def visit_stmt(node: ast.AST, how: str) -> None:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = _resolve(node, here, path.name == "__init__.py")
        for target in targets:
            if isinstance(node, ast.Import):  # `import a.b.c` runs a, a.b and a.b.c: keep the deepest known
                while target and target not in known:
                    target = target.rpartition(".")[0]
            ancestor = here.startswith(target + ".")  # a parent package: loaded before `here` anyway
            if target in known and target != here and not ancestor and rank[how] < rank.get(found.get(target, ""), 3):
                found[target] = how
        visit(node, how)

    visit(tree, "runtime")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
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

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def density(path: Path) -> tuple[int, int]:
    """(code lines, comment and docstring lines) of one file."""
    source = path.read_text()
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if first is not None and isinstance(value, ast.Constant) and isinstance(value.value, str):
                doc_lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    comment_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comment_lines.add(tok.start[0])
    code = comments = 0
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if number in doc_lines or stripped.startswith("#"):
            comments += 1
            continue
        code += 1
        comments += number in comment_lines
    return code, comments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path, help="a package directory, e.g. engine")
    parser.add_argument("--max-lines", type=int, default=400)
    parser.add_argument("--edges", action="store_true", help="print every import edge")
    args = parser.parse_args()
    root = args.package.resolve()
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    edges = {m: imports(p, m, known) for m, p in files.items()}
    if args.edges:
        for m in sorted(edges):
            for target, how in sorted(edges[m].items()):
                print(f"{m} -> {target} ({how})")
    for label, kinds in (("all imports", {"runtime", "lazy", "type"}), ("runtime imports", {"runtime", "lazy"}),
                         ("module-level runtime imports", {"runtime"})):
        graph = {m: {t for t, how in e.items() if how in kinds} for m, e in edges.items()}
        comps = cycles(graph)
        sizes = ", ".join(str(len(c)) for c in comps) or "none"
        print(f"import cycles over {label}: {sizes}")
        for comp in comps:
            print("   ", " ".join(comp))
    long_files = [(sum(1 for _ in p.open()), m) for m, p in files.items()]
    print(f"files over {args.max_lines} lines:",
          ", ".join(f"{m} ({n})" for n, m in sorted(long_files, reverse=True) if n > args.max_lines) or "none")
    totals = [density(p) for p in files.values()]
    code, comments = sum(c for c, _ in totals), sum(c for _, c in totals)
    print(f"comment and docstring lines per code line: {comments / code:.3f} ({comments} / {code})")


if __name__ == "__main__":
    main()
