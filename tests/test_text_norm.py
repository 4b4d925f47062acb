"""Text normalization (voxpipe/data/text_norm.py, text_rules.py): the hand-written acceptance lists
(tests/data/text_norm_{zh,en}.tsv, what a native speaker of the row's locale says), every correction rule
needed by one of them, and long texts read in chunks with the same result as sentence by sentence."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from voxpipe.data import text_norm
from voxpipe.data.text_norm import (
    MAX_CHUNK_CHARS,
    chunks,
    locale_for,
    normalize_for_speech,
    spoken_form,
    unsure_readings,
)
from voxpipe.data.text_rules import AFTER, BEFORE
from voxpipe.errors import StepError
from voxpipe.params import load_params

DATA = Path(__file__).parent / "data"


def _cases(language: str) -> list[tuple[str, str, str, str]]:
    """(written, spoken, kind, locale): the locale column is optional, empty for the language's default."""
    with open(DATA / f"text_norm_{language}.tsv", encoding="utf-8", newline="") as f:
        rows = [r for r in csv.reader((line for line in f if not line.startswith("#")), delimiter="\t")]
    assert rows[0][:3] == ["written", "spoken", "kind"]
    return [(r[0], r[1], r[2], r[3] if len(r) > 3 else "") for r in rows[1:]]


CASES = {language: _cases(language) for language in ("zh", "en")}


def _id(case: tuple[str, str, str, str]) -> str:
    return case[0] + (f" [{case[3]}]" if case[3] else "")


def test_the_lists_are_long_enough_and_cover_every_kind():
    assert len(CASES["zh"]) >= 90 and len(CASES["en"]) >= 250
    kinds = {"date", "time", "money", "percent", "phone", "ordinal", "measure", "decimal", "year", "range",
             "unit", "digits"}
    assert kinds <= {c[2] for c in CASES["zh"]}
    en_kinds = {"number", "digits", "phone", "decimal", "version", "unit", "money", "date", "time", "year",
                "ordinal", "fraction", "percent", "multiplier", "roman", "electronic", "abbreviation",
                "punctuation"}
    assert en_kinds <= {c[2] for c in CASES["en"]}
    assert {"en-GB"} <= {c[3] for c in CASES["en"]}


@pytest.mark.parametrize(("written", "spoken", "kind", "locale"), CASES["zh"], ids=map(_id, CASES["zh"]))
def test_mandarin_is_read_as_spoken(written, spoken, kind, locale):
    assert normalize_for_speech(written, "zh", locale) == spoken


@pytest.mark.parametrize(("written", "spoken", "kind", "locale"), CASES["en"], ids=map(_id, CASES["en"]))
def test_english_is_read_as_spoken(written, spoken, kind, locale):
    assert normalize_for_speech(written, "en", locale) == spoken


def test_the_issue_cases():
    """The readings issues 28 and 42 reported wrong, as the acceptance lists hold them."""
    zh = {w: s for w, s, _, _ in CASES["zh"]}
    assert zh["2026年12月2日"].endswith("十二月二日") and zh["第2名"] == "第二名"
    assert zh["12.50元"] == "十二点五元" and zh["下午2点"] == "下午两点"
    assert zh["房间号码是305"] == "房间号码是三零五"
    en = {(w, loc): s for w, s, _, loc in CASES["en"]}
    assert en["$12.50", ""] == "twelve dollars and fifty cents"
    assert en["3/5/2024", ""].startswith("March fifth")
    assert en["Version 2.4.1 of the firmware", ""] == "Version two point four point one of the firmware"
    assert "two point four meters across" in en["The telescope's mirror is 2.4 m across.", ""]
    assert en["account ending in 4471", ""] == "account ending in four four seven one"
    phone = "oh one six one, four nine six, oh seven three one"
    assert en["My phone number is 0161 496 0731", ""].endswith(phone)
    assert "Baker Street, flat three B." in en["Mr. O'Neill lives at 221 Baker St., flat 3B.", ""]
    assert en["On March 3rd, 2024, the ferry left.", ""].startswith("On March third, twenty twenty four, the")
    said = en["Dr. Whitcombe will see you on Tues. at 9:45 a.m.", ""]
    assert said.endswith("on Tuesday at nine forty five AM.")
    assert en["12/05/2026", "en-GB"] == "the twelfth of May twenty twenty six"


def test_the_locale_is_the_language_s_own():
    """An en-GB voice's Mandarin rows read as zh-CN; an unknown or empty locale is the language's default."""
    assert locale_for("en", "en-GB") == "en-GB" and locale_for("en", "") == "en-US"
    assert locale_for("zh", "en-GB") == "zh-CN" and locale_for("en", "fr-FR") == "en-US"
    said = ("Meet on the twelfth of May twenty twenty six.", "en")
    assert spoken_form("Meet on 12/05/2026.", "", "en-GB") == said
    assert spoken_form("2026年12月2日", "", "en-GB")[0] == "二零二六年十二月二日"


