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
`after` rules fix wetext's spoken English where the written form cannot steer it. A rule may hold in
some locales only (en_day_first in en-GB, en_month_first in en-US); `read.locale` tells the others
how the speaker says a 0 or a price.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

LOCALES = ("en-US", "en-GB", "zh-CN")


@dataclass(frozen=True)
class Read:
    """wetext's spoken form of a fragment in the row's language (`read(fragment)`), and the speaker's
    locale, which decides date order, spelling and how 0 is said in a digit string."""

    wetext: Callable[[str], str]
    locale: str = "en-US"

    def __call__(self, fragment: str) -> str:
        return self.wetext(fragment)


@dataclass(frozen=True)
class Rule:
    """One correction: where it applies, what it writes instead, why (wetext's wrong reading), and the
    locales it holds in (all when empty)."""

    name: str
    pattern: re.Pattern[str]
    replace: Callable[[re.Match[str], Read], str]
    why: str
    locales: tuple[str, ...] = ()


def _rule(name: str, pattern: str, replace: Callable[[re.Match[str], Read], str] | str, why: str,
          locales: tuple[str, ...] = ()) -> Rule:
    fn = replace if callable(replace) else (lambda m, _read, s=replace: m.expand(s))
    return Rule(name, re.compile(pattern), fn, why, locales)


def apply(rules: tuple[Rule, ...], text: str, read: Read) -> str:
    """The rules of `read.locale` in order over `text`, each over what the ones before wrote: one regex
    pass each, so the cost is linear in the length."""
    for rule in rules:
        if not rule.locales or read.locale in rule.locales:
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


def _zh_digit_string(m: re.Match[str], _read: Read) -> str:
    digits = _ZH_DIGITS if m.group("kw") in ("房间", "房号") else _ZH_DIGITS.replace("一", "幺")
    return m.group("kw") + (m.group("sep") or "") + "".join(digits[int(d)] for d in m.group("n"))


ZH_BEFORE = (
    _rule("zh_code_hyphen", r"(?<=[A-Za-z])-(?=\d)", "",
          "F-16, COVID-19, H-1B: a hyphen after letters joins a code (wetext: F负十六, a minus)"),
    _rule("zh_clock_zero", r"(?<![\d:])0:(?=\d\d(?!\d))", "00:",
          "0:30 is 零点三十分 (wetext reads a 0 hour as a score, 零比三十; 00:30 it reads right)"),
    _rule("zh_room", _NOT_IN_NUMBER + r"(\d{3,4})(?=\s*(?:室|房间|号房))",
          lambda m, _: "".join(_ZH_DIGITS[int(d)] for d in m.group(1)),
          "202室, 1101房间: a room number is said digit by digit, 二零二室 (wetext: 两百零二室)"),
    _rule("zh_digit_string", r"(?P<kw>号码|房间|房号|编号|账号|卡号|尾号|密码|验证码|工号|学号|单号|"
          r"QQ号|手机号|微信号)"
          r"(?P<sep>是|为|：|:)?\s*(?P<n>\d{3,})(?![\d.,])", _zh_digit_string,
          "房间号码是305, 编号为20231, 验证码4096: a number after these names is said digit by digit "
          "(wetext: 三百零五, 两万零二百三十一); a room's 1 is 一 as in 二零二室, a code's 幺 as in a phone "
          "number"),
    _rule("zh_fraction",
          r"(?P<pre>约\s*)?(?<![\d.,/])(?P<a>\d+)/(?P<b>\d+)(?![\d/])(?(pre)|(?=\s*[的以左之]))",
          lambda m, read: f"{m.group('pre') or ''}{read(m.group('b'))}分之{read(m.group('a'))}",
          "大约1/3人, 1/3的人: a fraction after 约 or before 的/以/左 is written out, 三分之一 (wetext moves "
          "the 约 inside: 大三分之约一); 12/25 alone, a date, stays wetext's"),
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
             "£": ("pound", "pounds", "penny", "pence"), "₹": ("rupee", "rupees", "paisa", "paise")}
_SYM = "[$€£₹]"
_SCALES = {"bn": "billion", "m": "million", "k": "thousand"}
_SCALE = r"\s*(?:thousand|million|billion|trillion|[kKmMbB]n?)\b"
_EN_WHOLE = r"\d{1,3}(?:,\d{3})+|\d+"  # a whole number, with or without thousands separators
_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# where a written stop that ends an abbreviation is also the sentence's: the text ends, or a sentence starts
_SENTENCE_GOES_ON = re.compile(r"\s*$|\s+[A-Z\"“]")


