"""Our corrections around wetext: regular expressions over the written form (before wetext reads it)
and over its spoken form (after), for the readings wetext gets wrong.

wetext's zh and en grammars (the ones VoxCPM uses) read most numbers right, but some wrongly enough
to teach a model the wrong words: 十二月两日 for 12月2日, 第两名 for 第2名, 十二点五零元 for
12.50元, 下午二点 for 下午2点; "twelve point five dollars" for $12.50, "the fifth of march" for
the en-US 3/5/2024. Each rule below names the written shape it matches and why; none names a single
case. tests/data/text_norm_zh.tsv and text_norm_en.tsv are the acceptance lists they are held to
(docs/data-quality.md, "Text normalization").

Most rules rewrite the written form into one wetext reads right (12.50元 → 12.5元), or read a number
themselves through `read`, wetext's own reading of a bare number (第200 → 第 + 两百 with 两 → 二). The
few `after` rules fix wetext's spoken English where the written form cannot steer it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

Read = Callable[[str], str]  # wetext's spoken form of a fragment, in the row's language


@dataclass(frozen=True)
class Rule:
    """One correction: where it applies, what it writes instead, and why (wetext's wrong reading)."""

    name: str
    pattern: re.Pattern[str]
    replace: Callable[[re.Match[str], Read], str]
    why: str


def _rule(name: str, pattern: str, replace: Callable[[re.Match[str], Read], str] | str, why: str) -> Rule:
    fn = replace if callable(replace) else (lambda m, _read, s=replace: m.expand(s))
    return Rule(name, re.compile(pattern), fn, why)


def apply(rules: tuple[Rule, ...], text: str, read: Read) -> str:
    """The rules in order over `text`, each over what the ones before wrote: one regex pass each, so
    the cost is linear in the length."""
    for rule in rules:
        text = rule.pattern.sub(lambda m, r=rule: r.replace(m, read), text)
    return text


# ---- Mandarin ------------------------------------------------------------------------------------

_NOT_IN_NUMBER = r"(?<![\d.,])"  # a number starts here: no digit, decimal point or separator before
_ZH_MONEY_UNIT = r"[万亿]?(?:元|块|美元|欧元|英镑|日元|港元|港币|人民币)"


def _zh_er(m: re.Match[str], read: Read) -> str:
    """The number read with 二 throughout (ordinals, days, quarters): 第二百, 二日, not 两."""
    return read(str(int(m.group("n")))).replace("两", "二")


def _zh_money(m: re.Match[str], _read: Read) -> str:
    if not (m.group("sym") or m.group("unit")):
        return m.group()  # a plain decimal: its zeros may be significant (1.50米 is read as written)
    frac = m.group("frac").rstrip("0")
    return f"{m.group('sym') or ''}{m.group('int')}{'.' + frac if frac else ''}{m.group('unit') or ''}"


_ZH_DIGITS = "零一二三四五六七八九"


ZH_BEFORE = (
    _rule("zh_code_hyphen", r"(?<=[A-Za-z])-(?=\d)", "",
          "F-16, COVID-19, H-1B: a hyphen after letters joins a code (wetext: F负十六, a minus)"),
    _rule("zh_clock_zero", r"(?<![\d:])0:(?=\d\d(?!\d))", "00:",
          "0:30 is 零点三十分 (wetext reads a 0 hour as a score, 零比三十; 00:30 it reads right)"),
    _rule("zh_room", _NOT_IN_NUMBER + r"(\d{3,4})(?=\s*(?:室|房间|号房))",
          lambda m, _: "".join(_ZH_DIGITS[int(d)] for d in m.group(1)),
          "202室, 1101房间: a room number is said digit by digit, 二零二室 (wetext: 两百零二室)"),
    _rule("zh_thousands", _NOT_IN_NUMBER + r"(\d{1,3}(?:,\d{3})+)(?![\d,])",
          lambda m, _: m.group(1).replace(",", ""),
          "1,234,567: wetext reads each group apart (一,两百三十四,…); the digits alone read as one number"),
    _rule("zh_money_zeros",
          r"(?P<sym>[$¥￥€£]\s*)?(?P<int>\d+)\.(?P<frac>\d+)(?P<unit>\s*" + _ZH_MONEY_UNIT + ")?", _zh_money,
          "12.50元, ¥3.00: a price's trailing zeros are not said (十二点五元, 三元; wetext: 十二点五零元)"),
    _rule("zh_percent_range", r"(\d+(?:\.\d+)?)\s*[-~～–—至到]\s*(\d+(?:\.\d+)?)\s*[%％]", r"\1%到\2%",
          "10-20%: wetext reads it as a date (十月二日百分之零); it is 百分之十到百分之二十"),
    _rule("zh_ordinal", r"第\s*(?P<n>\d+)(?![\d.])", lambda m, read: "第" + _zh_er(m, read),
          "第2名, 第200位: an ordinal counts with 二 (第二名); wetext reads 两 before measure words"),
    _rule("zh_day", _NOT_IN_NUMBER + r"(?P<n>\d{1,2})(?=\s*(?:日(?!游)|号))", _zh_er,
          "12月2日, 2号, 02日: a day of the month is 二日 (wetext: 两日, 零两日); 2日游 is a span, 两日游"),
    _rule("zh_numbered", _NOT_IN_NUMBER + r"(?P<n>\d+)(?=\s*(?:季度|单元|次方|次元))", _zh_er,
          "2季度, 2单元, 2次方: a number that names (the second quarter, unit 2, the square) is 二 "
          "(wetext: 两季度, 两单元; our zh_liang would make 两次方)"),
    _rule("zh_liang", _NOT_IN_NUMBER + r"2(?=\s*(?:点|次|倍|遍|份|种|台|项|句|间|门|节|届|年(?!级|代)))",
          "两", "下午2点, 2次, 2倍, 2年: a count of two is 两 before these measure words too (wetext: 二); "
          "2年级 and 二号, 二楼, 二月 stay 二"),
)


# ---- English -------------------------------------------------------------------------------------

_MONTHS = ("january|february|march|april|may|june|july|august|september|october|november|december")
_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
             "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth")
