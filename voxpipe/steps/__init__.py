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
class Step:
    name: str
    help: str
    target: str  # "module:function"
    section: str | None  # the function gets this section; None: the whole Params (it reads several)
    reads: tuple[str, ...]  # what becomes flags: a section (all its keys), a sub-section or one key
    hide: tuple[str, ...] = ()  # keys of `reads` left to `--set` (wired by an orchestrator)
    out_folder: bool = True  # `--out` is a folder to lock for one writer (synthesize: one WAV file)
    # keyword -> "module:attr" the step function gets, imported on first call: a part from a higher layer
    # that the step uses without importing it, and that changes no result (so no DVC dep of the stage)
    wires: tuple[tuple[str, str], ...] = ()
    # keys of `reads` that change nothing this step writes, though they change another step's (train logs
    # live to `tracking`, register registers there): no DVC param of its stage (voxpipe/dvcgen.py)
    untracked: tuple[str, ...] = ()
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


def all_steps() -> tuple[Step, ...]:
    """Every step, in pipeline order, each knowing the module that declares it (`Step.module`)."""
    return tuple(dataclasses.replace(step, module=m.__name__) for m in modules()
                 for step in getattr(m, "STEPS", ()))
