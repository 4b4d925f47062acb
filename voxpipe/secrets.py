"""Secrets by reference, redaction by value.

A secret reaches a voxpipe process only through its environment: on the cluster from a Kubernetes
Secret (`launch.secret_env` for the Volcano job, kfp-kubernetes `use_secret_as_env` for pipeline
tasks), locally from the shell. Anything voxpipe writes (params, tags, run names, reports,
artifacts) passes through `scrub`, which replaces every secret VALUE it knows of wherever it occurs:

- the value of every environment variable whose name says it is a secret, by shape: PASSWORD,
  PASSWD, SECRET, DSN, CREDENTIAL and TOKEN anywhere in the name (`PGPASSWORD`, `SENTRY_DSN`; TOKEN
  not as TOKENS/TOKENIZER: `MAX_TOKENS` is not one), `*_PWD` (`MYSQL_PWD`; not `PWD`, the working
  folder), and the words KEY, PASS, AUTH, APIKEY, PAT between underscores (`WANDB_API_KEY`);
- the value of every variable named in $VOXPIPE_REDACT_ENV (comma-separated names; the launcher sets
  it in every pod it gives secrets to, so secrets with ordinary names are known too), and of the
  variables a caller declares (`launch.secret_env`'s names), except user names (`*_USERNAME`,
  `*_USER`): an account name such as "voxpipe" would blank every model and experiment name;
- every password inside a URI (`scheme://user:password@host`) and every secret-named query value
  (`?token=...`, `&sig=...`), in the environment or in the text;
- every value that has a secret's shape, whatever its key or variable is called (`value_shapes`): the
  secret of a connection string (`AccountKey=`, `SharedAccessKey=`, `SharedAccessSignature=`,
  `Password=`, `Pwd=`), a JWT (`eyJ...`, three dot-separated parts), a PEM block (`-----BEGIN ...`),
  a service token that detect-secrets' maintained detectors know (`detected`) or that has a documented
  prefix they miss (`hf_`, `sk-proj-`, `npm_`, `AIza`...), and a high-entropy token (24+ characters of
  the base64 or base64url alphabet that mix upper case, lower case and digits the way random strings do;
  hex digests, paths and identifiers are not). `launch-train` refuses
  them in `launch.env` too. A value that only looks like one (a public certificate) is let through
  where its name is listed in `launch.env_not_secret`: `allowing` passes such values to `scrub`.

`ScrubFilter` applies the same to every log record (the CLI installs it), so a library's retry
warnings that print a URL cannot leak its token.

Keys are never judged by their name: `train.max_tokens` and `bos_token_id` are ordinary numbers.
Values shorter than MIN_SECRET_CHARS are not treated as secrets: blanking every "1" or "true" would
wreck the record and hide nothing worth hiding.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

REDACTED = "***"
SECRET_ENV_NAMES = "VOXPIPE_REDACT_ENV"
MIN_SECRET_CHARS = 6
_SECRET_WORD = re.compile(
    r"PASSWORD|PASSWD|SECRET|DSN|CREDENTIAL|TOKEN(?!S|IZ)"
    r"|_PWD(?:_|$)|(?:^|_)(?:PASS|PASSPHRASE|KEY|APIKEY|AUTH|PAT)(?:_|$)",  # not PWD: the working folder
    re.IGNORECASE,
)
_QUERY_SECRET = re.compile(
    r"([?&][\w.\-]*?(?:token|key|secret|passw(?:or)?d|pwd|sig|signature|credential|auth)[\w.\-]*=)([^&\s#\"']+)",
    re.IGNORECASE,
)
_IDENTITY = re.compile(r"(?:^|_)USER(?:NAME)?$", re.IGNORECASE)
_URI_USERINFO = re.compile(r"\b([a-z][a-z0-9+.\-]*://)([^/\s:@]*):([^/\s@]+)@", re.IGNORECASE)


# service tokens by their documented prefixes, beside detect-secrets' detectors (`_detectors`), which miss
# these: Hugging Face, OpenAI's project/service keys (its detector knows only the legacy T3BlbkFJ form),
# bare npm tokens (its detector wants an .npmrc line), Google API keys, OAuth secrets and access tokens,
# GitHub fine-grained PATs, Slack app tokens, Stripe test/restricted/webhook keys, Azure AD client secrets
_PREFIXED = re.compile(
    r"(?P<secret>\b(?:hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,}"
    r"|sk-(?=[\w-]*[0-9])(?=[\w-]*[A-Z])(?:[a-z]+-)?[A-Za-z0-9_-]{32,}|npm_[A-Za-z0-9]{36}"
    r"|AIza[0-9A-Za-z_-]{35}|GOCSPX-[A-Za-z0-9_-]{28}|ya29\.[0-9A-Za-z_-]{20,}|github_pat_[A-Za-z0-9_]{50,}|xapp-[0-9]-[A-Za-z0-9-]{20,}"
    r"|[rsp]k_(?:live|test)_[0-9A-Za-z]{16,}|whsec_[A-Za-z0-9+/=]{24,}"
    r"|[A-Za-z0-9_~.-]{3}[0-9]Q~[A-Za-z0-9_~.-]{31,34}))")
# detect-secrets' plugins left out: a public IP is no secret; its keyword detector judges names (ours do,
# `is_secret_name`); its entropy detectors flag every hex digest (run ids, sha256 sums), which `_tokens`
# tells apart from tokens; URI passwords are `uri_passwords`' (never let through by env_not_secret)
_LEFT_OUT_DETECTORS = frozenset({"IPPublicDetector", "KeywordDetector", "HexHighEntropyString",
                                 "Base64HighEntropyString", "BasicAuthDetector"})
_DELIMITERS = " \t\r\n\"'=:"  # some detectors' matches include what surrounds the token


@functools.cache
def _detectors() -> tuple[Any, ...]:
    """detect-secrets' regex detectors (GitHub, GitLab, AWS, Slack, Stripe, OpenAI, JWT, private keys,
    Azure, Twilio, SendGrid, npm, PyPI, Discord, Telegram...), instantiated once: their `denylist`
    patterns match secrets. Loaded on first use (it imports requests)."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    return tuple(cls() for cls in get_mapping_from_secret_type_to_class().values()
                 if issubclass(cls, RegexBasedDetector) and cls.__name__ not in _LEFT_OUT_DETECTORS)


