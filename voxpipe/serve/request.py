"""One validated request for `voxpipe synthesize` and the served pyfunc model: texts, reference clips,
generation params, `normalize`. Both go through `parse_request`, so the CLI and a serving client are
refused the same things with the same one-line reasons, and their texts are spoken the same way.

`normalize` (default true) reads each text as ingest read the training transcripts: the same
`spoken_form` (voxpipe/data/text_norm.py: wetext and our rules, the language detected from the
script), so "$12.50" is said as the model heard such prices in training. False: the text as written.
`locale` (en-US, en-GB, zh-CN) is how the text is read (12/05 as 12 May in en-GB); left out or "": the
voice's own, recorded at register (`model_locale`), en-US for a model that recorded none.

The bounds are the `synthesize` section's fields (voxpipe/steps/synthesize.py: one place, one description):
finite `cfg_value` in (0, 20], `inference_timesteps` 1-100, `max_len` 1-4096 patches (left out: sized
for the text, `sized_max_len`), text at most 2000 characters, at most MAX_ROWS texts per request, and one
deadline per request (`deadline_s`, deadline.py). A reference clip is decoded to 16 kHz mono,
must be finite and at most `max_reference_seconds` long (read from the file's header before anything
is decoded, so a 10-minute clip costs nothing).

Over serving, `reference_audio` is the clip's bytes in base64. A path is taken only when the
deployment names a folder (`reference_dir`, $VOXPIPE_REFERENCE_DIR) and it resolves inside it; a path
outside, or any path without a folder, gets the same answer whether or not the file exists (no
existence oracle). The local CLI reads the user's file itself and sends its bytes. A row without a
reference is a missing value (null, None, NaN): it speaks in the model's own voice. Anything else that
is not a clip (an empty string, a number, bytes that do not decode) is refused, never dropped.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError, create_model

from voxpipe.data.audio import AudioDecodeError, decode
from voxpipe.data.text_norm import spoken_form
from voxpipe.data.text_rules import LOCALES
from voxpipe.errors import StepError, quoted
from voxpipe.params import Section
from voxpipe.steps.synthesize import SynthesizeParams
from voxpipe.track.voices import ASSUMED_LOCALE
from voxpipe.voxcpm2_format import SAMPLE_RATE

GENERATION_KEYS = ("seed", "cfg_value", "inference_timesteps", "max_len")
REQUEST_KEYS = (*GENERATION_KEYS, "normalize", "locale")  # every param a request may carry
TEXT_KEYS = ("normalize", "locale")  # how the text is read, not how it is generated
MAX_ROWS = 64
MAX_TEXT_CHARS = next(m.max_length for m in SynthesizeParams.model_fields["text"].metadata
                      if hasattr(m, "max_length"))
MAX_LEN = next(m.le for m in SynthesizeParams.model_fields["max_len"].metadata if hasattr(m, "le"))
# base64 of the largest plausible 30 s clip (48 kHz stereo float32) and then some: refused before decoding
MAX_REFERENCE_BYTES_PER_SECOND = 48000 * 2 * 4
_DATA_URL = "base64,"

# the generation params, with the synthesize section's own fields (bounds, defaults) and its strictness
_FIELDS = SynthesizeParams.model_fields
Generation = create_model("Generation", __base__=Section,
                          **{k: (_FIELDS[k].annotation, _FIELDS[k]) for k in GENERATION_KEYS})
GENERATION_DEFAULTS = {k: SynthesizeParams.model_fields[k].default for k in GENERATION_KEYS}
NORMALIZE_DEFAULT: bool = _FIELDS["normalize"].default


class RequestError(StepError):
    """A refused request: one line, naming the field."""


@dataclass(frozen=True)
class Limits:
    max_reference_seconds: float = SynthesizeParams.model_fields["max_reference_seconds"].default
    reference_dir: Path | None = None  # a folder whose files a request may name by path; None: none


@dataclass(frozen=True)
class Request:
    texts: list[str]  # as sent
    spoken: list[str]  # what the model is given to say: the texts normalized, or as sent
    references: list[np.ndarray | None]  # 16 kHz mono float32 per row
    generation: dict[str, Any]  # max_len resolved for these texts
    max_len: int | None = None  # as the request gave it (None: sized per text, `sized_max_len`)
    reference_text: str | None = None  # the references' transcript, as spoken
    locale: str = ASSUMED_LOCALE  # the texts were read in it


SIZED_BASE_PATCHES, SIZED_PATCHES_PER_CHAR = 25, 2  # 4 s, then 320 ms a character: slow speech, with room


def sized_max_len(spoken: list[str], given: int | None) -> int:
    """The request's max_len, or (left out) one sized for its longest text: a request for "hi" stops after
    a few seconds of a runaway, not after the 4096-patch maximum."""
    if given is not None:
        return given
    longest = max((len(t) for t in spoken), default=0)
    return min(MAX_LEN, SIZED_BASE_PATCHES + SIZED_PATCHES_PER_CHAR * longest)


def generation(params: dict[str, Any] | None) -> dict[str, Any]:
    """The generation params with defaults, checked; integral floats (JSON's 1e3) count as integers."""
    given = dict(params or {})
    unknown = sorted(set(given) - set(GENERATION_KEYS))
    if unknown:
        raise RequestError(f"params {unknown}: unknown; known: {', '.join(REQUEST_KEYS)}")
    for key in ("seed", "inference_timesteps", "max_len"):
        value = given.get(key)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            given[key] = int(value)
    if isinstance(given.get("cfg_value"), int) and not isinstance(given.get("cfg_value"), bool):
        given["cfg_value"] = float(given["cfg_value"])
    try:
        return Generation(**{**GENERATION_DEFAULTS, **given}).model_dump()
    except ValidationError as e:
        err = e.errors()[0]
        key = err["loc"][0] if err["loc"] else "params"
        raise RequestError(f"params.{key}={quoted(given.get(key))}: {err['msg']}") from None


def _normalize_flag(params: dict[str, Any] | None) -> bool:
    """The request's `normalize` param (default NORMALIZE_DEFAULT): a JSON true or false (numpy's own
    bool too: MLflow's schema may hand one over)."""
    value = (params or {}).get("normalize", NORMALIZE_DEFAULT)
    if not isinstance(value, bool | np.bool_):
        raise RequestError(f"params.normalize={quoted(value)}: must be true or false")
    return bool(value)


def request_locale(params: dict[str, Any] | None, default: str) -> str:
    """The request's `locale` param, or `default` (the voice's) when it is left out, null or ""."""
    value = (params or {}).get("locale")
    if value is None or value == "":
        return default
    if value not in LOCALES:
        raise RequestError(f"params.locale={quoted(value)}: unknown; one of {', '.join(LOCALES)} (or leave "
                           "it out for the voice's own)")
    return str(value)


def model_locale(recorded: Any) -> tuple[str, str]:
    """(the locale a model's text is read in, how that was decided): the one recorded at register, or
    ASSUMED_LOCALE, said so, for a model registered before locales were recorded (or a checkpoint folder)."""
    if isinstance(recorded, str) and recorded in LOCALES:
        return recorded, "recorded at register"
    return ASSUMED_LOCALE, f"none recorded with the model: {ASSUMED_LOCALE} assumed"


def check_text(text: Any, where: str) -> str:
    if text is None:
        raise RequestError(f"{where}: missing; send the text to say")
    if not isinstance(text, str):
        raise RequestError(f"{where}: {type(text).__name__} {repr(text)[:40]}, not a string; send the text "
                           "to say as a string")
    if not text.strip():
        raise RequestError(f"{where}: empty; say something")
    if len(text) > MAX_TEXT_CHARS:
        raise RequestError(f"{where}: {len(text)} characters; at most {MAX_TEXT_CHARS} per text (split it)")
    check_unicode(text, where)
    return text


def check_unicode(text: str, where: str) -> None:
    """A lone UTF-16 surrogate (JSON's "\ud800" alone) is no character: refused, not a 500 further on."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"{where}: a lone UTF-16 surrogate {text[e.start]!r} at character {e.start}; send "
                           "valid Unicode") from None


def reference_waveform(value: str, where: str, limits: Limits) -> np.ndarray:
    """16 kHz mono float32 of base64 audio (or of a file inside `limits.reference_dir`)."""
    text = value.strip()
    cap = int(limits.max_reference_seconds * MAX_REFERENCE_BYTES_PER_SECOND * 4 / 3) + (1 << 20)
    if len(text) > cap:
        raise RequestError(f"{where}: {len(text)} base64 characters, more than a "
                           f"{limits.max_reference_seconds:g} s clip can take; send a shorter clip")
    try:
        source: bytes | Path = base64.b64decode(text.partition(_DATA_URL)[2] or text, validate=True)
    except (binascii.Error, ValueError):
        source = _confined_path(text, where, limits)
    _check_length(source, where, limits)
    try:
        wav = decode(source, SAMPLE_RATE)
    except AudioDecodeError as e:
        raise RequestError(f"{where}: not decodable audio ({e}); send a WAV/FLAC clip's bytes in "
                           "base64") from e
    if wav.size == 0:
        raise RequestError(f"{where}: the reference clip is empty")
    if not np.isfinite(wav).all():
        raise RequestError(f"{where}: the reference clip holds NaN or infinite samples")
    if wav.size > limits.max_reference_seconds * SAMPLE_RATE:  # a format whose header had no length
        raise RequestError(f"{where}: {wav.size / SAMPLE_RATE:.1f} s long; at most "
                           f"{limits.max_reference_seconds:g} s (a few seconds of the voice is enough)")
    return wav


def _confined_path(text: str, where: str, limits: Limits) -> Path:
    refused = (f"{where}: not base64 audio; send the clip's bytes in base64 (a path is accepted only "
               "inside the folder this deployment names in VOXPIPE_REFERENCE_DIR")
    check_unicode(text, where)
    if limits.reference_dir is None or len(text) > 4096 or "\x00" in text:
        raise RequestError(refused + ", and it names none)")
    root = limits.reference_dir.resolve()
    path = (root / text).resolve()
    if not path.is_relative_to(root):
        raise RequestError(refused + ": this one is outside it)")
    if not path.is_file():
        raise RequestError(f"{where}: no file {quoted(text)} in the reference folder")
    return path


def _check_length(source: bytes | Path, where: str, limits: Limits) -> None:
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(source) if isinstance(source, bytes) else source)
    except (sf.LibsndfileError, RuntimeError, TypeError):
        return  # decode() names the problem
    if info.samplerate > 0 and info.frames > limits.max_reference_seconds * info.samplerate:
        raise RequestError(f"{where}: {info.frames / info.samplerate:.1f} s long; at most "
                           f"{limits.max_reference_seconds:g} s (a few seconds of the voice is enough)")


def parse_request(texts: list[Any], references: list[Any], params: dict[str, Any] | None,
                  limits: Limits, reference_text: Any = None, locale: str = ASSUMED_LOCALE) -> Request:
    """reference_text: the reference clips' transcript (serving's extension); it needs a clip. `locale`:
    the voice's, read in unless the params name another."""
    if not texts:
        raise RequestError("no text: send at least one row")
    if len(texts) > MAX_ROWS:
        raise RequestError(f"{len(texts)} texts in one request; at most {MAX_ROWS}")
    checked = [check_text(t, f"text of row {i}") for i, t in enumerate(texts)]
    normalize = _normalize_flag(params)
    locale = request_locale(params, locale)
    gen = generation({k: v for k, v in (params or {}).items() if k not in TEXT_KEYS})
    refs = [reference(r, f"reference_audio of row {i}", limits) for i, r in enumerate(references)]
    said = None
    if reference_text is not None:
        said = check_text(reference_text, "reference_text")
        if any(r is None for r in refs):
            raise RequestError("reference_text: given without a reference clip; send reference_audio (or a "
                               "voice) with it, or leave it out")
        said = spoken_form(said, "", locale)[0] if normalize else said
    spoken = [spoken_form(t, "", locale)[0] if normalize else t for t in checked]
    given = gen["max_len"]
    return Request(checked, spoken, refs, {**gen, "max_len": sized_max_len(spoken, given)}, given, said,
                   locale)


def reference(value: Any, where: str, limits: Limits) -> np.ndarray | None:
    """A row's reference clip; None only for a missing value (null/None/NaN: the model's own voice)."""
    if value is None or type(value).__name__ == "NAType" or (isinstance(value, float) and math.isnan(value)):
        return None
    if not isinstance(value, str):
        shown = repr(value)[:40]
        raise RequestError(f"{where}: {type(value).__name__} {shown}, not a string; send the clip's bytes in "
                           "base64, or null for the model's own voice")
    if not value.strip():
        raise RequestError(f"{where}: empty; send the clip's bytes in base64, or null (leave it out) for the "
                           "model's own voice")
    return reference_waveform(value, where, limits)


def encode_file(path: str | Path) -> str:
    """A local audio file as the base64 a request carries (what the CLI sends for --reference)."""
    try:
        return base64.b64encode(Path(path).read_bytes()).decode()
    except OSError as e:
        raise StepError(f"synthesize.reference {path}: {e.strerror or e}") from e
