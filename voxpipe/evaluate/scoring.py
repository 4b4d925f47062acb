"""Error rates the way Seed-TTS-eval computes them (its `run_wer.py`), the protocol VoxCPM2 publishes
its results on.

Per utterance: a Chinese hypothesis, whichever recogniser made it, is first converted to simplified
Chinese (`zhconv.convert(..., "zh-cn")`); the reference text is not converted, as in run_wer.py, so a
reference written in traditional characters scores against simplified ones. Then, on both texts,
every character of `zhon.hanzi.punctuation` and of ASCII punctuation is deleted (not replaced by a
space), except the ASCII apostrophe. Chinese is split into characters, whitespace dropped, and
scored as CER; English letters inside Chinese text are characters too, and keep their case. Every
other language is lowercased and scored as WER over words. The words are what jiwer's default
transform makes of the text, as in run_wer.py: runs of two or more whitespace characters and
single spaces separate words, but a lone tab or no-break space does not ("a\u00a0b" is one word).
A set's rate is the mean of its per-utterance rates, not total edits over total length. A
reference with nothing left to score has no rate (None), never 0. run_wer.py scores only zh and en;
voxpipe scores any other language as it scores English.

The speaking rate (seconds per text unit, for the expected length of a clip) counts the same scoring
text's characters, spaces left out, in every language: in English a character count follows duration
more closely than a word count, as word lengths vary.
"""

from __future__ import annotations

import re
import statistics
import string
from dataclasses import asdict, dataclass
from typing import Any

import zhconv
from zhon.hanzi import punctuation as HANZI_PUNCTUATION

CHARACTER_LANGUAGES = frozenset({"zh"})  # scored as CER; every other language as WER
PUNCTUATION = frozenset(HANZI_PUNCTUATION + string.punctuation) - {"'"}


def strip_punctuation(text: str) -> str:
    return "".join(ch for ch in text if ch not in PUNCTUATION)


def hypothesis_text(transcript: str, language: str) -> str:
    """A recogniser's transcript as Seed-TTS-eval scores it: Chinese in simplified characters."""
    return zhconv.convert(transcript, "zh-cn") if language in CHARACTER_LANGUAGES else transcript


def scoring_text(text: str, language: str) -> str:
    """What is compared, tokens one space apart: punctuation gone; zh one token per character, others
    lowercased words."""
    text = strip_punctuation(text)
    if language in CHARACTER_LANGUAGES:
        return " ".join(ch for ch in text if not ch.isspace())
    # jiwer's default transform, which run_wer.py's text goes through: 2+ whitespace become one space
    return re.sub(r"\s\s+", " ", text.lower()).strip()


def metric_of(language: str) -> str:
    return "cer" if language in CHARACTER_LANGUAGES else "wer"


def text_units(text: str) -> int:
    """Characters of the scoring text without spaces: the unit of a speaker's speaking rate."""
    return sum(not ch.isspace() for ch in strip_punctuation(text))


@dataclass(frozen=True)
class Rate:
    metric: str  # "cer" | "wer"
    rate: float  # (substitutions + deletions + insertions) / reference units
    substitutions: int
    deletions: int
    insertions: int
    units: int  # reference characters (cer) or words (wer)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def utterance_rate(reference: str, hypothesis: str, language: str) -> Rate | None:
    """One utterance's CER (zh) or WER (others) of a recogniser's transcript; None when the reference
    has nothing to score."""
    import jiwer

    ref = scoring_text(reference, language)
    hyp = scoring_text(hypothesis_text(hypothesis, language), language)
    if not ref:
        return None
    out = jiwer.process_words(ref, hyp)
    return Rate(metric_of(language), float(out.wer), out.substitutions, out.deletions, out.insertions,
                len(ref.split(" ")))


def mean_rate(rates: list[Rate | None]) -> float | None:
    """The mean of per-utterance rates (Seed-TTS-eval's figure); None without any."""
    kept = [r.rate for r in rates if r is not None]
    return statistics.fmean(kept) if kept else None