def detected(text: str) -> list[tuple[str, str]]:
    """(what, secret) for every value detect-secrets' detectors recognise in `text`. Their whole match, not
    `analyze_string`'s capture groups: some capture only the prefix (GitHub's `ghp`)."""
    found = []
    for detector in _detectors():
        for pattern in detector.denylist:
            for m in pattern.finditer(text):
                secret = m.group(0).strip(_DELIMITERS)
                start = m.start() + m.group(0).find(secret)
                if secret and secret != REDACTED and not _inside_a_longer_run(text, start,
                                                                              start + len(secret)):
                    found.append((f"a {detector.secret_type} (detect-secrets)", secret))
    return found


def _inside_a_longer_run(text: str, start: int, end: int) -> bool:
    """A match with a letter or digit right beside it is part of a longer run, not that token: some
    detectors' patterns have no word boundary (AWS's `ACCA` + 16), so any base64 blob (an RNG state, a
    clip) would hold "keys". A random run as a whole is the high-entropy rule's to judge."""
    return (start > 0 and text[start - 1].isalnum()) or (end < len(text) and text[end].isalnum())


# -- secrets by the shape of the value (the group named "secret" is what is redacted)
_SHAPES = (
    ("a connection string's key or password (AccountKey=, SharedAccessKey=, Password=, Pwd=)",
     re.compile(r"\b(?:AccountKey|SharedAccessKey|Password|Pwd)=(?P<secret>[\w+/%.!@#$^*~-][^;\s\"'&]*)",
                re.IGNORECASE)),
    ("a connection string's shared access signature (SharedAccessSignature=)",
     re.compile(r"\bSharedAccessSignature=(?P<secret>[\w+/%.-][^;\s\"']*)", re.IGNORECASE)),
    ("a JSON Web Token (eyJ...)",
     re.compile(r"(?P<secret>\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)")),
    ("a PEM block (-----BEGIN ...-----)",
     re.compile(r"(?P<secret>-----BEGIN [A-Z0-9 ]+-----[\s\S]*?(?:-----END [A-Z0-9 ]+-----|$))")),
    ("a service token (hf_, sk-, npm_, AIza, GOCSPX-, ya29., github_pat_, sk_live_, whsec_...)", _PREFIXED),
)
_TOKEN_RUN = re.compile(r"[A-Za-z0-9+/_-]{24,}={0,2}")
_WORD = re.compile(r"^[A-Z]?[a-z]{3,}$")  # a path's `runs` or `Export`: not part of a token
_NAME_WORD = re.compile(r"^[A-Z]?[a-z]{4,}$")  # a name's `voxpipe-...`; base64url's random parts rarely are
TOKEN_CHARS = 24
BASE36_CHARS = 32
HIGH_ENTROPY = "a high-entropy token (a random-looking string of 24+ characters)"
_ALLOWED: ContextVar[tuple[str, ...]] = ContextVar("voxpipe_not_secret", default=())