def _en_written(n: int) -> str:
    """A whole number written as wetext reads it as a cardinal, not a year: it reads 1,234 without the
    "one" and a bare 1234 as a year (twelve thirty four)."""
    if 1000 <= n < 2000:
        return "one thousand" + (f" {n - 1000}" if n % 1000 else "")
    return f"{n:,}" if n >= 1000 else str(n)


def _en_money(m: re.Match[str], read: Read) -> str:
    one, many, sub_one, sub_many = _CURRENCY[m.group("sym")]
    whole = int(m.group("int").replace(",", ""))
    sub = int((m.group("frac") or "").ljust(2, "0"))
    parts = [f"{_en_written(whole)} {one if whole == 1 else many}"] if whole or not sub else []
    if sub and whole and read.locale == "en-GB" and m.group("sym") == "£":
        return f"{parts[0]} {sub}"  # five pounds twenty five
    if sub:
        parts.append(f"{sub} {sub_one if sub == 1 else sub_many}")
    return " and ".join(parts)


def _en_money_range(m: re.Match[str], _read: Read) -> str:
    low, high = (_en_written(int(m.group(k).replace(",", ""))) for k in ("a", "b"))
    return f"{low} to {high} {_CURRENCY[m.group('sym')][1]}"


def _en_decade(m: re.Match[str], read: Read) -> str:
    words = read(m.group("year"))
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _digits(digits: str, zero: str) -> str:
    """A digit string said digit by digit, 0 as `zero` ("zero" or "oh")."""
    return " ".join(zero if d == "0" else _DIGIT_WORDS[int(d)] for d in digits)


def _zero(read: Read) -> str:
    return "oh" if read.locale == "en-GB" else "zero"


def _en_phone(m: re.Match[str], _read: Read) -> str:
    """Each group of a phone number digit by digit, 0 as "oh", the groups apart (a pause, a comma);
    800 of a toll-free number is "eight hundred"."""
    text = m.group("num") if "num" in m.re.groupindex else m.group()
    groups = re.findall(r"\d+", text)
    said = ["eight hundred" if g == "800" and i <= 1 else _digits(g, "oh") for i, g in enumerate(groups)]
    return ("plus " if text.startswith("+") else "") + ", ".join(said)


def _en_pairs(m: re.Match[str], read: Read) -> str:
    """A room or flight number in pairs from the right: 305 three oh five, 1534 fifteen thirty four."""
    return m.group("kw") + _pairs(m.group("n"), read)


def _pairs(n: str, read: Read) -> str:
    """A number of 2 to 4 digits read in pairs from the right: 05 oh five, 305 three oh five, 1200 twelve
    hundred."""
    head, pairs = {2: ("", [n]), 3: (n[0], [n[1:]])}.get(len(n), ("", [n[:2], n[2:]]))
    said = [read(head)] if head else []
    for i, pair in enumerate(pairs):
        if pair == "00" and i == len(pairs) - 1 and (head or i):
            said.append("hundred")
        else:
            said.append(("oh " + read(pair[1])) if pair[0] == "0" else read(pair))
    return " ".join(said)


def _en_version(m: re.Match[str], read: Read) -> str:
    """A version's parts are numbers of their own: 2.4.1 two point four point one, 3.10 three point ten."""
    parts = " point ".join("oh" if p == "0" else read(str(int(p))) for p in m.group("num").split("."))
    return ("version " if m.group("v") else m.group("kw") or "") + parts


_UNIT_WORDS = {"m/s": ("meter per second", "meters per second"), "m": ("meter", "meters"),
               "min": ("minute", "minutes"), "mins": ("minute", "minutes"),
               "in": ("inch", "inches"), "hr": ("hour", "hours"), "hrs": ("hour", "hours"),
               "sec": ("second", "seconds"), "secs": ("second", "seconds"), "L": ("liter", "liters"),
               "W": ("watt", "watts"), "V": ("volt", "volts"), "kWh": ("kilowatt hour", "kilowatt hours"),
               "tsp": ("teaspoon", "teaspoons"), "tbsp": ("tablespoon", "tablespoons"),
               "gal": ("gallon", "gallons"),
               "qt": ("quart", "quarts"), "yd": ("yard", "yards"), "yds": ("yard", "yards")}