@pytest.mark.parametrize("language", ["zh", "en"])
def test_every_rule_is_needed_by_a_listed_case(language, monkeypatch):
    """Without any one rule, some case of the list reads wrong: no rule is dead, none is untested."""
    rules = [("before", r) for r in BEFORE[language]] + [("after", r) for r in AFTER.get(language, ())]
    assert rules
    for where, rule in rules:
        table = BEFORE if where == "before" else AFTER
        with monkeypatch.context() as m:
            m.setitem(table, language, tuple(r for r in table[language] if r is not rule))
            # the first case that reads wrong without it is enough
            wrong = any(normalize_for_speech(w, language, loc) != s for w, s, _, loc in CASES[language])
        assert wrong, f"{rule.name} ({rule.why}): no listed case needs it"


def test_other_languages_keep_their_text():
    assert normalize_for_speech("Il a payé 12,50 € le 3/5/2024.", "fr") == "Il a payé 12,50 € le 3/5/2024."


def test_a_long_text_is_read_sentence_by_sentence(monkeypatch):
    """A long text reads as its sentences read one at a time, and wetext never sees more than a chunk:
    the cost grows with the length, not faster (wetext's own grows faster than linearly)."""
    seen: list[int] = []
    real = text_norm._wetext
    monkeypatch.setattr(text_norm, "_wetext", lambda text, lang: seen.append(len(text)) or real(text, lang))
    for language, sep in (("en", " "), ("zh", "")):
        sentences = [w for w, _, k, _ in CASES[language] if k == "sentence"] * 20
        text = sep.join(sentences)
        assert len(text) > 1500
        one_by_one = sep.join(normalize_for_speech(s, language) for s in sentences)
        assert normalize_for_speech(text, language) == one_by_one
    assert max(seen) <= MAX_CHUNK_CHARS and len(seen) >= 4 * 20


def test_chunks_join_to_the_text_and_cut_long_sentences_between_words():
    words = " ".join(["It costs $1,234.56 and rose 10-20% on 3/5/2024"] * 60)  # one 2,900-character sentence
    pieces = chunks(words)
    assert "".join(pieces) == words and len(pieces) > 9
    assert all(len(p) <= MAX_CHUNK_CHARS for p in pieces)
    assert all(p.endswith(" ") for p in pieces[:-1])  # cut after a space, never inside 1,234.56
    assert chunks("Dr. Smith paid $5. Then he left.") == ["Dr. Smith paid $5. ", "Then he left."]
    assert chunks("你好。今天2点见！好") == ["你好。", "今天2点见！", "好"]
    han = "二" * 700  # no space or comma anywhere: cut at the limit
    assert [len(p) for p in chunks(han)] == [300, 300, 100]
    number = "a" * 290 + "1234567,890.123"
    assert chunks(number) == ["a" * 290, "1234567,890.123"]  # not inside a number
    assert [len(p) for p in chunks("7" * 700)] == [300, 300, 100]  # digits only: cut anyway


def test_an_unknown_locale_is_refused_naming_the_key():
    with pytest.raises(StepError) as raised:
        load_params(None, ["ingest.locale=fr-FR"])
    assert "ingest.locale" in str(raised.value) and "en-GB" in str(raised.value)
    with pytest.raises(StepError) as raised:  # the mapping form: the wrong value named, in one line
        load_params(None, ["ingest.locale={spk_f: en-GB, spk_m: en-AU}"])
    assert "ingest.locale: Value error, 'en-AU' is not a locale" in str(raised.value)
    assert load_params(None, ["ingest.locale={spk_f: en-GB}"]).ingest.locale == {"spk_f": "en-GB"}


def test_unsure_readings_name_what_to_proofread():
    """An abbreviation kept as written, digits left, a digit string read as a number; a year and a clean
    reading are not unsure."""
    written = "Acme Inc. is owed 55231 pounds in 1998."
    assert unsure_readings(written, normalize_for_speech(written, "en")) == [
        "abbreviation kept: Inc.", "digit string read as a number: 55231"]
    assert unsure_readings("x", "room 4B7") == ["digits kept: 4", "digits kept: 7"]
    assert unsure_readings("in 1998", "in nineteen ninety eight") == []
    assert unsure_readings("$1,200", "one thousand two hundred dollars") == []


def test_mixed_text_is_read_span_by_span():
    """An English span inside Mandarin is read as English (the issue's 十二月三日一千九百九十九分之一 was
    12/31/1999 read by the Mandarin grammar), Han inside English as Mandarin; a number counted by the Han
    after it (1,000,000元) is Mandarin's; the spans join to the text."""
    text = "他说 then paid 1,000,000元 on 12/31/1999 at 3:45pm. 然后就走了。"
    spans = text_norm._spans(text, "zh")
    assert "".join(piece for piece, _ in spans) == text
    assert [lang for _, lang in spans] == ["zh", "en", "zh", "en", "zh"]
    said = normalize_for_speech(text, "zh")
    assert "一百万元 on December thirty first nineteen ninety nine at three forty five PM." in said
    assert [lang for _, lang in text_norm._spans("She wrote 2024年3月5日 on it.", "en")] == ["en", "zh", "en"]