def _char_class(ch: str) -> int:
    return 0 if ch.isupper() else 1 if ch.islower() else 2 if ch.isdigit() else 3


def _random_looking(body: str) -> bool:
    """Upper, lower and digits, a high character entropy, and the class changing from one character to the
    next about as often as in a random string (0.62 for base62; CamelCase words and paths far less); or a
    long lower-case base36 token (`_random_base36`)."""
    if len(body) < TOKEN_CHARS:
        return False
    if not any(c.isupper() for c in body):
        return _random_base36(body)
    if not (any(c.islower() for c in body) and any(c.isdigit() for c in body)):
        return False
    changes = sum(_char_class(a) != _char_class(b) for a, b in zip(body, body[1:], strict=False))
    return _entropy(body) >= 3.8 and changes / (len(body) - 1) >= 0.45


def _random_base36(body: str) -> bool:
    """32+ lower-case letters and digits as random as a generated key: a high entropy, letters beyond
    a-f (a hex digest, a run id has none) and digits mixed in. Hex digests stay ordinary values."""
    if len(body) < BASE36_CHARS or not (body.isalnum() and body.isascii()):
        return False
    beyond_hex = sum(c in "ghijklmnopqrstuvwxyz" for c in body)
    digits = sum(c.isdigit() for c in body)
    changes = sum(a.isdigit() != b.isdigit() for a, b in zip(body, body[1:], strict=False))
    return (_entropy(body) >= 4.2 and beyond_hex >= len(body) // 4 and digits >= len(body) // 8
            and changes / (len(body) - 1) >= 0.2)


def _entropy(body: str) -> float:
    return -sum(n / len(body) * math.log2(n / len(body)) for n in Counter(body).values())


