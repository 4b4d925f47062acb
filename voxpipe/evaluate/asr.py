"""Intelligibility: word and character error rates from an offline English ASR (PocketSphinx).

PocketSphinx 5.1.1 ships its US-English acoustic model, dictionary and language model inside the
wheel, so it runs offline. It is a small, old-style recogniser: on clean human read speech it
gets a fair share of words right, on synthetic or accented voices far fewer. Its WER is therefore
reported next to `wer_real`, its WER on the real recordings of the same texts: only the gap
between the two says something about the generated audio. English text only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import numpy as np

from voxpipe.errors import StepError

SAMPLE_RATE = 16000
# Active HMMs per frame (pocketsphinx's default 30000). On the sample's real clips 3000 decodes 2x
# faster for WER 0.82 instead of 0.78, and on the noise of a model that does not stop yet 3x
# faster: there the default spends ~0.7 s per audio second searching.
MAX_HMM_PER_FRAME = 3000


class Transcriber:
    def __init__(self) -> None:
        try:
            from pocketsphinx import Decoder
        except ImportError as e:
            raise StepError(f"WER needs pocketsphinx ({e}): `pip install -e '.[eval]'` (or set evaluate.asr "
                            "to false)") from e
        self._decoder = Decoder(samprate=SAMPLE_RATE, maxhmmpf=MAX_HMM_PER_FRAME, loglevel="FATAL")

    def transcribe(self, wav: np.ndarray) -> str:
        """Text of a 16 kHz mono float clip ("" when nothing was recognised)."""
        pcm = (np.clip(np.asarray(wav, dtype=np.float32), -1.0, 1.0) * 32767).astype(np.int16).tobytes()
        self._decoder.start_utt()
        self._decoder.process_raw(pcm, full_utt=True)
        self._decoder.end_utt()
        hyp = self._decoder.hyp()
        return hyp.hypstr if hyp is not None else ""


def words(text: str) -> list[str]:
    """Lower case, punctuation dropped (apostrophes inside words kept), split on whitespace."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).replace(" '", " ").split()


def edit_distance(ref: list[str] | str, hyp: list[str] | str) -> int:
    """Levenshtein distance (substitutions, insertions, deletions all cost 1)."""
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        current = [i]
        for j, h in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h)))
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class Errors:
    word_edits: int
    words: int
    char_edits: int
    chars: int

    @property
    def wer(self) -> float:
        return self.word_edits / max(self.words, 1)

    @property
    def cer(self) -> float:
        return self.char_edits / max(self.chars, 1)


def errors(reference: str, hypothesis: str) -> Errors:
    ref, hyp = words(reference), words(hypothesis)
    ref_chars, hyp_chars = " ".join(ref), " ".join(hyp)
    return Errors(edit_distance(ref, hyp), len(ref), edit_distance(ref_chars, hyp_chars), len(ref_chars))


def corpus_rates(items: list[Errors]) -> dict[str, float | None]:
    """WER and CER over a set: total edits / total reference length (not a mean of per-clip rates)."""
    if not items:
        return {"wer": None, "cer": None}
    total = Errors(*(sum(getattr(e, f.name) for e in items) for f in fields(Errors)))
    return {"wer": total.wer, "cer": total.cer}
