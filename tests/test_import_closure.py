"""dvcgen's import walk: the code deps of each dvc.yaml stage (voxpipe/dvcgen.py).

The layers themselves (imports point down, no cycle between siblings) are import-linter contracts in
pyproject.toml, checked by `lint-imports` in `make lint` and `make test-fast`. This walk is dvcgen's own:
besides the imports (a lazy one in a function body too; `if TYPE_CHECKING:` blocks never run), it follows
the voxpipe modules a module names in a string and the package data it names, which is what DVC must hash.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from voxpipe.dvcgen import import_closure, imports


def test_the_walk_sees_lazy_imports_and_skips_type_checking(tmp_path: Path):
    pkg = tmp_path / "voxpipe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("a", "b", "c", "d"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "m.py").write_text(
        "from typing import TYPE_CHECKING\nfrom voxpipe import a\n"
        "if TYPE_CHECKING:\n    from voxpipe.b import X\nelse:\n    import voxpipe.d\n"
        "def f():\n    from . import c\n")
    assert imports("voxpipe.m", tmp_path) == {"voxpipe.a", "voxpipe.c", "voxpipe.d"}


@pytest.mark.parametrize("step", [
    "voxpipe.train.loop",
    "voxpipe.evaluate.step",
])
def test_train_and_evaluate_hold_no_tracking_code(step):
    """Train's closure holds no track module (live MLflow logging reaches it through `LiveLog`, chosen by
    the cli) and no module of the encode step; evaluate's holds no track module."""
    files = import_closure({step})
    assert not [f for f in files if f.startswith("voxpipe/track/")], sorted(files)
    assert not [f for f in files if f.startswith("voxpipe/data/encode/")], sorted(files)


def test_voxpipe_import_graph_has_no_cycle_even_through_type_hints():
    """No module of voxpipe reaches itself through imports, counting `if TYPE_CHECKING:` ones and lazy
    ones in function bodies (import-linter's acyclic contract leaves type-hint imports out and looks at
    sibling packages only). A cycle is listed as the modules of one strongly connected component."""
    import grimp

    graph = grimp.build_graph("voxpipe", exclude_type_checking_imports=False)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert strongly_connected(edges) == []


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one node (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_cycle_finder_sees_a_cycle():
    """The check above can fail: two modules that import each other are one component."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(edges) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
