"""`voxpipe dvc-yaml`: dvc.yaml from the steps' descriptors, the code and the schema, not pasted.

DVC reruns a stage when a file in its `deps:` changes or a key in its `params:` does. So a stage's code
deps are its step's import closure (voxpipe/cli.py + the step's module + what they import, lazily inside a
function too, and package data a module names), found by reading the source with `ast`; the import
layer contracts (pyproject.toml, `lint-imports`) check the same edges. Its params are the keys the step
reads (its descriptor's `reads`) that change its result: the schema marks the others (voxpipe/section.py,
`result`).

The file is written whole from the steps' descriptors (`Step.stage`, voxpipe/steps/): the cmd, the data
deps, outs, metrics and plots as declared, the code deps and params as computed. It is written whole or
not at all (a temp file renamed over it); `--check` writes nothing and names each difference.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import yaml

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
    stage: Any  # voxpipe.steps.Stage, or None


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


# -- dvc.yaml, written whole ---------------------------------------------------------------------------
HEADER = """\
# `dvc repro`: the pipeline on this machine. Generated whole by `voxpipe dvc-yaml` (`make generate`) from
# the steps' descriptors (voxpipe/steps/): edit those, not this file. Every stage is one `voxpipe <step>`
# reading params.yaml; the paths are interpolated from params.yaml, so a path changed there is followed here.
#
# What DVC reruns, and why (docs/resilience.md "Under DVC", tests/test_dvc.py checks each point):
# - code deps are the step's import closure (voxpipe/cli.py + the step's module + everything they import,
#   + the voxpipe/steps modules of the sections it reads), not whole folders. A folder stands for all of
#   its files. A setting added to another step's section reruns nothing here.
# - params are tracked per key, only keys that change the result: not the checkpoint, logging,
#   tracking-of-train or worker-count keys (`ingest.workers`, `train.checkpoint_every`, `train.track`).
# - every cached output is byte-identical for the same inputs, params and code: timings and host facts
#   go to each folder's run.json, which .dvcignore hides from DVC. A rerun that changes nothing stops there.
# - outputs a rerun must keep are `persist: true`: train's checkpoints (not cached: a killed `dvc repro`
#   resumes from the newest good one), the ingested audio and the encoded shards (reused, as from the CLI).
"""
TORCHRUN = "python -m voxpipe.launch.torchrun --standalone --nproc_per_node=${local.nproc} -m voxpipe.cli"
WIDTH = 110


def stage_cmd(step: StepLike) -> str:
    stage = step.stage
    cmd = f"{TORCHRUN} {step.name}" if stage.torchrun else f"voxpipe {step.name}"
    return f"{cmd} {stage.args}".strip()


def _commented(line: str, note: str | None) -> list[str]:
    """`line  # note`, or the note as comment lines above the line when that is too wide."""
    if not note:
        return [line]
    if len(line) + len(note) + 4 <= WIDTH:
        return [f"{line}  # {note}"]
    indent = " " * (len(line) - len(line.lstrip()))
    return [f"{indent}# {ln}" for ln in textwrap.wrap(note, WIDTH - len(indent) - 2)] + [line]


def _out(out: Any, notes: dict[str, str]) -> list[str]:
    note = out.note or notes.get(out.path)
    options = [o for o, on in (("persist: true", out.persist), ("cache: false", not out.cache)) if on]
    if not options:
        return _commented(f"      - {out.path}", note)
    return [*_commented(f"      - {out.path}:", note), *(f"          {o}" for o in options)]


def _stage(step: StepLike, root: Path) -> list[str]:
    stage, notes = step.stage, dict(step.stage.notes)
    head = f"  {step.name}:"
    if len(head) + len(stage.note) + 4 <= WIDTH:
        lines = _commented(head, stage.note)
    else:  # a long note: comment lines under the name
        lines = [head, *(f"    # {ln}" for ln in textwrap.wrap(stage.note, WIDTH - 6))]
    cmd = stage_cmd(step)
    lines += [f"    cmd: {cmd}", "    deps:"]
    lines += [f"      - {d}" for d in compact(step_closure(step), root)]
    lines += [line for d in stage.deps for line in _commented(f"      - {d}", notes.get(d))]
    params = tracked_params(step, cmd)
    params += [p for p in stage.params if p not in params]
    if params:
        lines += ["    params:", *(line for p in params for line in _commented(f"      - {p}", notes.get(p)))]
    for name, outs in (("outs", stage.outs), ("metrics", stage.metrics)):
        if outs:
            lines += [f"    {name}:", *(line for out in outs for line in _out(out, notes))]
    return lines


def _plot(name: str, spec: dict[str, Any], note: str | None) -> list[str]:
    if not spec:
        return _commented(f"  - {name}", note)
    lines = [*_commented(f"  - {name}:", note), f"      x: {spec['x']}", "      y:"]
    for path, columns in spec["y"].items():
        shown = f"[{', '.join(columns)}]" if isinstance(columns, list) else columns
        lines.append(f"        {path}: {shown}")
    return lines


def render(steps: Iterable[StepLike], root: Path = ROOT) -> str:
    """dvc.yaml, whole: a stage per step that declares one (`Step.stage`), in pipeline order, then the
    plots they make."""
    staged = [s for s in steps if s.stage is not None]
    lines = ["stages:"]
    for step in staged:
        lines += _stage(step, root) + [""]
    plots = [line for s in staged for name, spec in s.stage.plots
             for line in _plot(name, spec, dict(s.stage.notes).get(name))]
    if plots:
        lines += ["plots:", *plots]
    return HEADER + "\n" + "\n".join(lines).rstrip() + "\n"


def differences(old: str, new: str) -> list[str]:
    """Per stage and field, what the file holds that the steps do not declare, or lacks."""
    try:
        before = (yaml.safe_load(old) or {}).get("stages") or {}
    except yaml.YAMLError as e:
        return [f"not valid YAML ({str(e).splitlines()[0]})"]
    after = yaml.safe_load(new)["stages"]
    problems = [f"stage {name}: {'not declared by a step' if name in before else 'missing'}"
                for name in sorted(set(before) ^ set(after))]
    for name in [n for n in after if n in before]:
        for field_ in ("cmd", "deps", "params", "outs", "metrics"):
            have, want = before[name].get(field_), after[name].get(field_)
            if have == want:
                continue
            if isinstance(want, list) and isinstance(have, list | type(None)):
                have = [repr(d) if isinstance(d, dict) else d for d in have or []]
                want = [repr(d) if isinstance(d, dict) else d for d in want]
                missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
                problems.append(f"stage {name}: {field_} lack {missing}, hold {extra} they should not")
            else:
                problems.append(f"stage {name}: {field_} is {have!r}, the step declares {want!r}")
    return problems


def dvc_yaml(path: Path, steps: Iterable[StepLike], check: bool) -> list[str]:
    """Write `path` from the steps (check: only compare); the differences found, one line per stage and
    field."""
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if check and not old:
        raise StepError(f"{path}: no such file; run `voxpipe dvc-yaml` in the repo (or give --file)")
    new = render(steps)
    problems = differences(old, new) if old else []
    if not problems and new != old and old:
        problems = [f"{path}: the same stages, written otherwise (order, comments): run `voxpipe dvc-yaml`"]
    if not check and new != old:
        atomic_write_text(path, new)
    return problems
