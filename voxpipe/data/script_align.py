"""Comparing what was heard with what was written: CER between two transcripts (ingest.asr_second), and a
user's script aligned to a recording's clips (`align_script`).

Both compare characters after `comparable`: lower case, punctuation gone, one space between words (none
at all in Chinese, Japanese or Korean text, whose characters are the units). Edit distances are
Levenshtein's; nothing here loads a model.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np

from voxpipe.errors import StepError

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


SENTENCE_END = ".!?。！？;；"
MIN_MATCH = 0.5  # a span matching its clip's transcript less (1 - CER) is marked needs_review
RATE_RATIO = 1.6  # a span read this much faster or slower than the recording's median is marked
# script text between two clips' spans at most this share of the shorter span is split, not unread
SHORT_GAP = 0.35


@dataclass(frozen=True)
class Aligned:
    """One clip's part of the script: `text` (as written, whole words) at script[start:end], how well it
    matches what was heard (`match`: 1 - CER, at least 0), and why it needs a look, if it does."""

    text: str
    start: int
    end: int
    match: float
    needs_review: bool
    reason: str | None
    unread_before: str = ""  # script text before this span that no clip matched (a sentence not read)


def _comparable_map(text: str, language: str) -> tuple[str, list[int]]:
    """`comparable(text)` with, for each of its characters, the offset in `text` it comes from."""
    out: list[str] = []
    where: list[int] = []
    spaceless = language in SPACELESS
    for i, ch in enumerate(text):
        if unicodedata.category(ch)[0] in "PSZC":
            if not spaceless and out and out[-1] != " ":
                out.append(" ")
                where.append(i)
            continue
        for c in ch.casefold():
            out.append(c)
            where.append(i)
    while out and out[-1] == " ":
        out.pop()
        where.pop()
    return "".join(out), where


def _word_bounds(script: str, start: int, end: int, language: str) -> tuple[int, int]:
    """[start, end) widened to whole words of the script (in a spaceless language: as it is)."""
    if language in SPACELESS:
        return start, end
    while start > 0 and not script[start - 1].isspace():
        start -= 1
    while end < len(script) and not script[end].isspace():
        end += 1
    return start, end


def align_script(script: str, heard: list[str], seconds: list[float] | None = None, language: str = "en"
                 ) -> list[Aligned]:
    """Align a recording's script (the text as read, one string) to its clips' transcripts, in order.

    Stable signature (ingest's segmenting calls it once per recording): `heard` holds one recogniser
    transcript per clip, in recording order; `seconds` each clip's length (optional, and what makes it
    robust); the result holds one `Aligned` per clip, in the same order. Pure: no model, no file.

    1. The transcripts, joined, are aligned to the script character by character (an edit-distance
       alignment of the `comparable` forms, monotone, so clips keep their order; the script's start and
       end cost END_SKIP a character to leave out): each clip is placed where its characters fall.
    2. Without `seconds`, each clip takes the script between its first and last characters, its edges
       moved to sentence ends (a cut at a pause usually falls at one) or word edges (`_close_gaps`).
    3. With `seconds`, every span is chosen at once over the sentence and phrase ends (`_by_sentences`):
       a steady reader's rate (characters per second) matters most, then where the recogniser placed
       the clip; a clip may read nothing (not in the script) and sentences may go unread (not read).
       On the sample's espeak clips, which pocketsphinx mostly mishears, this places every clip of a
       recording, a sentence left out or one added; a script shorter than the recording is the weak case.

    A clip is marked needs_review, with the reason, when its span matches its transcript less than
    MIN_MATCH (1 - CER; with a weak recogniser that is most clips), when it reads no script text, and,
    given `seconds`, when its span is read more than RATE_RATIO times faster or slower than the
    recording's median. `unread_before` holds the script text just before a span that no clip read; the
    script after the last span was not read either.
    """
    target, where = _comparable_map(script, language)
    pieces = [comparable(h, language) for h in heard]
    joiner = "" if language in SPACELESS else " "
    joined, owner = "", []
    for k, piece in enumerate(pieces):
        if joined and piece:
            joined += joiner
            owner += [-1] * len(joiner)
        joined += piece
        owner += [k] * len(piece)
    hits: dict[int, list[int]] = {}  # clip -> script (target) positions its characters align to
    for j, i in enumerate(_aligned_positions(target, joined, END_SKIP)):
        if i is not None and owner[j] >= 0 and joined[j] != " ":
            hits.setdefault(owner[j], []).append(i)
    spans: list[tuple[int, int] | None] = []
    for k in range(len(heard)):
        found = hits.get(k, [])
        if not found:
            spans.append(None)
            continue
        start, end = _word_bounds(script, where[min(found)], where[max(found)] + 1, language)
        spans.append((start, end))
    heard_at = spans  # where the recogniser's words alone place each clip
    spans = _close_gaps(script, spans)
    if seconds:
        spans = _by_sentences(script, heard_at, _by_rate(script, spans, seconds), seconds)
    rates = [(e - s) / seconds[k] for k, span in enumerate(spans) if span and seconds and seconds[k] > 0
             for s, e in [span]]
    median = float(np.median(rates)) if rates else None
    out = []
    cursor = 0
    for k, span in enumerate(spans):
        if span is None:
            out.append(Aligned("", cursor, cursor, 0.0, True, "no script text matches what was heard "
                               f"({heard[k][:80]!r}): a sentence not in the script, or misheard"))
            continue
        start, end = span
        text = script[start:end].strip()
        match = round(max(0.0, 1.0 - cer(text, heard[k], language)), 4)
        reasons = [] if match >= MIN_MATCH else [f"the span matches what was heard {match:.2f} < {MIN_MATCH} "
                                                 "(1 - CER)"]
        if median and seconds and seconds[k] > 0:
            rate = (end - start) / seconds[k]
            if not median / RATE_RATIO <= rate <= median * RATE_RATIO:
                reasons.append(f"read at {rate:.1f} characters/s, the recording's median {median:.1f}: the "
                               "span may hold a neighbour's words or miss its own")
        out.append(Aligned(text, start, end, match, bool(reasons), "; ".join(reasons) or None,
                           script[cursor:start].strip()))
        cursor = end
    return out


MAX_CELLS = 300_000_000  # script x transcript characters one alignment may hold (bytes): ~20 minutes each
END_SKIP = 0.7  # the character alignment's cost of a script character before or after all it aligns
UNREAD = 1.0  # cost of a sentence of the script no clip reads, between two clips
UNREAD_END = 0.3  # before the first clip or after the last: a script that goes on past the recording
EXTRA = 1.5  # cost of a clip that reads nothing of the script
PHRASE = 0.3  # cost of an edge at a comma, not a sentence's end
RATE = 3.0  # weight of a span's reading rate's distance from the median (log ratio): a steady reader's
# rate is the surest sign, whatever the recogniser heard
PLACE = 0.25  # weight of a span's distance from where the recogniser's words put it (per its length)
MAX_UNITS = 6  # the most sentences and phrases one clip may read


def _units(script: str) -> list[tuple[int, float]]:
    """Where a clip may start or end: (offset, cost) at each sentence end (0) and phrase end (PHRASE)."""
    ends = {c: 0.0 for c in _sentence_cuts(script)}
    for i, ch in enumerate(script):
        if ch in ",;:，、；：" and i + 1 < len(script) and script[i + 1].isspace():
            j = i + 1
            while j < len(script) and script[j].isspace():
                j += 1
            ends.setdefault(j, PHRASE)
    return sorted(ends.items())


def _by_sentences(script: str, heard_at: list[tuple[int, int] | None], spans: list[tuple[int, int] | None],
                  seconds: list[float]) -> list[tuple[int, int] | None]:
    """Every clip's span chosen at once: a dynamic programme over the clips in order and the sentence
    and phrase ends of the script, each clip reading a run of whole sentences (or phrases) or nothing,
    unread sentences allowed between them. A span costs its reading rate's distance from the median
    (`_misfit`, times RATE), its distance from where the recogniser's words placed it, and PHRASE at a
    comma edge; an unread sentence costs UNREAD (UNREAD_END at the script's ends), a clip reading nothing
    EXTRA."""
    rates = [(e - s) / seconds[k] for k, span in enumerate(spans) if span and seconds[k] > 0
             for s, e in [span]]
    if not rates or any(t <= 0 for t in seconds):
        return spans
    median = float(np.median(rates))
    units = _units(script)
    offsets = [u for u, _ in units]
    size = len(units)
    inf = float("inf")
    cost = [UNREAD_END * i for i in range(size)]  # before any clip: the script's start unread
    back: list[list[tuple[int, int]]] = []  # per clip, per end unit: (previous end unit, start unit)
    for k, span in enumerate(heard_at):
        new, how = [inf] * size, [(-1, -1)] * size
        for prev in range(size):
            if cost[prev] == inf:
                continue
            if cost[prev] + EXTRA < new[prev]:  # this clip reads nothing
                new[prev], how[prev] = cost[prev] + EXTRA, (prev, prev)
            for first in range(prev, min(size, prev + MAX_UNITS)):
                skipped = cost[prev] + UNREAD * sum(1 for u in units[prev:first] if u[1] == 0.0)
                for last in range(first + 1, min(size, first + MAX_UNITS + 1)):
                    a, b = offsets[first], offsets[last]
                    place = 0.0 if span is None else min(2.0, (abs(a - span[0]) + abs(b - span[1])) / (b - a))
                    total = (skipped + RATE * _misfit(b - a, seconds[k], median) + PLACE * place
                             + units[first][1] + units[last][1])
                    if total < new[last]:
                        new[last], how[last] = total, (prev, first)
        cost = new
        back.append(how)
    end = min(range(size), key=lambda u: cost[u] + UNREAD_END * (size - 1 - u))
    out: list[tuple[int, int] | None] = [None] * len(spans)
    for k in range(len(spans) - 1, -1, -1):
        prev, first = back[k][end]
        out[k] = None if first == end else (offsets[first], offsets[end])
        end = prev
    return out


def _misfit(chars: int, seconds: float, median: float) -> float:
    """How far a span's reading rate is from the median, as a log ratio (either way counts the same)."""
    return abs(float(np.log(max(chars, 1) / seconds / median)))


def _by_rate(script: str, spans: list[tuple[int, int] | None], seconds: list[float]
             ) -> list[tuple[int, int] | None]:
    """Each cut two clips share moved to the sentence end between them that brings both closest to the
    recording's median reading rate (characters per second), twice over: where the recogniser heard too
    little to place a cut, the clips' lengths still tell where it falls."""
    out = list(spans)
    cuts = _sentence_cuts(script)
    for _ in range(2):
        rates = [(e - s) / seconds[k] for k, span in enumerate(out) if span and seconds[k] > 0
                 for s, e in [span]]
        if not rates:
            return out
        median = float(np.median(rates))
        placed = [k for k, span in enumerate(out) if span is not None and seconds[k] > 0]
        for a, b in zip(placed, placed[1:], strict=False):
            (s0, e0), (s1, e1) = out[a], out[b]
            if e0 != s1:  # not one shared cut: text between them was not read
                continue
            inside = [c for c in cuts if s0 < c < e1]
            if inside:
                best = min(inside, key=lambda c, a=a, b=b, s0=s0, e1=e1, m=median:
                           _misfit(c - s0, seconds[a], m) + _misfit(e1 - c, seconds[b], m))
                out[a], out[b] = (s0, best), (best, e1)
    return out


def _aligned_positions(target: str, joined: str, skip: float = 1.0) -> list[int | None]:
    """For each character of `joined`, the position in `target` it is aligned to (None: inserted), by
    edit-distance alignment that may skip the target's start and end for free (a script read in part).
    One numpy row per target character (the row's left-to-right dependency is a running minimum); the
    directions take len(target) x len(joined) bytes."""
    n, m = len(target), len(joined)
    if not n or not m:
        return [None] * m
    if n * m > MAX_CELLS:
        raise StepError(f"a script of {n} characters against {m} characters heard is too long to align at "
                        f"once (the alignment holds {n * m / 1e6:.0f} MB, more than {MAX_CELLS / 1e6:.0f}): "
                        "give each recording of about 20 minutes or less a script of its own")
    hyp = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
    ref = np.frombuffer(target.encode("utf-32-le"), dtype=np.uint32)
    steps = np.arange(m + 1, dtype=np.int64)
    steps = steps.astype(np.float64)
    row = steps.copy()  # aligning nothing of the target with joined[:j]: j insertions
    moves = np.empty((n, m + 1), dtype=np.uint8)  # 0 diagonal, 1 up (skip a target char), 2 left (insert)
    best_end, best_cost = 0, float(row[m] + n * skip)
    for i in range(1, n + 1):
        diagonal = row[:-1] + (hyp != ref[i - 1])
        up = row[1:] + 1
        from_above = np.concatenate(([i * skip], np.minimum(diagonal, up)))
        new = np.minimum.accumulate(from_above - steps) + steps
        moves[i - 1] = np.where(new < from_above, 2, np.concatenate(([1], np.where(diagonal <= up, 0, 1))))
        row = new
        if row[m] + (n - i) * skip < best_cost:  # the target's end skipped at `skip` a character
            best_end, best_cost = i, float(row[m] + (n - i) * skip)
    out: list[int | None] = [None] * m
    i, j = best_end, m
    while j > 0 and i > 0:
        move = moves[i - 1, j]
        if move == 0:
            out[j - 1] = i - 1
            i, j = i - 1, j - 1
        elif move == 1:
            i -= 1
        else:
            j -= 1
    return out


def _sentence_cuts(script: str) -> list[int]:
    """Offsets where a sentence ends (after its stop and the spaces that follow), the script's ends too."""
    cuts = {0, len(script)}
    for i, ch in enumerate(script):
        if ch in SENTENCE_END:
            j = i + 1
            while j < len(script) and script[j].isspace():
                j += 1
            cuts.add(j)
    return sorted(cuts)


def _nearest(cuts: list[int], at: float, low: float, high: float) -> int | None:
    inside = [c for c in cuts if low <= c <= high]
    return min(inside, key=lambda c: abs(c - at)) if inside else None


def _word_cut(script: str, at: int) -> int:
    """`at` moved to the start of the word it falls in (after the spaces before it)."""
    at = max(0, min(at, len(script)))
    while 0 < at < len(script) and not script[at - 1].isspace():
        at -= 1
    return at


def _close_gaps(script: str, spans: list[tuple[int, int] | None]) -> list[tuple[int, int] | None]:
    """Each clip's span from its aligned characters' extent, its edges moved to where sentences end (a cut
    at a pause usually falls there) when one is within half the span's length, else to a word's edge.
    Two clips whose spans nearly meet share one cut; a long stretch between them is unread."""
    out = list(spans)
    cuts = _sentence_cuts(script)
    placed = [k for k, s in enumerate(out) if s is not None]
    if not placed:
        return out
    first, last = out[placed[0]], out[placed[-1]]
    reach = lambda span: 0.5 * (span[1] - span[0])  # noqa: E731
    start = _nearest(cuts, first[0], first[0] - reach(first), first[0] + reach(first))
    out[placed[0]] = (start if start is not None else _word_cut(script, first[0]), first[1])
    end = _nearest(cuts, last[1], last[1] - reach(last), last[1] + reach(last))
    out[placed[-1]] = (out[placed[-1]][0], end if end is not None else last[1])
    for a, b in zip(placed, placed[1:], strict=False):
        (s0, e0), (s1, e1) = out[a], out[b]
        gap = max(0, s1 - e0)
        if gap > SHORT_GAP * min(e0 - s0, e1 - s1) and script[e0:s1].strip():  # text no clip read
            end = _nearest(cuts, e0, e0 - reach((s0, e0)), e0 + gap / 2)
            start = _nearest(cuts, s1, s1 - gap / 2, s1 + reach((s1, e1)))
            out[a] = (s0, end if end is not None else e0)
            out[b] = (start if start is not None else _word_cut(script, s1), e1)
            continue
        middle = (e0 + s1) / 2
        cut = _nearest(cuts, middle, (s0 + e0) / 2, (s1 + e1) / 2)  # between the two spans' centres
        cut = cut if cut is not None else _word_cut(script, round(middle))
        out[a], out[b] = (s0, max(s0, cut)), (min(cut, e1), e1)
    return out
