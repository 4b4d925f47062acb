"""Periodic exports: a run that peaks at step 600 of 1000 can still ship step 600.

With `train.export_every` N > 0 the trainer also writes `exports/step-K/` (the same upstream layout
as `export/`) at every K that is a multiple of N and at the last step, and keeps the newest
`train.keep_exports` of them. `voxpipe evaluate` pointed at `exports/` scores each and picks one by
the promotion rule. An export is written into `exports/.tmp-step-K/` and renamed once complete, so
a crash never leaves a folder that looks like an export. With `train.ema_decay` each `exports/step-K/`
gets a sibling `exports/step-K-ema/` (the EMA weights, same layout and signed identity), pruned with it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from voxpipe.files import step_folders
from voxpipe.train.device import Runtime
from voxpipe.train.ema import EMA_SUFFIX

EXPORTS = "exports"


def due(step: int, every: int, last: bool) -> bool:
    return every > 0 and (last or step % every == 0)


def export_step(write: Callable[[Path], object], out: Path, step: int, keep: int, rt: Runtime,
                write_ema: Callable[[Path], object] | None = None) -> None:
    """`write(folder)` is the collective export (rank 0 writes); rank 0 then publishes it and prunes.
    `write_ema(folder)`, when given, writes the EMA sibling `step-N-ema` the same way."""
    root = out / EXPORTS
    _publish(write, root, f"step-{step}", rt)
    if write_ema is not None:
        _publish(write_ema, root, f"step-{step}{EMA_SUFFIX}", rt)
    if not rt.is_main:
        return
    for old_step, old in step_folders(root)[:-keep]:  # complete ones: a partial export has a temp name
        shutil.rmtree(old)
        shutil.rmtree(root / f"step-{old_step}{EMA_SUFFIX}", ignore_errors=True)


def _publish(write: Callable[[Path], object], root: Path, name: str, rt: Runtime) -> None:
    tmp = root / f".tmp-{name}"
    if rt.is_main and tmp.exists():
        shutil.rmtree(tmp)  # a crashed earlier attempt
    write(tmp)
    if not rt.is_main:
        return
    final = root / name
    if final.exists():
        shutil.rmtree(final)  # the same step again (a resumed run): the new weights replace it
    os.replace(tmp, final)
