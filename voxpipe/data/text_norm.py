"""Transcripts as they are spoken: numbers, dates, money and units written out in the row's language.

A model that sees "$12.50" learns to read it digit by digit, or not at all (VoxCPM issue #164: money
mispronounced). wetext's compiled text-normalization FSTs (zh, en; the ones VoxCPM itself uses) ship
in its wheel; text_rules.py corrects what they read wrong. A row in another language keeps its text:
there is no grammar for it, and guessing with the English one would turn its numbers into English
words.

Ingest (training) and `voxpipe synthesize` / the served model (speech) call the same `spoken_form`
(this normalization, with the language detected from the script as ingest detects it), so the model
reads at inference the forms it was trained on.

A text is read as a speaker of its locale says it (`ingest.locale`: en-US, en-GB, zh-CN; locale_for),
an English span inside Mandarin as English and the reverse (_spans), and its commas, question marks
and final stops are kept as written, out of wetext's reach (_spoken_piece). `unsure_readings` says
which readings are worth proofreading; the data report marks those rows.

wetext's time grows faster than linearly with its input (32,000 characters: 32 s; 200,000: over
300 s), so a text is read in chunks: its sentences, and a sentence longer than MAX_CHUNK_CHARS is cut
at a space or a comma. The cost is then linear in the length; ingest also refuses rows longer than
`ingest.max_text_chars` before they get here.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache

from voxpipe.data.language import detect_language
from voxpipe.data.text_rules import AFTER, BEFORE, LOCALES, Read, apply

NORMALIZED_LANGUAGES = ("zh", "en")
MAX_CHUNK_CHARS = 300
DEFAULT_LOCALE = {"en": "en-US", "zh": "zh-CN"}

# a sentence ends after 。！？；!?; (with closing quotes), or after a period followed by a space
_SENTENCE_END = re.compile(r"[。！？；!?;…]+[”’」』）)\"']*\s*|\.+[”’\"')]*\s+")
# a period after these is an abbreviation (Dr. Smith, Mar. 5, U.S. law): not a sentence end
_ABBREVIATION = re.compile(r"(?:^|[\s(])(?:[A-Z][a-z]{0,2}|[A-Za-z]|(?:[A-Za-z]\.)+[A-Za-z])$")
# where a long sentence may be cut: a space, or a comma/colon that is not inside a number (1,234)
_BREAK = re.compile(r"\s|[，、：,:](?!\d)")


@cache
def _normalizer(language: str):
    from wetext import Normalizer  # kaldifst: loaded by the workers that normalize text only

    return Normalizer(lang=language, operator="tn")


def _wetext(text: str, language: str) -> str:
    """wetext's reading of one chunk; the chunk as it is where wetext can tag nothing in it."""
    try:
        return _normalizer(language).normalize(text)
    except AssertionError:  # wetext's grammars tag nothing in some texts (zh without Han, "#"): as written
        return text


def _numeric(ch: str) -> bool:
    """A character of a written number (1,234.56)."""
    return ch.isdigit() or ch in ".,"


def _cut(sentence: str) -> list[str]:
    """A sentence in pieces of at most MAX_CHUNK_CHARS, cut after the last space or comma in the
    second half of the reach; where there is none, at the limit, moved back to the start of a number
    that the limit falls in (a number longer than half a chunk is cut anyway)."""
    half, pieces = MAX_CHUNK_CHARS // 2, []
    while len(sentence) > MAX_CHUNK_CHARS:
        reach = _BREAK.finditer(sentence, half, MAX_CHUNK_CHARS + 1)  # + 1: the lookahead sees past the limit
        breaks = [m.end() for m in reach if m.end() <= MAX_CHUNK_CHARS]
        at = breaks[-1] if breaks else MAX_CHUNK_CHARS
        start = at
        while not breaks and start > half and _numeric(sentence[start - 1]) and _numeric(sentence[start]):
            start -= 1
        at = start if start > half else at
        pieces.append(sentence[:at])
        sentence = sentence[at:]
    return [*pieces, sentence] if sentence else pieces


def chunks(text: str) -> list[str]:
    """`text` as the pieces wetext reads one at a time: sentences, long ones cut (see _cut). The
    pieces joined are `text`."""
    pieces, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        if m.group().startswith(".") and _ABBREVIATION.search(text, max(0, m.start() - 12), m.start()):
            continue
        if m.end() > start:
            pieces.extend(_cut(text[start:m.end()]))
            start = m.end()
    return pieces + _cut(text[start:])


# a comma, semicolon, colon, question or exclamation mark before a space, and a sentence's last stops: marks
# wetext is not given, so that it can neither drop them (the comma after "March 3rd, 2024,", the stop after
# "Downing Street.") nor read across them
_PAUSE = re.compile(r"([,;:!?]+)(\s+)|([.!?]+)$")


def _spoken_piece(piece: str, language: str) -> str:
    """wetext's reading of a chunk, its pauses and final stop kept as written (English; Mandarin's are
    not spaced)."""
    if language != "en":
        return _wetext(piece, language)
    parts = _PAUSE.split(piece)  # text, marks, space, stop, text, ...
    return "".join(_wetext(p, language) if i % 4 == 0 and p.strip() else p or "" for i, p in enumerate(parts))


def locale_for(language: str, locale: str = "") -> str:
    """The locale a text of `language` is read in: `locale` where it is one of that language's, else the
    language's default (an en-GB voice's Mandarin rows are read as zh-CN)."""
    if locale in LOCALES and locale.startswith(language + "-"):
        return locale
    return DEFAULT_LOCALE.get(language, "")


