"""`voxpipe dvc-yaml`: dvc.yaml's code `deps:` and `params:` from the code and the schema, not pasted.

DVC reruns a stage when a file in its `deps:` changes or a key in its `params:` does. So a stage's code
deps are its step's import closure (voxpipe/cli.py + the step's module + what they import, lazily inside a
function too, and package data a module names), found by reading the source with `ast`; the import layer
test (tests/test_layers.py) walks the same edges. Its params are the keys the step reads (the cli's
`Step.reads`) that change its result: the schema marks the others (voxpipe/params.py, `result`).

The file is rewritten in place: only the code-dep lines (`- voxpipe/...`) and the `params:` lists change,
so the comments and every other line stay as written. `--check` writes nothing and names each difference.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repo (an editable install): dvc.yaml, voxpipe/, components/


# -- the import graph --------------------------------------------------------------------------------
def module_file(module: str, root: Path = ROOT) -> Path | None:
    """The file of a dotted module under `root` (a package: its __init__.py); None if there is none."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _import_nodes(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement, in function bodies too (a lazy import runs when its function does), but not
    those under `if TYPE_CHECKING:` (never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif _type_checking_only(node):
            todo += node.orelse
        else:
            todo += ast.iter_child_nodes(node)


def imports(module: str, root: Path = ROOT, packages: tuple[str, ...] = ("voxpipe",)) -> set[str]:
    """The modules of `packages` (files under `root`) that `module` imports anywhere it can run.
    `from pkg import name` counts as importing `pkg.name` when that is a module."""
    path = module_file(module, root)
    assert path is not None, module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
            continue
        base = node.module or ""
        if node.level:  # relative: from the package, `level - 1` packages up
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        subs = {f"{base}.{a.name}" for a in node.names if module_file(f"{base}.{a.name}", root)}
        names |= subs | ({base} if len(subs) < len(node.names) else set())
    return {n for n in names if n.split(".")[0] in packages and module_file(n, root)}


def named_modules(module: str, root: Path = ROOT) -> set[str]:
    """voxpipe modules a module names in a string of its own ("voxpipe.serve.pyfunc"): it finds and runs or
    ships them without importing them (register logs the pyfunc file as the model's code). Not an import
    edge, but part of what the step runs."""
    tree = ast.parse(module_file(module, root).read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and n.value.startswith("voxpipe.") and module_file(n.value, root)}


def import_closure(modules: Iterable[str], root: Path = ROOT) -> set[str]:
    """Files (relative to `root`) that running these modules can execute or read: every voxpipe module
    they import or name, transitively, the packages' __init__.py on the way, and package data files a
    module names."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            name = ".".join(parts[:i])
            if name not in seen and module_file(name, root):
                seen.add(name)
                todo += imports(name, root) | named_modules(name, root)
    files = {module_file(m, root) for m in seen}
    data = {f for p in files for f in p.parent.iterdir()
            if f.is_file() and f.suffix != ".py" and f.name in p.read_text(encoding="utf-8")}
    return {f.relative_to(root).as_posix() for f in files | data}
