"""A row's language: the one key that text normalization (ingest) and scoring (evaluate) agree on.

A row carries `language` from ingest (`ingest.language`, or detected here from the script of its
text) through raw.jsonl, the manifests and the encoded rows to evaluate, which picks the recogniser
and the error rate (CER for Chinese, WER otherwise) from it. Codes are ISO 639-1 ("en", "zh").

Detection reads the script only: Han characters make a row Chinese, kana Japanese, Hangul Korean.
Latin script says nothing about which Latin-script language it is, so it is taken as English; a
French or German set names its language in `ingest.language`.
"""

from __future__ import annotations

import unicodedata

# script -> language, for the scripts whose language the script itself tells
_HAN = "zh"
_KANA = "ja"
_HANGUL = "ko"
LATIN_DEFAULT = "en"


_RANGES = (  # (first, last code point, language)
    (0x3040, 0x30FF, _KANA), (0x31F0, 0x31FF, _KANA),
    (0xAC00, 0xD7AF, _HANGUL), (0x1100, 0x11FF, _HANGUL), (0x3130, 0x318F, _HANGUL),
    (0x4E00, 0x9FFF, _HAN), (0x3400, 0x4DBF, _HAN), (0xF900, 0xFAFF, _HAN), (0x20000, 0x2FA1F, _HAN),
)


def _script(ch: str) -> str | None:
    code = ord(ch)
    for first, last, language in _RANGES:
        if first <= code <= last:
            return language
    if unicodedata.category(ch).startswith("L"):
        return LATIN_DEFAULT  # any other letter: Latin, Cyrillic, ... (named by ingest.language)
    return None


def detect_language(text: str) -> str:
    """The language the script of `text` tells: kana (even among Han) is Japanese, Hangul Korean,
    Han Chinese; anything else, or no letters at all, is LATIN_DEFAULT."""
    seen = {s for s in map(_script, text) if s}
    for language in (_KANA, _HANGUL, _HAN):
        if language in seen:
            return language
    return LATIN_DEFAULT
