"""Comparing what was heard with what was written: CER between two transcripts, and a user's script
aligned to a recording's clips.

Both compare characters after `comparable`: lower case, punctuation gone, one space between words (none
at all in Chinese, Japanese or Korean text, whose characters are the units). Edit distances are
Levenshtein's; nothing here loads a model.
"""

from __future__ import annotations

import unicodedata

SPACELESS = ("zh", "ja", "ko", "yue")  # languages whose text is compared without spaces


def comparable(text: str, language: str = "en") -> str:
    """`text` as compared: casefolded, punctuation and symbols dropped, whitespace collapsed."""
    kept = "".join(" " if unicodedata.category(c)[0] in "PSZC" else c for c in text.casefold())
    return "".join(kept.split()) if language in SPACELESS else " ".join(kept.split())


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between two strings (substitutions, insertions, deletions all cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ca != cb))
    return row[-1]


def cer(reference: str, hypothesis: str, language: str = "en") -> float:
    """Character error rate of `hypothesis` against `reference`, both `comparable`: edits per reference
    character (1.0 when the reference is empty and the hypothesis is not, 0.0 when both are)."""
    ref, hyp = comparable(reference, language), comparable(hypothesis, language)
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(ref, hyp) / len(ref)