# units wetext itself reads right as a quantity (5 km: five kilometers) but not as a modifier (a 10 km run)
_MODIFIER_UNITS = {"km": "kilometer", "cm": "centimeter", "mm": "millimeter", "kg": "kilogram", "g": "gram",
                   "ft": "foot", "mi": "mile", "lb": "pound", "oz": "ounce", "ml": "milliliter",
                   "mph": "mile per hour",
                   **{k: v[0] for k, v in _UNIT_WORDS.items() if k not in ("in", "m/s")}}
# words after a measurement that make it a quantity (5 m long, 10 km of road), not a modifier (a 10 km run)
_QUANTITY_WORDS = ("of|long|wide|tall|high|deep|thick|across|away|in|on|at|to|from|per|and|or|apart|ago|"
                   "later|each|behind|ahead|above|below|over|under|left|more|less|too|is|was|are|were")
# "in" is an inch only where a measurement ends: before a stop, or a word that says what was measured
_INCH_ENDS = r"(?=\s*(?:[.,;:!?)]|$)|\s(?:long|wide|tall|high|deep|thick|across|screen|display|monitor)\b)"


def _en_unit(m: re.Match[str], _read: Read) -> str:
    one, many = _UNIT_WORDS[m.group("unit")]
    return f"{m.group('n')} {one if m.group('n') == '1' else many}"


def _en_unit_modifier(m: re.Match[str], _read: Read) -> str:
    return f"{m.group('pre')}{m.group('n')} {_MODIFIER_UNITS[m.group('unit')]}"


# first names monarchs and popes share, after which a Roman numeral is an ordinal with no title before them
# (Henry VIII); after any other name (Rocky II, Final Fantasy VII) it is left as written
_REGNAL_NAMES = ("Henry|Edward|George|William|Charles|Richard|James|Louis|Elizabeth|Mary|Victoria|Anne|"
                 "John|Paul|"
                 "Benedict|Pius|Leo|Gregory|Clement|Innocent|Urban|Alexander|Nicholas|Peter|Catherine|Frederick|"
                 "Philip|Ferdinand|Napoleon|Ramesses|Ptolemy|Constantine|Otto|Wilhelm|Francis|Joseph|Gustav|"
                 "Christian|Felipe|Juan Carlos|Carlos|Alfonso|Isabella|Rama|Darius|Cyrus|Amenhotep|Thutmose|"
                 "David|Robert|Malcolm|Harold|Olaf|Haakon|Carl|Sixtus|Boniface|Innocent|Honorius")
_ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100}


def _roman(numeral: str) -> int:
    values = [_ROMAN[c] for c in numeral]
    return sum(-v if i + 1 < len(values) and v < values[i + 1] else v for i, v in enumerate(values))


