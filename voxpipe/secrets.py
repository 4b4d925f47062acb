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
  (`?token=...`, `&sig=...`), in the environment or in the text.

`ScrubFilter` applies the same to every log record (the CLI installs it), so a library's retry
warnings that print a URL cannot leak its token.

Keys are never judged by their name: `train.max_tokens` and `bos_token_id` are ordinary numbers.
Values shorter than MIN_SECRET_CHARS are not treated as secrets: blanking every "1" or "true" would
wreck the record and hide nothing worth hiding.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping

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
    """`text` with every URI password and every secret value replaced by ***. `values`: the secrets to
    hide (default: `secret_values()`); pass a precomputed list when scrubbing many texts."""
    text = _URI_USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{REDACTED}@", text)
    text = _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    for value in secret_values() if values is None else values:
        text = text.replace(value, REDACTED)
    return text


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
