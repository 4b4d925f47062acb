"""Rows with no text, transcribed at ingest by the recognisers `ingest.asr` names (voxpipe/data/asr.py).

Where it runs: in ingest's parent process, once per row, in input order, while the decode workers go on
decoding the batches ahead (ingest.py keeps 2 x workers in flight). A worker keeps such a row's audio
(conditioned and written like any other) and hands it back untranscribed; the parent reads its FLAC and
transcribes it here. So each recogniser loads once per run, not once per worker: a Whisper-large copy
is 3 GB, a GPU is best held by one process, and pocketsphinx decodes in a child process of its own
(asr.PocketSphinx), so the parent only waits on it.

Each row's language is `ingest.language`, else its locale's (a row with no text has no script to tell
it); it takes the first recogniser of `ingest.asr` that covers it, as evaluate does. The transcript goes
through the same normalizer as typed text (text_norm.spoken_form, in the row's locale): raw.jsonl's
`text_raw` is what the recogniser wrote, `text` what is trained on. A transcribed row also keeps
(`KEYS`, in this order):
- `asr`: the recogniser's name; `asr_model`: its weights;
- `asr_confidence`: its average natural-log probability per word or token (null with
  `asr_confidence_reason` where it gives none);
- `asr_second`: `ingest.asr_second`'s opinion, {asr, text, cer} or {asr: null, reason}; null without one;
- `needs_review` (true when the confidence is below `ingest.asr_min_confidence` or the second's CER
  is above `ingest.asr_max_cer`) and `review_reason` (why; null when false).
A row with typed text has none of these keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from voxpipe.data.asr import Recognisers
from voxpipe.data.ingest_row import Kept, Rejected
from voxpipe.data.script_align import cer
from voxpipe.data.text_norm import normalize_text, spoken_form
from voxpipe.steps.ingest import IngestParams

KEYS = ("asr", "asr_model", "asr_confidence", "asr_confidence_reason", "asr_second", "needs_review",
        "review_reason")


@dataclass(frozen=True)
class Transcriber:
    """`ingest.asr` (and `ingest.asr_second`) loaded, with the review thresholds (`transcriber`)."""

    first: Recognisers
    second: Recognisers | None
    min_confidence: float
    max_cer: float
    normalize: bool  # ingest.normalize_text: the transcript is spelled out as typed text is

    def settle(self, kept: Kept, out: Path) -> Kept | Rejected:
        """The row a worker kept without text, transcribed, or why it cannot be (quarantined)."""
        language, locale = kept.info["language"], kept.info["locale"]
        choice = self.first.for_language(language)
        if choice.recogniser is None:
            return Rejected(kept.row, "no_recogniser", f"the row has no text, and {choice.reason}")
        wav, _ = sf.read(out / kept.audio, dtype="float32")
        heard = choice.recogniser.hear(np.asarray(wav), language)
        written = normalize_text(heard.text)
        if not written:
            return Rejected(kept.row, "missing_text", f"the row has no text, and {choice.recogniser.backend} "
                            "heard none in its audio")
        spoken = spoken_form(written, language, locale)[0] if self.normalize else written
        review = []
        if heard.confidence is not None and heard.confidence < self.min_confidence:
            review.append(f"asr_confidence {heard.confidence} < ingest.asr_min_confidence "
                          f"{self.min_confidence}")
        second = self._second_opinion(wav, language, written)
        if second and second.get("cer") is not None and second["cer"] > self.max_cer:
            review.append(f"{second['asr']} heard {second['text'][:80]!r}: CER {second['cer']} > "
                          f"ingest.asr_max_cer {self.max_cer}")
        values = (choice.recogniser.backend, choice.recogniser.model, heard.confidence, heard.reason, second,
                  bool(review), "; ".join(review) or None)
        info = {**kept.info, "text_raw": heard.text, **dict(zip(KEYS, values, strict=True))}
        return replace(kept, text=spoken, info=info, untranscribed=False)

    def _second_opinion(self, wav: np.ndarray, language: str, first: str) -> dict[str, Any] | None:
        if self.second is None:
            return None
        choice = self.second.for_language(language)
        if choice.recogniser is None:
            return {"asr": None, "reason": choice.reason}
        text = normalize_text(choice.recogniser.hear(wav, language).text)
        return {"asr": choice.recogniser.backend, "text": text, "cer": round(cer(first, text, language), 4)}


def transcriber(p: IngestParams, config: Mapping[str, Any]) -> Transcriber | None:
    """The recognisers `ingest.asr` names, loaded once (None when it names none). `config`: the asr
    section's values (the model folders); a missing folder or package fails here, before any row is
    decoded."""
    if not p.asr:
        return None
    second = Recognisers(p.asr_second, config, key="ingest.asr_second") if p.asr_second else None
    return Transcriber(Recognisers(p.asr, config, key="ingest.asr"), second, p.asr_min_confidence,
                       p.asr_max_cer, p.normalize_text)