def _ordinal_suffix(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _en_roman_count(m: re.Match[str], read: Read) -> str:
    return m.group("kw") + read(str(_roman(m.group("r"))))


def _en_roman_regnal(m: re.Match[str], read: Read) -> str:
    n = _roman(m.group("r"))
    return (m.group("title") or "") + m.group("name") + "the " + read(f"{n}{_ordinal_suffix(n)}")


# an abbreviation's words; a stop after those in _MAY_END is the sentence's too where the sentence ends there
_TITLES = {"Dr": "Doctor", "Mr": "Mister", "Mrs": "Missus", "Prof": "Professor", "Sen": "Senator",
           "Rep": "Representative", "Gen": "General", "Col": "Colonel", "Capt": "Captain", "Lt": "Lieutenant",
           "Sgt": "Sergeant", "Gov": "Governor", "Rev": "Reverend", "Mt": "Mount", "Ft": "Fort",
           "St": "Saint"}
_AFTER_NAME = {"St": "Street", "Ave": "Avenue", "Rd": "Road", "Blvd": "Boulevard", "Ln": "Lane",
               "Jr": "Junior", "Sr": "Senior"}
_DAYS = {"Mon": "Monday", "Tue": "Tuesday", "Tues": "Tuesday", "Wed": "Wednesday", "Thu": "Thursday",
         "Thur": "Thursday", "Thurs": "Thursday", "Fri": "Friday", "Sat": "Saturday", "Sun": "Sunday"}
_DAY = "(?:(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day|Mon|Tues?|Wed|Thu|Thurs|Fri|Sat|Sun)"  # a day's name
_MONTH_ABBREVIATIONS = {"Jan": "January", "Feb": "February", "Mar": "March", "Apr": "April", "Jun": "June",
                        "Jul": "July", "Aug": "August", "Sep": "September", "Sept": "September",
                        "Oct": "October", "Nov": "November", "Dec": "December"}
_LATIN = {"vs": "versus", "e.g": "for example", "i.e": "that is", "approx": "approximately", "cf": "compare",
          "a.k.a": "also known as", "dept": "department", "Dept": "Department", "Approx": "Approximately"}
_BEFORE_NUMBER = {"Fig": "Figure", "fig": "figure", "Vol": "Volume", "vol": "volume", "Ch": "Chapter",
                  "pp": "pages", "Eq": "Equation", "Apt": "Apartment", "Ex": "Exercise", "Sec": "Section",
                  "c": "circa", "ca": "circa", "ext": "extension", "Ext": "Extension"}
_ETC = {"etc": "et cetera"}


def _words(table: dict[str, str]) -> str:
    return "|".join(sorted(map(re.escape, table), key=len, reverse=True))


def _stop_kept(m: re.Match[str]) -> str:
    """The abbreviation's stop, where it also ends the sentence; nothing where the sentence goes on."""
    return "." if _SENTENCE_GOES_ON.match(m.string, m.end()) else ""


def _en_abbreviation(table: dict[str, str], may_end: bool):
    def replace(m: re.Match[str], _read: Read) -> str:
        return m.group("pre") + table[m.group("a")] + (_stop_kept(m) if may_end else "")
    return replace


def _en_initialism(m: re.Match[str], _read: Read) -> str:
    """U.S. is U S; its stop is the sentence's only where the text ends (J.K. Rowling: initials)."""
    return " ".join(m.group().replace(".", "")) + ("." if not m.string[m.end():].strip() else "")


def _en_am_pm(m: re.Match[str], _read: Read) -> str:
    return f" {m.group(1).lower()}m" + _stop_kept(m)


def _en_short_date(m: re.Match[str], read: Read) -> str:
    month, day = (m.group("b"), m.group("a")) if read.locale == "en-GB" else (m.group("a"), m.group("b"))
    if not (1 <= int(month) <= 12 and 1 <= int(day) <= 31):
        return m.group()
    name = _MONTHS.split("|")[int(month) - 1].capitalize()
    n = int(day)
    ordinal = read(f"{n}{_ordinal_suffix(n)}")
    return m.group("pre") + (f"the {ordinal} of {name}" if read.locale == "en-GB" else f"{name} {ordinal}")


def _en_may(m: re.Match[str], read: Read) -> str:
    n = int(m.group("a") or m.group("b"))
    if not 1 <= n <= 31:
        return m.group()
    ordinal = read(f"{n}{_ordinal_suffix(n)}")
    return f"the {ordinal} of May" if read.locale == "en-GB" else f"May {ordinal}"


def _en_slash_pair(m: re.Match[str], read: Read) -> str:
    a, b = m.group("a"), m.group("b")
    if "." in a:
        return f"{a} out of {b}"
    if int(a) >= int(b) > 0:
        return f"{read(a)} {read(b)}"
    return m.group()  # a fraction: wetext reads it (three quarters)


def _en_multiply(m: re.Match[str], read: Read) -> str:
    return f"{read(m.group(1))} by {read(m.group(2))}"


def _en_capital(m: re.Match[str], _read: Read) -> str:
    return m.group().capitalize()


def _metre(m: re.Match[str], _read: Read) -> str:
    return m.group(1) + m.group(2)[::-1] + m.group(3)


EN_BEFORE = (
    _rule("en_phone",
          r"\+\d{1,3}(?:[ -]\(?\d{1,6}\)?){2,6}(?!\d)"  # +44 20 7946 0958, +1 (415) 555-0199
          r"|(?<![\w+-])(?:1-)?(?:\(\d{3}\)\s?|\d{3}[-.])\d{3}[-.]\d{4}(?![\d-])"  # (555) 123-4567, 1-800-...
          r"|(?<![\w.,+-])(?:\(0\d{1,4}\)|0\d{2,4})(?: \d{3,6}){1,2}(?![\d.,]\d)"  # 0161 496 0731
          r"|(?<![\w.,+-])\d{3} \d{3} \d{4}(?![\d.,]\d)",  # 555 123 4567
          _en_phone, "a phone number is said digit by digit in its groups (wetext: oh one hundred and sixty "
          "one four hundred and ninety six, and +44 ... left as written)"),
    _rule("en_phone_local",
          r"(?P<kw>\b(?:[Cc]all|[Dd]ial|[Pp]hone|[Tt]ext|[Ff]ax|at|is) )(?P<num>\d{3}-\d{4})(?![\d-])",
          lambda m, read: m.group("kw") + _en_phone(m, read),
          "call 555-0199: a local number after call, dial, at (wetext: five hundred and fifty five-oh ...)"),
    _rule("en_number_sign", r"(?:#|\b[Nn]o\.)\s?(?=\d)", "number ",
          "#1, No. 5: wetext fails on # and reads No. as 'Number.'"),
    _rule("en_digit_string",
          r"(?P<kw>\b(?:ending in|ending|PIN|[Cc]ode|[Aa]ccount|[Cc]ard|[Ee]xtension|[Ee]xt\.|[Rr]eference|"
          r"[Nn]umber|[Cc]all|[Dd]ial)(?: is| was|:)? )(?P<n>\d{3,}(?: \d{3,})*)(?![\d,:/]|\.\d)",
          lambda m, read: m.group("kw").replace("xt.", "xtension")
          + ", ".join(_digits(g, _zero(read)) for g in m.group("n").split()),
          "an account, PIN, code or order number is said digit by digit (wetext: four thousand four hundred "
          "and seventy one); 0 is zero in en-US, oh in en-GB"),
    _rule("en_leading_zero", r"(?<![\w.,:/$€£₹-])0\d+(?![\d,:/]|\.\d)",
          lambda m, read: _digits(m.group(), _zero(read)),
          "a number written with a leading 0 (Batch 0042) is a digit string (wetext: oh oh forty two)"),
    _rule("en_room_flight",
          r"(?P<kw>\b(?:[Rr]oom|[Ff]light|[Gg]ate|[Ss]uite|[A-Z]{2}) )(?P<n>\d{3,4})(?![\d.,]\d)",
          _en_pairs, "room 305, flight 1534 and UA 857 are said in pairs, three oh five, fifteen thirty four "
          "(wetext: three hundred and five)"),
    _rule("en_money_range_scale", rf"(?P<sym>{_SYM})\s?(?P<a>\d+(?:\.\d+)?)\s*[-–]\s*(?:{_SYM}\s?)?"
          r"(?P<b>\d+(?:\.\d+)?)\s?(?P<scale>thousand|million|billion|trillion|bn|m|k)\b",
          lambda m, _: f"{m.group('a')} to {m.group('b')} {_SCALES.get(m.group('scale'), m.group('scale'))} "
          f"{_CURRENCY[m.group('sym')][1]}",
          "£3-4 million, $1-2bn: three to four million pounds (wetext: three pounds- four million)"),
    _rule("en_money_range", rf"(?P<sym>{_SYM})\s?(?P<a>{_EN_WHOLE})\s*[-–]\s*(?:{_SYM}\s?)?(?P<b>{_EN_WHOLE})"
          rf"(?!\d|[.,]\d|{_SCALE})", _en_money_range,
          "$5-$10, $5-10, £15-£20: five to ten dollars (wetext: dollar five-dollar ten)"),
    _rule("en_money_thousands", rf"(?P<sym>{_SYM})\s?(?P<n>\d+(?:\.\d+)?)\s?[kK]\b",
          lambda m, _: f"{m.group('n')} thousand {_CURRENCY[m.group('sym')][1]}",
          "$50k is fifty thousand dollars (wetext: dollar fifty k; $2.5M and $3bn it reads right)"),
    _rule("en_money",
          rf"(?P<sym>{_SYM})\s?(?P<int>{_EN_WHOLE})(?:\.(?P<frac>\d{{1,2}}))?(?!\d|[.,]\d|{_SCALE})",
          _en_money, "$12.50 is twelve dollars and fifty cents (wetext: twelve point five dollars), $0.99 "
          "ninety nine cents, £5.25 five pounds twenty five in en-GB; ₹200 wetext leaves as written; "
          "$2.5 million stays wetext's"),
    _rule("en_version", r"(?:\b(?P<v>v)|(?P<kw>\b(?:[Vv]ersion|[Rr]elease) ))?(?<![\d.])"
          r"(?P<num>\d+(?:\.\d+){2,}|(?(v)\d+\.\d+|(?(kw)\d+\.\d+|\d+\.\d+\.\d+)))(?![\d%]|\.\d)",
          _en_version, "2.4.1, v1.2, version 3.10: a version's parts are numbers (wetext: two.four point "
          "one, v one.two, three point one oh)"),
    _rule("en_feet_inches", r"(?<![\w.])(\d)'\s?(\d{1,2})(?:\"|″|'')", r"\1 foot \2",
          "6'2\" is six foot two (wetext: six'two\")"),
    _rule("en_unit_stop", r"(?<=\d)(\s?(?:ft|in|mi|lbs?|oz|hrs?|mins?|secs?|yds?|km|cm|mm|kg))\.(?= [a-z])",
          r"\1",
          "5 ft. tall: a unit's stop inside a sentence is not a sentence's end (wetext: five feet. tall)"),
    _rule("en_million",
          r"(?<![\w$€£₹.,])(\d+(?:\.\d+)?)m(?= (?:people|(?!across\b|hurdles\b|less\b)[a-z]+s)\b)",
          r"\1 million", "5m people, 2.5m users: m before a counted plural is million (wetext: five minutes "
          "people)"),
    _rule("en_unit_modifier", r"(?P<pre>\b(?:[Aa]n?|[Tt]he) )(?P<n>\d+(?:\.\d+)?)[\s-]?(?P<unit>"
          + _words(_MODIFIER_UNITS) + rf")(?= (?!(?:{_QUANTITY_WORDS})\b)[a-z])", _en_unit_modifier,
          "a 30 min walk, a 10 km run: a measurement before its noun is singular, a thirty minute walk "
          "(wetext: ten kilometers run)"),
    _rule("en_cents_sign", r"(?<![\w.])(\d+)\s?¢",
          lambda m, _: f"{m.group(1)} {'cent' if m.group(1) == '1' else 'cents'}",
          "50¢ is fifty cents (wetext leaves it as written)"),
    _rule("en_year_apostrophe", r"(?<![\w'’])['’](\d\d)(?![\d'’]|s\b)",
          lambda m, read: _pairs(m.group(1), read),
          "in '99, since '05: a year's last two digits, ninety nine, oh five (wetext: 'ninety nine)"),
    _rule("en_hashtag", r"(?<![\w#&])#(?=[A-Za-z])", "hashtag ",
          "#summer is hashtag summer (wetext: hash summer)"),
    _rule("en_pence", r"(?<![\w.$€£₹])(\d{1,2})p(?!\w)",
          lambda m, _: f"{m.group(1)} {'penny' if m.group(1) == '1' else 'pence'}",
          "99p is ninety nine pence (wetext: ninety nine p)"),
    _rule("en_resolution", r"(?<![\w.])(\d{3,4})p(?!\w)", lambda m, read: _pairs(m.group(1), read) + " p",
          "1080p, 720p: a video resolution in pairs, ten eighty p (wetext: one thousand eighty p)"),
    _rule("en_unit", r"(?<![\w$€£₹.,])(?P<n>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)\s?"
          r"(?P<unit>m/s|m|mins?|hrs?|secs?|L|W|V|kWh|tsp|tbsp|gal|qt|yds?|in"
          + _INCH_ENDS + r")(?![\w²³/])", _en_unit,
          "2.4 m is meters, not minutes; 25 min, 2 hrs, 12 in (before a stop or 'long'), 1.5 L, 100 W "
          "wetext reads as minutes or leaves as written; 3 in 10 people stays"),
    _rule("en_multiply", r"(?<![\w.])(\d+)\s?[x×]\s?(\d+)(?![\w.])", _en_multiply,
          "4x4 is four by four, 1920x1080 nineteen twenty by ten eighty (wetext: four times four)"),
    _rule("en_times", r"(?<![\w.])(\d+(?:\.\d+)?)[x×](?!\w)", r"\1 times",
          "1.5x, 10x: one point five times (wetext: one point five x)"),
    _rule("en_ordinal_hyphen", r"(\d+(?:st|nd|rd|th))-(?=[A-Za-z])", r"\1 ",
          "a 3rd-floor office is a third floor office (wetext: three rd-floor)"),
    _rule("en_roman_count", r"(?P<kw>\b(?:War|Chapter|Part|Volume|Act|Scene|Book|Title|Type|Phase|Bowl|"
          r"Article|Section|Stage|Level|Apollo|Episode|Round|Class|Schedule|Appendix) )(?P<r>[IVXLC]+)\b",
          _en_roman_count,
          "World War II, Chapter IV, Super Bowl LVIII: a Roman numeral after these is a count "
          "(wetext leaves it as written)"),
    _rule("en_roman_regnal", r"\b(?P<title>(?:King|Queen|Pope|Emperor|Empress|Tsar|Prince|Pharaoh) "
          r"(?:[A-Z][a-z]+ )+)?(?P<name>(?(title)|(?:" + _REGNAL_NAMES + r") ))"
          r"(?P<r>(?(title)[IVX]+|(?:[IVX]{2,}|V)))(?![\w'])",
          _en_roman_regnal, "Henry VIII, Queen Elizabeth II: a Roman numeral after a name is the ordinal, "
          "Henry the eighth (wetext leaves it as written)"),
    _rule("en_title", rf"(?P<pre>\b)(?P<a>{_words(_TITLES)})\.(?= [A-Z])", _en_abbreviation(_TITLES, False),
          "Dr. Smith, Prof. Chen, St. Louis: a title before a name, capitalised as written (wetext: doctor, "
          "Prof. as written)"),
    _rule("en_after_name", rf"(?P<pre>(?<=[A-Za-z] ))(?P<a>{_words(_AFTER_NAME)})\.",
          _en_abbreviation(_AFTER_NAME, True),
          "Baker St., Fifth Ave., King Jr.: after a name, its stop kept only where the sentence ends "
          "(wetext: Street., St. as written)"),
    _rule("en_day_range", rf"\b({_DAY}\.?)\s?[-–]\s?(?={_DAY}\b)",
          r"\1 to ", "Mon.-Fri., Monday-Friday: Monday to Friday (wetext: Monday-Friday)"),
    _rule("en_day", rf"(?P<pre>(?<!the ))\b(?P<a>{_words(_DAYS)})\.", _en_abbreviation(_DAYS, True),
          "Tues., Wed.: the day's name, the stop kept only at a sentence's end (wetext: Tues., Wednesday.,)"),
    _rule("en_before_number", rf"(?P<pre>\b)(?P<a>{_words(_BEFORE_NUMBER)})\.(?= \d)",
          _en_abbreviation(_BEFORE_NUMBER, False),
          "Fig. 3, Vol. 2, pp. 10-12: the word (wetext leaves it as written)"),
    _rule("en_month", rf"(?P<pre>\b)(?P<a>{_words(_MONTH_ABBREVIATIONS)})\.(?= \d)",
          _en_abbreviation(_MONTH_ABBREVIATIONS, False), "Sept. 3: the month's name (wetext: Sept. three)"),
    _rule("en_latin", rf"(?P<pre>(?<![\w.]))(?P<a>{_words(_LATIN)})\.", _en_abbreviation(_LATIN, False),
          "vs., e.g., i.e., approx. are said as words, never a sentence's end (wetext leaves them as "
          "written)"),
    _rule("en_etc", r"(?P<pre>\b)(?P<a>etc)\.", _en_abbreviation(_ETC, True),
          "etc. is et cetera, its stop kept where the sentence ends (wetext leaves it as written)"),
    _rule("en_initialism", r"\b(?:[A-Z]\.){2,}", _en_initialism,
          "the U.S. is the U S, letter by letter (wetext: US, the word us)"),
    _rule("en_am_pm", r"(?<=\d)\s?([AaPp])\.[Mm]\.", _en_am_pm,
          "9:45 a.m. at a sentence's end keeps the sentence's stop (wetext: AM, the stop lost; AM., before a "
          "comma)"),
    _rule("en_may", r"(?<![\w.,/])(?P<a>\d{1,2})(?:st|nd|rd|th)? May\b"
          r"|\bMay (?P<b>\d{1,2})(?:st|nd|rd|th)?(?![\w:%]|[.,]\d)", _en_may,
          "1 May, May 1, 2024: a day of May, the first of May or May first (wetext reads every month but "
          "May, the verb's namesake, as a date: one May, May one)"),
    _rule("en_short_date", r"(?P<pre>\b(?:[Oo]n|[Bb]y|[Uu]ntil|[Ff]rom|[Ss]ince|[Bb]efore|[Aa]fter) )"
          r"(?P<a>\d{1,2})/(?P<b>\d{1,2})(?![\d/])", _en_short_date,
          "on 5/6, by 12/1: a date without its year after on, by, until (wetext: five sixths, a fraction); "
          "month first in en-US, day first in en-GB"),
    _rule("en_slash_pair", r"(?<![\w./])(?P<a>\d+(?:\.\d+)?)/(?P<b>\d+)(?![\w/]|\.\d)", _en_slash_pair,
          "24/7, 50/50, 2.5/5: not a fraction where the top is not smaller or is a decimal (wetext: twenty "
          "four sevenths, two.five fifths): twenty four seven, two point five out of five"),
    _rule("en_minus_degrees", r"(?<![\w.])-(?=\d+(?:\.\d+)?\s?°)", "minus ",
          "-10°C is minus ten degrees (wetext: negative ten degrees)"),
    _rule("en_day_first", r"(?<![\d/])(\d{1,2})/(\d{1,2})/(\d{2,4})(?![\d/])", r"\2/\1/\3",
          "en-GB writes the day first: 12/05/2026 is the twelfth of May (wetext reads month first)",
          ("en-GB",)),
    _rule("en_thousands", _NOT_IN_NUMBER + r"(\d{1,3}(?:,\d{3})+)(?![\d,])",
          lambda m, _: _en_written(int(m.group(1).replace(",", ""))),
          "1,234: wetext drops the 'one' of one thousand"),
    _rule("en_year_range",
          r"(?<![\d,.])(1[1-9]\d\d|20\d\d)\s*[-–]\s*(1[1-9]\d\d|20\d\d|\d\d)(?![\d,.]\d|-\d)", r"\1 to \2",
          "2020-2024 is twenty twenty to twenty twenty four, 1990-91 nineteen ninety to ninety one (wetext "
          "reads a range as cardinals: two thousand and twenty to ...)"),
    _rule("en_percent_range", r"(\d+(?:\.\d+)?)\s*[-–]\s*(\d+(?:\.\d+)?)\s*%", r"\1 to \2%",
          "10-20% is ten to twenty percent (wetext: ten-twenty)"),
    _rule("en_decade_apostrophe", r"(?<![\w'])(\d0)'s\b", r"\1s",
          "the 90's is the nineties (wetext: ninety's)"),
    _rule("en_decade", r"(?<![\w'])(?P<year>1[1-9]\d0|20\d0)'?s\b", _en_decade,
          "the 1990s is the nineteen nineties (wetext: one thousand nine hundred and ninety seconds)"),
)
EN_AFTER = (
    _rule("en_month_first", rf"\bthe ((?:(?:twenty|thirty) )?(?:{_ORDINALS})) of ({_MONTHS})\b", r"\2 \1",
          "en-US says dates month first: 3/5/2024 is march fifth (wetext: the fifth of march)", ("en-US",)),
    _rule("en_month_name", rf"\b(?:(?!may|march)(?:{_MONTHS})"
          rf"|(?:may|march)(?= (?:twenty |thirty )?(?:{_ORDINALS}))|(?<=of )(?:may|march))\b", _en_capital,
          "a month is a name: March third (wetext: march third, may and march only where a date says so)"),
    _rule("en_year_oh", rf"\b({_TEENS}) zero ({_UNITS})\b", r"\1 oh \2",
          "1905 is nineteen oh five (wetext: nineteen zero five)"),
    _rule("en_clock_oh", rf"\bo (?=(?:{_UNITS})\b)", "oh ", "3:05 is three oh five (wetext: three o five)"),
    _rule("en_hundred_and", rf"\bhundred (?=(?:(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety) )?"
          rf"(?:{_ORDINALS})\b)", "hundred and ",
          "101st is one hundred and first (wetext: one hundred first)"),
    _rule("en_ten_hundred", r"\bten hundred\b", "one thousand",
          "a bare 1000 is one thousand, which nobody says as ten hundred (wetext reads it as a year)"),
    _rule("en_gb_spelling", r"\b((?:kilo|centi|milli)?met|lit)(er)(s?)\b", _metre,
          "en-GB spells metres and litres", ("en-GB",)),
)

BEFORE = {"zh": ZH_BEFORE, "en": EN_BEFORE}
AFTER = {"en": EN_AFTER}  # wetext's Mandarin needs no correction after it once its input is steered