# Han characters and full-width punctuation: what a Mandarin span is made of
_HAN = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]+")
_LATIN_WORD = re.compile(r"[A-Za-z]+")
# a lowercase word: what makes a Latin run inside Mandarin English speech ("then paid ... on") rather than a
# name read within the Mandarin (iPhone 15 Pro, Windows 11: 十五, 十一)
_ENGLISH_WORD = re.compile(r"\b[a-z]{2,}\b")
# a number at the end of an English run that the Han right after it counts (paid 1,000,000元): Mandarin's
_COUNTED_NUMBER = re.compile(r"[$€£¥]?\d[\d.,:/%-]*\s*$")


def _spans(text: str, language: str) -> list[tuple[str, str]]:
    """`text` as (piece, language) runs: in a Mandarin text a run of two or more English words, one of
    them a lowercase word, is English, and in an English text a run of Han is Mandarin; the rest is the
    text's language. The pieces join to `text`."""
    spans: list[tuple[str, str]] = []
    start = 0
    for m in _HAN.finditer(text):
        spans += _latin_spans(text[start:m.start()], language, before_han=True)
        spans.append((m.group(), "zh"))
        start = m.end()
    spans += _latin_spans(text[start:], language, before_han=False)
    merged: list[tuple[str, str]] = []
    for piece, lang in spans:
        if merged and merged[-1][1] == lang:
            merged[-1] = (merged[-1][0] + piece, lang)
        elif piece:
            merged.append((piece, lang))
    return merged


def _latin_spans(run: str, language: str, before_han: bool) -> list[tuple[str, str]]:
    if run and not _LATIN_WORD.search(run) and not any(c.isspace() for c in run):
        return [(run, "zh")]  # digits between Han characters are Mandarin's: 2024年3月5日
    if language == "en" or (len(_LATIN_WORD.findall(run)) >= 2 and _ENGLISH_WORD.search(run)):
        counted = _COUNTED_NUMBER.search(run) if before_han else None
        if counted and _LATIN_WORD.search(run, 0, counted.start()):
            return [(run[:counted.start()], "en"), (counted.group(), "zh")]
        return [(run, "en")]
    return [(run, language)]


def normalize_for_speech(text: str, language: str, locale: str = "") -> str:
    """`text` with its written forms (digits, symbols) spelled out as words of `language`, as a speaker
    of `locale` says them (locale_for); unchanged for a language without a grammar. An English span in
    a Mandarin text is read as English, and the reverse (_spans). Whitespace is collapsed as ingest
    does for every text."""
    if language not in NORMALIZED_LANGUAGES or not text:
        return text
    if _HAN.search(text) and _LATIN_WORD.search(text):
        spans = _spans(text, language)
        if len(spans) > 1:
            said = "".join(_spaced(piece, lambda t, lang=lang: _normalize_one(t, lang, locale))
                           for piece, lang in spans)
            return " ".join(said.split())
    return _normalize_one(text, language, locale)


def _spaced(piece: str, read) -> str:
    """`read` of `piece` with the spaces around it kept (they part a span from the next)."""
    core = piece.strip()
    if not core:
        return piece
    return piece[: len(piece) - len(piece.lstrip())] + read(core) + piece[len(piece.rstrip()):]


def _normalize_one(text: str, language: str, locale: str) -> str:
    """normalize_for_speech of a text in one language."""
    read = Read(lambda fragment: _wetext(fragment, language), locale_for(language, locale))
    written = apply(BEFORE[language], text, read)
    spoken = "".join(_spoken_piece(piece.rstrip(), language) + (" " if piece[-1:].isspace() else "")
                     for piece in chunks(written))
    spoken = apply(AFTER.get(language, ()), spoken, read)
    # wetext's output escapes quotes and backslashes (`\"`): as spoken, they are the characters themselves
    return " ".join(re.sub(r"\\(.)", r"\1", spoken).split())


def normalize_text(text: str) -> str:
    """Unicode NFC, whitespace stripped and collapsed to single spaces (every text, normalized or not)."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def spoken_form(text: str, language: str = "", locale: str = "") -> tuple[str, str]:
    """(`text` as it is spoken, its language): `language`, or "" for the one its script tells
    (language.py), read as a speaker of `locale` says it ("" or another language's: the language's
    default). What ingest trains on and what synthesize and the served model say."""
    text = normalize_text(text)
    language = language or detect_language(text)
    return normalize_for_speech(text, language, locale), language


# what a reading may have got wrong, to be proofread: a word with a stop inside a sentence (an abbreviation
# wetext and our rules kept as written: "Inc. is"), digits left as written, and a long digit string read as a
# quantity (an account number read as four thousand four hundred and seventy one)
_KEPT_ABBREVIATION = re.compile(r"(?<![\w.])[A-Za-z]{1,5}\.(?=\s+[a-z0-9])")
_LONG_NUMBER = re.compile(r"(?<![\d.,$€£₹¥])\d{4,}(?![\d]|[.,]\d)")
_QUANTITY = re.compile(r"\b(?:thousand|hundred)\b")


def unsure_readings(written: str, spoken: str) -> list[str]:
    """Why the reading of `written` as `spoken` is worth proofreading (empty when nothing is): each reason
    quotes the written token. The data report marks these rows."""
    unsure = [f"abbreviation kept: {m.group()}" for m in _KEPT_ABBREVIATION.finditer(spoken)]
    unsure += [f"digits kept: {m.group()}" for m in re.finditer(r"\d+", spoken)]
    if _QUANTITY.search(spoken):
        unsure += [f"digit string read as a number: {m.group()}" for m in _LONG_NUMBER.finditer(written)
                   if not (len(m.group()) == 4 and 1100 <= int(m.group()) < 2100)]  # a year reads as one
    return unsure
