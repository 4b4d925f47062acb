"""Each step in one place: its settings (a params section) and its descriptor (`Step`).

A module here declares, for one section and the steps that own it:
- `SECTIONS`: the section's name in params.yaml and its model (a `voxpipe.section.Section`);
- `STEPS`: its steps' descriptors, from which the cli makes the subcommand and its flags, `make generate`
  the DVC stage and the docs;
- `ORDER`: where it comes in pipeline order (params.yaml, `voxpipe --help`, docs/params.md).

The modules are found, not listed: voxpipe/params.py composes the schema from every module's `SECTIONS`
and the cli its subcommands from every `STEPS`. So a new step is its function, its module here, its test
and its docs paragraph (docs/pipeline.md, "How to add a step"), and a stage's code deps hold the modules
of the sections it reads, not every section's (voxpipe/dvcgen.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Out:
    """An output DVC keeps: `persist` survives a rerun (resumable work), `cache: false` is a record."""

    path: str  # "${section.key}" (interpolated from params.yaml) or a path under one
    persist: bool = False
    cache: bool = True
    note: str = ""  # dvc.yaml's comment on it: why it is kept or not cached


@dataclass(frozen=True)
class Stage:
    """The step's stage in dvc.yaml, written whole from here (voxpipe/dvcgen.py): its code deps and params
    are computed, the rest is this. A path is "${section.key}" or a path under one; `notes` are the
    comments dvc.yaml shows on a dep, a param or an out, by its text."""

    deps: tuple[str, ...] = ()  # what it reads besides code: data, models, other stages' outputs
    outs: tuple[Out, ...] = ()
    metrics: tuple[Out, ...] = ()
    torchrun: bool = False  # one process per local.nproc, under voxpipe.launch.torchrun
    args: str = ""  # after `voxpipe <step>`
    params: tuple[str, ...] = ()  # tracked beyond the keys it reads (train.max_steps: grown, not new)
    plots: tuple[tuple[str, dict], ...] = ()  # dvc.yaml's top-level plots it makes: (name, definition)
    note: str = ""  # the comment on the stage's name
    notes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Step:
    name: str
    help: str
    target: str  # "module:function"
    reads: tuple[str, ...]  # what becomes flags: a section (all its keys), a sub-section or one key
    section: str | None = None  # the function gets this section; None: the whole Params (it reads several)
    hide: tuple[str, ...] = ()  # keys of `reads` left to `--set` (wired by an orchestrator)
    out_folder: bool = True  # `--out` is a folder to lock for one writer (synthesize: one WAV file)
    # keyword -> "module:attr" the step function gets, imported on first call: a part from a higher layer
    # that the step uses without importing it, and that changes no result (so no DVC dep of the stage)
    wires: tuple[tuple[str, str], ...] = ()
    # keys of `reads` that change nothing this step writes, though they change another step's (train logs
    # live to `tracking`, register registers there): no DVC param of its stage (voxpipe/dvcgen.py)
    untracked: tuple[str, ...] = ()
    stage: Stage | None = None  # a stage of `dvc repro` (dvc.yaml), or a command outside it
    module: str = ""  # the voxpipe.steps module that declares it (set by `all_steps`)

    @property
    def own(self) -> str:
        """The section whose keys get plain flags (`--out`); other sections' flags carry their name."""
        return self.reads[0].split(".")[0]


@functools.cache
def modules() -> tuple[ModuleType, ...]:
    """Every module of this package, in pipeline order."""
    found = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return tuple(sorted(found, key=lambda m: m.ORDER))


def sections() -> dict[str, Any]:
    """Section name (as params.yaml spells it) -> its model, in pipeline order."""
    return {name: model for m in modules() for name, model in getattr(m, "SECTIONS", {}).items()}


def moved() -> dict[str, str]:
    """`section.key` a key used to have -> where it is now (a module's `MOVED`): older params files load."""
    return {old: new for m in modules() for old, new in getattr(m, "MOVED", {}).items()}


def all_steps() -> tuple[Step, ...]:
    """Every step, in pipeline order, each knowing the module that declares it (`Step.module`)."""
    return tuple(dataclasses.replace(step, module=m.__name__) for m in modules()
                 for step in getattr(m, "STEPS", ()))