_UNITS = "one|two|three|four|five|six|seven|eight|nine"
_TEENS = "ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen"
_CURRENCY = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
             "£": ("pound", "pounds", "penny", "pence")}
_SCALE = r"\s*(?:thousand|million|billion|trillion|[kKmMbB]n?)\b"
_EN_WHOLE = r"\d{1,3}(?:,\d{3})+|\d+"  # a whole number, with or without thousands separators


def _en_written(n: int) -> str:
    """A whole number written as wetext reads it as a cardinal, not a year: it reads 1,234 without the
    "one" and a bare 1234 as a year (twelve thirty four)."""
    if 1000 <= n < 2000:
        return "one thousand" + (f" {n - 1000}" if n % 1000 else "")
    return f"{n:,}" if n >= 1000 else str(n)


def _en_money(m: re.Match[str], _read: Read) -> str:
    one, many, sub_one, sub_many = _CURRENCY[m.group("sym")]
    whole = int(m.group("int").replace(",", ""))
    sub = int((m.group("frac") or "").ljust(2, "0"))
    parts = [f"{_en_written(whole)} {one if whole == 1 else many}"] if whole or not sub else []
    if sub:
        parts.append(f"{sub} {sub_one if sub == 1 else sub_many}")
    return " and ".join(parts)


def _en_money_range(m: re.Match[str], _read: Read) -> str:
    low, high = (_en_written(int(m.group(k).replace(",", ""))) for k in ("a", "b"))
    return f"{low} to {high} {_CURRENCY[m.group('sym')][1]}"


def _en_decade(m: re.Match[str], read: Read) -> str:
    words = read(m.group("year"))
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


EN_BEFORE = (
    _rule("en_number_sign", r"(?:#|\bNo\.)\s?(?=\d)", "number ",
          "#1, No. 5: wetext fails on # and reads No. as 'Number.'"),
    _rule("en_money_range", rf"(?P<sym>[$€£])\s?(?P<a>{_EN_WHOLE})\s*[-–]\s*(?:[$€£]\s?)?(?P<b>{_EN_WHOLE})"
          rf"(?!\d|[.,]\d|{_SCALE})", _en_money_range,
          "$5-$10, $5-10: five to ten dollars (wetext: dollar five-dollar ten)"),
    _rule("en_money_thousands", r"(?P<sym>[$€£])\s?(?P<n>\d+(?:\.\d+)?)\s?[kK]\b",
          lambda m, _: f"{m.group('n')} thousand {_CURRENCY[m.group('sym')][1]}",
          "$50k is fifty thousand dollars (wetext: dollar fifty k; $2.5M and $3bn it reads right)"),
    _rule("en_money",
          rf"(?P<sym>[$€£])\s?(?P<int>{_EN_WHOLE})(?:\.(?P<frac>\d{{1,2}}))?(?!\d|[.,]\d|{_SCALE})",
          _en_money, "$12.50 is twelve dollars and fifty cents (wetext: twelve point five dollars), $0.99 "
          "ninety nine cents; $2.5 million stays wetext's"),
    _rule("en_thousands", _NOT_IN_NUMBER + r"(\d{1,3}(?:,\d{3})+)(?![\d,])",
          lambda m, _: _en_written(int(m.group(1).replace(",", ""))),
          "1,234: wetext drops the 'one' of one thousand"),
    _rule("en_year_range", r"(?<![\d,.])(1[1-9]\d\d|20\d\d)\s*[-–]\s*(1[1-9]\d\d|20\d\d)(?![\d,.]\d)",
          r"\1 to \2",
          "2020-2024 is twenty twenty to twenty twenty four (wetext reads a range as cardinals: two thousand "
          "and twenty to ...)"),
    _rule("en_percent_range", r"(\d+(?:\.\d+)?)\s*[-–]\s*(\d+(?:\.\d+)?)\s*%", r"\1 to \2%",
          "10-20% is ten to twenty percent (wetext: ten-twenty)"),
    _rule("en_decade", r"(?<![\w'])(?P<year>1[1-9]\d0|20\d0)'?s\b", _en_decade,
          "the 1990s is the nineteen nineties (wetext: one thousand nine hundred and ninety seconds)"),
)
EN_AFTER = (
    _rule("en_month_first", rf"\bthe ((?:(?:twenty|thirty) )?(?:{_ORDINALS})) of ({_MONTHS})\b", r"\2 \1",
          "en-US says dates month first: 3/5/2024 is march fifth (wetext: the fifth of march)"),
    _rule("en_year_oh", rf"\b({_TEENS}) zero ({_UNITS})\b", r"\1 oh \2",
          "1905 is nineteen oh five (wetext: nineteen zero five)"),
    _rule("en_ten_hundred", r"\bten hundred\b", "one thousand",
          "a bare 1000 is one thousand, which nobody says as ten hundred (wetext reads it as a year)"),
)

BEFORE = {"zh": ZH_BEFORE, "en": EN_BEFORE}
AFTER = {"en": EN_AFTER}  # wetext's Mandarin needs no correction after it once its input is steered
