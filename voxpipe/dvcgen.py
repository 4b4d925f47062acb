"""`voxpipe dvc-yaml`: dvc.yaml's code `deps:` and `params:` from the code and the schema, not pasted.

DVC reruns a stage when a file in its `deps:` changes or a key in its `params:` does. So a stage's code
deps are its step's import closure (voxpipe/cli.py + the step's module + what they import, lazily inside a
function too, and package data a module names), found by reading the source with `ast`; the import
layer contracts (pyproject.toml, `lint-imports`) check the same edges. Its params are the keys the step
reads (the cli's `Step.reads`) that change its result: the schema marks the others (voxpipe/section.py,
`result`).

The file is edited through ruamel.yaml's round trip, so only the code-dep items (`- voxpipe/...`) and the
`params:` lists change: the comments and every other line stay as written (it reads any indentation and
writes dvc.yaml's own). It is written whole or not at all (a temp file renamed over it). `--check` writes
nothing and names each difference.
"""

from __future__ import annotations

import ast
import functools
import io
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedSeq

from voxpipe.errors import StepError
from voxpipe.files import atomic_write_text
from voxpipe.paramspec import fields
from voxpipe.steps import sections

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


@functools.cache
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


@functools.cache
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


def expand(dep: str, root: Path = ROOT) -> set[str]:
    """A code dep as the files DVC hashes (a folder: all of them, as .dvcignore leaves them)."""
    path = root / dep
    if path.is_file():
        return {dep}
    return {f.relative_to(root).as_posix() for f in path.rglob("*")
            if f.is_file() and "__pycache__" not in f.parts}


def compact(files: set[str], root: Path = ROOT) -> list[str]:
    """The closure as dvc.yaml lists it: a folder where every file in it is needed, else the files."""
    out = set(files)
    for folder in {f.rpartition("/")[0] for f in files} - {"voxpipe"}:
        if expand(folder, root) <= files:
            out = (out - expand(folder, root)) | {folder}
    return sorted(out, key=lambda d: (d.count("/"), d))


# -- what a stage depends on -------------------------------------------------------------------------
class StepLike(Protocol):  # voxpipe.steps.Step (the cli passes its STEPS: this module sits below it)
    name: str
    module: str
    target: str
    reads: tuple[str, ...]
    hide: tuple[str, ...]
    untracked: tuple[str, ...]


def step_of(cmd: str) -> str | None:
    """The `voxpipe <step>` a stage's cmd runs (plain or `torchrun ... -m voxpipe.cli <step>`)."""
    m = re.search(r"(?:^voxpipe|-m voxpipe\.cli) ([\w-]+)", cmd)
    return m.group(1) if m else None


def step_closure(step: StepLike) -> set[str]:
    """The step's code: the cli, its function's module, its descriptor's and those of the sections it reads.
    The schema and the cli find voxpipe/steps/'s modules without importing them by name, so another step's
    section (a serve setting) is no dep of this stage; tests/test_step_reads.py keeps `reads` complete."""
    owners = {sections()[spec.split(".")[0]].__module__ for spec in step.reads}
    return import_closure({"voxpipe.cli", step.target.split(":")[0], step.module, *owners})


def _covered(key: str, specs: Iterable[str]) -> bool:
    return any(key == s or key.startswith(s + ".") for s in specs)


def tracked_params(step: StepLike, cmd: str) -> list[str]:
    """The keys the step reads that change its result (a sub-section such as train.lora as one key: DVC
    must find every key it tracks in params.yaml), not those it leaves to an orchestrator or marks as
    changing nothing here; then the keys the cmd interpolates (`${local.nproc}`: the world size)."""
    out = []
    for spec in step.reads:
        for name, leaves in fields(spec).items():
            if any(k.changes_result for k in leaves) and not _covered(name, (*step.hide, *step.untracked)):
                out.append(name)
    return out + [k for k in dict.fromkeys(re.findall(r"\$\{([\w.]+)\}", cmd)) if k not in out]


# -- dvc.yaml, rewritten in place ------------------------------------------------------------------------
def _round_trip() -> YAML:
    """dvc.yaml's own layout (lists indented under their key), so an unchanged file dumps byte for byte."""
    rt = YAML()  # round trip: comments, key order and quoting stay as written
    rt.indent(mapping=2, sequence=4, offset=2)
    rt.preserve_quotes = True
    rt.width = 4096  # no long line is folded
    return rt


def _set_items(seq: CommentedSeq, items: list[str]) -> None:
    """Make `seq` hold `items`, each kept item with its comment (a comment sits on its item's index)."""
    comments = {seq[i]: c for i, c in seq.ca.items.items() if isinstance(seq[i], str)}
    seq.ca.items.clear()
    list.__delitem__(seq, slice(None))
    list.extend(seq, items)
    for i, item in enumerate(items):
        if item in comments:
            seq.ca.items[i] = comments[item]


def render(text: str, steps: Iterable[StepLike], root: Path = ROOT) -> str:
    """dvc.yaml's text with each stage's code deps (`voxpipe/...`, where the first of them was) and params
    as the code and schema say; every comment and every other line as written, a param's comment with its
    key."""
    by_name = {s.name: s for s in steps}
    rt = _round_trip()
    doc = rt.load(text)
    for stage in doc["stages"].values():
        step = by_name.get(step_of(stage["cmd"]) or "")
        if step is None:
            continue
        deps = stage.get("deps") or []
        code = [i for i, d in enumerate(deps) if isinstance(d, str) and d.startswith("voxpipe/")]
        if code:
            others = [d for i, d in enumerate(deps) if i not in code]
            _set_items(deps, others[:code[0]] + compact(step_closure(step), root) + others[code[0]:])
        if stage.get("params"):
            _set_items(stage["params"], tracked_params(step, stage["cmd"]))
    out = io.StringIO()
    rt.dump(doc, out)
    return out.getvalue()


def differences(old: str, new: str) -> list[str]:
    """Per stage, what its code deps and params lack and hold beyond what they should."""
    before, after = yaml.safe_load(old)["stages"], yaml.safe_load(new)["stages"]
    problems = []
    for name, stage in after.items():
        for field_ in ("deps", "params"):
            have = [d for d in before[name].get(field_, []) if isinstance(d, str)]
            want = [d for d in stage.get(field_, []) if isinstance(d, str)]
            if field_ == "deps":
                have, want = ([d for d in x if d.startswith("voxpipe/")] for x in (have, want))
            missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
            if missing or extra:
                problems.append(f"stage {name}: {field_} lack {missing}, hold {extra} they should not")
    return problems


def dvc_yaml(path: Path, steps: Iterable[StepLike], check: bool) -> list[str]:
    """Regenerate `path` (check: only compare); the differences found, one line per stage and list."""
    if not path.is_file():
        raise StepError(f"{path}: no such file; run `voxpipe dvc-yaml` in the repo (or give --file)")
    old = path.read_text(encoding="utf-8")
    new = render(old, steps)
    problems = differences(old, new)
    if not problems and new != old:
        problems = [f"{path}: the same deps and params, in another order: run `voxpipe dvc-yaml`"]
    if not check and new != old:
        atomic_write_text(path, new)
    return problems
