"""Transcripts as they are spoken: numbers, dates, money and units written out in the row's language.

A model that sees "$12.50" learns to read it digit by digit, or not at all (VoxCPM issue #164: money
mispronounced). wetext's compiled text-normalization FSTs (zh, en; the ones VoxCPM itself uses) ship
in its wheel. A row in another language keeps its text: there is no grammar for it, and guessing
with the English one would turn its numbers into English words.
"""

from __future__ import annotations

import re
from functools import cache

NORMALIZED_LANGUAGES = ("zh", "en")


@cache
def _normalizer(language: str):
    from wetext import Normalizer  # kaldifst: loaded by the workers that normalize text only

    return Normalizer(lang=language, operator="tn")


def normalize_for_speech(text: str, language: str) -> str:
    """`text` with its written forms (digits, symbols) spelled out as words of `language`; unchanged
    for a language without a grammar. Whitespace is collapsed as ingest does for every text."""
    if language not in NORMALIZED_LANGUAGES or not text:
        return text
    try:
        spoken = _normalizer(language).normalize(text)
    except AssertionError:  # wetext's zh grammar tags nothing in a text without Han: nothing to spell out
        return text
    # wetext's output escapes quotes and backslashes (`\"`): as spoken, they are the characters themselves
    return " ".join(re.sub(r"\\(.)", r"\1", spoken).split())
