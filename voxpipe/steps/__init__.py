"""Each step in one place: its settings (a params section) and its descriptor."""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def own(self) -> str:
        """The section whose keys get plain flags (`--out`); other sections' flags carry their name."""
        return self.reads[0].split(".")[0]
