"""`evaluate.average_top_k`: the uniform average of the k best exports, one more candidate.

CosyVoice ships `average_model.py --val_best`: the checkpoints with the lowest validation loss, averaged
weight by weight, often beat each of them. Here the k exports of the run (as saved, not their EMA
siblings) with the lowest fixed-seed val loss that evaluate has just measured are averaged into
`<evaluate.out>/average/`, an export folder in upstream's layout like theirs (the best one's config,
AudioVAE and tokenizer files; model.safetensors the mean, in the exports' dtype), signed with the run's
identity and `kind: average` (voxpipe/train/identity.py) when the exports carry one. evaluate then scores
it like any other candidate and the promotion rule may choose it. With LoRA the merged weights are
averaged; the adapters alone (`lora/`) are not, so the average carries no `lora/` folder.

The average is accumulated in float32 one export at a time: the host holds the sum and one export.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from voxpipe.errors import StepError
from voxpipe.evaluate.exports import AVERAGE, LIVE, Candidate
from voxpipe.train.export import LORA_SUBDIR
from voxpipe.train.identity import IDENTITY_FILE, identity_or_why, write_identity

AVERAGE_DIR = "average"
WEIGHTS = "model.safetensors"


def best_k(losses: dict[Candidate, float], k: int) -> tuple[list[Candidate], str | None]:
    """The (at most) k live exports with the lowest finite loss, best first; (.., why not) under two."""
    live = sorted(((loss, c.step or 0, c) for c, loss in losses.items()
                   if c.kind == LIVE and math.isfinite(loss)), key=lambda t: (t[0], t[1]))
    chosen = [c for _, _, c in live[:k]]
    if len(chosen) < 2:
        return [], (f"evaluate.average_top_k={k}, but {len(chosen)} export(s) of the run with a finite loss "
                    "were scored: an average needs two (set train.export_every so train writes several)")
    return chosen, None


def average_exports(sources: list[Candidate], out: Path, key: bytes) -> Path:
    """Write the uniform average of `sources` (best first) into `out` (replaced once complete; on a failure
    the partial folder is removed and the previous average stays)."""
    tmp = out.with_name(f".{out.name}-new")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_average(sources, tmp, key)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _write_average(sources: list[Candidate], tmp: Path, key: bytes) -> None:
    shutil.copytree(sources[0].path, tmp, ignore=shutil.ignore_patterns(WEIGHTS, IDENTITY_FILE, LORA_SUBDIR))
    with safe_open(str(sources[0].path / WEIGHTS), "pt") as first:
        metadata = first.metadata()
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for source in sources:
        state = load_file(str(source.path / WEIGHTS))
        if total and state.keys() != total.keys():
            raise StepError(f"{source.path / WEIGHTS}: its tensors differ from those of "
                            f"{sources[0].path / WEIGHTS}, so the exports cannot be averaged; set "
                            "evaluate.average_top_k=0 or rerun train")
        for name, value in state.items():
            dtypes.setdefault(name, value.dtype)
            if name in total:
                total[name] += value.float()
            else:
                total[name] = value.float()
        del state
    averaged = {name: (value / len(sources)).to(dtypes[name]) for name, value in total.items()}
    save_file(averaged, str(tmp / WEIGHTS), metadata=metadata)
    identity, _ = identity_or_why(sources[0].path, key)
    if identity is not None:  # the run's identity (the exports were checked before they were scored)
        run = {k: v for k, v in identity.items() if k not in ("files", "step", "kind", "ema_decay")}
        write_identity(tmp, run, max(s.step or 0 for s in sources), key,
                       {"kind": AVERAGE, "averaged": [s.path.name for s in sources]})


def average_candidate(losses: dict[Candidate, float], k: int, out: Path, key: bytes
                      ) -> tuple[Candidate | None, dict[str, Any]]:
    """The averaged candidate under `out`/average (None when fewer than two exports qualify) and what
    eval.json records of it: the exports averaged with their losses, or why there is no average."""
    sources, why = best_k(losses, k)
    if why is not None:
        return None, {"k": k, "path": None, "averaged": [], "null_reason": why}
    folder = average_exports(sources, out / AVERAGE_DIR, key)
    step = max(s.step or 0 for s in sources)
    record = {"k": k, "path": str(folder), "step": step,
              "averaged": [{"path": str(s.path), "step": s.step, "loss": losses[s]} for s in sources]}
    return Candidate(folder, step, AVERAGE), record