def _tokens(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of every high-entropy token in text (base64 and base64url alphabets); a path's
    segments and a name's dash- or underscore-separated parts are judged one by one when one of them is a
    word (`runs`, `voxpipe`), else the whole."""
    for m in _TOKEN_RUN.finditer(text):
        body = m.group().rstrip("=")
        yield from _judged(body, m.start(), ("/", "-_"))


def _judged(body: str, start: int, separators: tuple[str, ...]) -> Iterator[tuple[int, int]]:
    if not separators:
        if _random_looking(body):
            yield start, start + len(body)
        return
    parts = re.split(f"[{re.escape(separators[0])}]", body)
    word = _WORD if separators[0] == "/" else _NAME_WORD
    if len(parts) > 1 and any(word.match(p) for p in parts):
        for part in parts:
            yield from _judged(part, start, separators[1:])
            start += len(part) + 1
    else:
        yield from _judged(body, start, separators[1:])


def value_shapes(text: str) -> list[tuple[str, str]]:
    """(what it looks like, the secret part) for every secret-shaped value in `text`."""
    found = [(what, m.group("secret")) for what, pattern in _SHAPES for m in pattern.finditer(text)]
    covered = "\0".join(s for _, s in found)
    found += [(what, s) for what, s in detected(text) if s not in covered]
    covered = "\0".join(s for _, s in found)
    found += [(HIGH_ENTROPY, text[a:b]) for a, b in _tokens(text) if text[a:b] not in covered]
    return [(what, s) for what, s in found if s and s != REDACTED]


def value_shape(text: str, allowed: Iterable[str] = ()) -> str | None:
    """What the first secret-shaped value in `text` looks like (never the value), or None."""
    allowed = tuple(allowed)
    return next((what for what, s in value_shapes(text) if not any(s in a for a in allowed)), None)


@contextlib.contextmanager
def allowing(values: Iterable[str]) -> Iterator[None]:
    """Within it, `scrub` keeps secret-shaped parts of these values (`launch.env_not_secret`'s values)."""
    token = _ALLOWED.set(tuple(v for v in values if v))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def scrub_shapes(text: str, allowed: Iterable[str] | None = None) -> str:
    """`text` with every secret-shaped value (`value_shapes`) replaced by ***, except inside `allowed`
    values (default: those of the enclosing `allowing`)."""
    allowed = _ALLOWED.get() if allowed is None else tuple(allowed)

    def kept(secret: str) -> bool:
        return secret == REDACTED or any(secret in a for a in allowed)

    def redact(m: re.Match[str]) -> str:  # in place: a short password is not replaced all over the text
        if kept(m.group("secret")):
            return m.group(0)
        start, end = m.start("secret") - m.start(), m.end("secret") - m.start()
        return m.group(0)[:start] + REDACTED + m.group(0)[end:]

    for _, pattern in _SHAPES:
        text = pattern.sub(redact, text)
    for secret in sorted({s for _, s in detected(text) if not kept(s)}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    for start, end in reversed([(a, b) for a, b in _tokens(text) if not kept(text[a:b])]):
        text = text[:start] + REDACTED + text[end:]
    return text


def is_secret_name(name: str) -> bool:
    """An environment variable name that says its value is a secret."""
    return bool(_SECRET_WORD.search(name))


def declared_names(environ: Mapping[str, str] | None = None) -> set[str]:
    """The names in $VOXPIPE_REDACT_ENV."""
    environ = os.environ if environ is None else environ
    return {n.strip() for n in environ.get(SECRET_ENV_NAMES, "").split(",") if n.strip()}


def uri_passwords(text: str) -> set[str]:
    """The passwords of the URIs in `text`, and its secret-named query values (`?token=...`)."""
    passwords = {m.group(3) for m in _URI_USERINFO.finditer(text)}
    return passwords | {m.group(2) for m in _QUERY_SECRET.finditer(text)}


def secret_values(
    names: Iterable[str] = (), texts: Iterable[str] = (), environments: Iterable[Mapping[str, str]] = ()
) -> list[str]:
    """Every secret value known now (longest first, so a secret inside another goes with it): the
    environment's (see the module docstring), those of the variables `names`, the URI passwords inside
    `texts`, and the same from other `environments` (e.g. `launch.env`, an environment for a pod)."""
    # by key, not dict(os.environ): MLflow's telemetry thread may drop a variable while we copy
    environ = {k: v for k in list(os.environ) if (v := os.environ.get(k)) is not None}
    declared = {n for n in declared_names(environ) | set(names) if not _IDENTITY.search(n)}
    values: set[str] = set()
    for env in (environ, *environments):
        values |= {v for k, v in env.items() if is_secret_name(k) or k in declared}
        for v in env.values():
            values |= uri_passwords(v)
    for text in texts:
        values |= uri_passwords(text)
    return sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def scrub(text: str, values: Iterable[str] | None = None) -> str:
    """`text` with every URI password, every secret value and every secret-shaped value (`scrub_shapes`)
    replaced by ***. `values`: the secrets to
    hide (default: `secret_values()`); pass a precomputed list when scrubbing many texts."""
    text = _URI_USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{REDACTED}@", text)
    text = _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    for value in secret_values() if values is None else values:
        text = text.replace(value, REDACTED)
    return scrub_shapes(text)


class ScrubFilter(logging.Filter):
    """Every log record's text scrubbed (formatted first: a secret may sit in its args)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
        return True
