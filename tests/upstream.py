"""Import upstream voxcpm 2.0.3 (the parity reference) inside tests and benchmarks only.

Its package imports torchaudio, whose wheel does not load against our torch; upstream's model
code never calls it on the paths we compare, so a stand-in module with a real __spec__ is enough.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path


def load_upstream():
    """The `voxcpm` package (`make install` puts it in the venv with --no-deps), or an ImportError that says
    so in one sentence (the benchmarks report it as the reason a figure is null)."""
    if "torchaudio" not in sys.modules:
        stub = types.ModuleType("torchaudio")
        stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        sys.modules["torchaudio"] = stub
    try:
        return importlib.import_module("voxcpm")
    except ImportError as e:
        raise ImportError(f"upstream voxcpm==2.0.3, the parity reference, does not import ({e}); "
                          "`make install` puts it in the venv") from e


def import_upstream():
    """Return the `voxcpm` package; a test fails without it."""
    import pytest

    try:
        return load_upstream()
    except ImportError as e:  # pragma: no cover - only when `make install` was bypassed
        pytest.fail(str(e))


@functools.cache
def upstream_packer_class():
    """Upstream's training/packers.py on its own: its package __init__ needs argbind and datasets."""
    path = Path(load_upstream().__file__).parent / "training" / "packers.py"
    spec = importlib.util.spec_from_file_location("upstream_voxcpm_packers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AudioFeatureProcessingPacker


def upstream_rows(batch: dict) -> dict:
    """A row plan (voxpipe/model/rows.py) that computes what upstream does: both LMs on all B*T positions
    and the local encoder on every row, so that a test or benchmark can measure what the plan leaves out."""
    import torch

    n = batch["text_tokens"].numel()
    every = torch.arange(n)
    loss = torch.nonzero(batch["loss_mask"].reshape(-1) > 0).squeeze(1)
    return {"lm_rows": every, "audio_rows": every, "audio_slots": every,
            "loss_rows": loss, "loss_prev": loss - 1}
