"""`voxpipe detect FILE...`: whether clips are voxpipe's, from what each carries: PerTh's watermark in the
audio (marks.py) and the C2PA manifest in the file (provenance.py). A real recording has neither."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import soundfile as sf

from voxpipe.errors import StepError, quoted_path
from voxpipe.evaluate.marks import THRESHOLD, watermark_score
from voxpipe.evaluate.provenance import read
from voxpipe.steps.detect import DetectParams


@dataclass
class DetectResult:
    files: list[dict[str, Any]]
    format: str

    def summary(self) -> str:
        if self.format == "json":
            return json.dumps(self.files, indent=2)
        lines = [f"{'file':<40} {'watermark':<9} {'score':>6}  c2pa"]
        for f in self.files:
            c2pa = f["c2pa"]
            shown = ("none" if not c2pa["present"] else
                     f"{'valid' if c2pa.get('valid') else 'INVALID'} signer={c2pa.get('signer')} "
                     f"model={c2pa.get('model_version')}")
            lines.append(f"{f['file'][-40:]:<40} {'yes' if f['watermark'] else 'no':<9} "
                         f"{f['score']:>6.3f}  {shown}")
        return "\n".join(lines)


def check(path: Path) -> dict[str, Any]:
    """One file's marks: the watermark's presence and score, and its C2PA manifest."""
    try:
        audio, rate = sf.read(path, dtype="float32", always_2d=False)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise StepError(f"detect: {quoted_path(path)} is not audio soundfile reads ({str(e)[:120]}); give "
                        "WAV, FLAC, MP3 or OGG files") from None
    score = watermark_score(audio, rate)
    return {"file": str(path), "watermark": score > THRESHOLD, "score": round(score, 4), "c2pa": read(path)}


def detect(p: DetectParams) -> DetectResult:
    if not p.files:
        raise StepError("detect.files is empty: name the clips to check, "
                        "`voxpipe detect --files a.wav b.mp3`")
    missing = [f for f in p.files if not Path(f).is_file()]
    if missing:
        raise StepError(f"detect: no such file {quoted_path(missing[0])}" + (f" (and {len(missing) - 1} more)"
                        if len(missing) > 1 else "") + "; nothing was checked")
    return DetectResult([check(Path(f)) for f in p.files], p.format)
