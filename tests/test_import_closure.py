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
