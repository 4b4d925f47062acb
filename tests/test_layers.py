"""Imports point down the layers, and no two voxpipe modules import each other (even through others).

Not style: DVC reruns a stage when any module in its import closure changes (voxpipe/dvcgen.py), so an
arrow that points up turns a change to registration code into a retrained model. Every import counts, a
lazy one in a function body too (it runs when the function does); `if TYPE_CHECKING:` blocks do not.
Within one layer imports may go either way, but never round in a cycle.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from voxpipe.dvcgen import ROOT, import_closure, imports

PACKAGES = ("voxpipe", "components", "pipelines")
# bottom first; a module belongs to the first entry that names it or a package above it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("voxpipe", "voxpipe.errors", "voxpipe.params", "voxpipe.report", "voxpipe.progress",
              "voxpipe.secrets", "voxpipe.device", "voxpipe.integrity", "voxpipe.lineage", "voxpipe.files",
              "voxpipe.outlock", "voxpipe.paramspec")),
    ("model", ("voxpipe.model",)),
    # the FLOPs count and the device peaks: train's live MFU uses them; the `mfu` step sits above train
    ("mfu", ("voxpipe.mfu.flops", "voxpipe.mfu.peak", "voxpipe.mfu.published", "voxpipe.mfu.__init__")),
    ("data", ("voxpipe.data",)),
    ("train", ("voxpipe.train",)),
    ("evaluate", ("voxpipe.evaluate", "voxpipe.mfu.report")),
    ("track", ("voxpipe.track",)),
    ("serve/launch", ("voxpipe.serve", "voxpipe.launch")),
    ("cli", ("voxpipe.cli", "voxpipe.__main__", "voxpipe.dvcgen")),
    ("components/pipelines", ("components", "pipelines")),
)
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def all_modules() -> list[str]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def layer(module: str) -> str:
    """The layer of a module: its longest listed prefix (`voxpipe.mfu` is a package; its __init__ is listed
    as `voxpipe.mfu.__init__`)."""
    names = (module, f"{module}.__init__")
    best = None
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if any(n == prefix or n.startswith(prefix + ".") for n in names) and (
                    best is None or len(prefix) > len(best[1])):
                best = (name, prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[0]


def graph() -> dict[str, set[str]]:
    return {m: imports(m, ROOT, PACKAGES) - {m} for m in all_modules()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_in_a_layer():
    for module in all_modules():
        layer(module)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "modules that import each other (move what both need into a lower module):\n" + (
        "\n".join(" <-> ".join(c) for c in found))


def test_imports_only_point_down():
    up = [f"{m} ({layer(m)}) imports {t} ({layer(t)})" for m, targets in sorted(graph().items())
          for t in sorted(targets) if RANK[layer(t)] > RANK[layer(m)]]
    assert not up, "imports that point up a layer:\n" + "\n".join(up)


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
    assert cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]


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
