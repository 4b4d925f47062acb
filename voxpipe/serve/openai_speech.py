"""POST /v1/audio/speech as OpenAI's API has it (model, input, voice, response_format, speed, stream_format)
plus voxpipe's extensions (cfg_value, inference_timesteps, seed, max_len, normalize, locale, reference_audio
in base64, reference_text), checked by the one request schema (request.py) that `synthesize` and the pyfunc
use, so all three refuse the same things. The input is read in the voice's locale (recorded at register),
else the model's, unless `locale` names another.

The input is said sentence by sentence (formats.sentences), the same way whether streamed or not, so a
streamed answer is the same audio as the whole one; streamed, each sentence's PCM leaves as soon as it is
made. One deadline covers the whole request (deadline.py)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from voxpipe.errors import quoted
from voxpipe.serve.admission import Admission
from voxpipe.serve.cloning import Cloning
from voxpipe.serve.deadline import Deadline
from voxpipe.serve.formats import FORMATS, STREAMED, sentences
from voxpipe.serve.request import (
    GENERATION_KEYS,
    TEXT_KEYS,
    Limits,
    Request,
    RequestError,
    check_text,
    parse_request,
)
from voxpipe.serve.voices import VoiceStore
from voxpipe.track.voices import ASSUMED_LOCALE, DEFAULT_VOICE

if TYPE_CHECKING:
    from voxpipe.serve.batcher import Batcher

REFERENCE_VOICE = "reference"  # the voice label of a clip sent with the request


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param"}}."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             408: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
             499: "client_closed_request", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": None}}


class SpeechBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field("voxpipe", max_length=256)
    input: Any = None
    voice: Any = DEFAULT_VOICE
    response_format: str = "wav"
    speed: float = 1.0
    stream_format: str | None = None
    instructions: str | None = None
    cfg_value: Any = None
    inference_timesteps: Any = None
    seed: Any = None
    max_len: Any = None
    normalize: Any = None
    locale: Any = None
    reference_audio: Any = None
    reference_text: Any = None
    consent_attestation: Any = None  # the consent record that allows cloning reference_audio (cloning.py)


def shown(name: str) -> str:
    """A client's field name as an answer may quote it: at most 80 characters, a lone surrogate escaped."""
    return name[:80].encode("utf-8", "backslashreplace").decode("utf-8")


def _param_of(message: str) -> str | None:
    """The body field a schema message names ("params.cfg_value=...", "reference_audio of row 0: ...")."""
    if m := re.match(r"params\.(\w+)", message):
        return m.group(1)
    if m := re.match(r"(reference_audio|reference_text|input|voice|consent_attestation|audio)\b", message):
        return m.group(1)
    return "input" if message.startswith("text of row") else None


def bad_request(e: RequestError) -> ApiError:
    return ApiError(400, str(e), _param_of(str(e)))


@dataclass(frozen=True)
class Speech:
    """A checked request, ready to say."""

    request: Request
    response_format: str
    streamed: bool
    voice: str  # the metrics and header label

    @property
    def media_type(self) -> str:
        return FORMATS[self.response_format][2]


def parse_body(raw: Any, voices: VoiceStore, limits: Limits, locale: str = ASSUMED_LOCALE,
               cloning: Cloning | None = None) -> Speech:
    """`locale`: the served model's, for a voice that recorded none. `cloning`: whose reference_audio may be
    cloned (serve.cloning; None: attested, with no records)."""
    for key in raw if isinstance(raw, dict) else ():
        if shown(key) != key[:80]:
            raise ApiError(400, f"{shown(key)}: a field name with a lone UTF-16 surrogate; send valid "
                           "Unicode")
    try:
        body = SpeechBody.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        field = shown(".".join(str(x) for x in err["loc"])) or None
        raise ApiError(400, f"{field or 'body'}: {err['msg']}", field) from None
    try:
        check_text(body.input, "input")
    except RequestError as e:
        raise bad_request(e) from None
    if body.response_format not in FORMATS:
        raise ApiError(400, f"response_format {quoted(body.response_format)}: not offered; one of "
                       f"{', '.join(FORMATS)}", "response_format")
    if body.speed != 1.0:
        raise ApiError(400, f"speed {body.speed:g}: only 1.0 is offered (VoxCPM2 speaks at its own pace)",
                       "speed")
    if body.stream_format not in (None, "audio"):
        raise ApiError(400, f"stream_format {quoted(body.stream_format)}: only 'audio' (raw chunks) is "
                       "offered", "stream_format")
    if body.stream_format == "audio" and body.response_format not in STREAMED:
        raise ApiError(400, f"stream_format 'audio' needs response_format {' or '.join(STREAMED)}",
                       "response_format")
    if body.instructions:
        raise ApiError(400, "instructions: not offered; the voice comes from `voice` or reference_audio",
                       "instructions")
    reference, reference_text, label, voice_locale = _voice(body, voices)
    params = {k: getattr(body, k) for k in (*GENERATION_KEYS, *TEXT_KEYS) if getattr(body, k) is not None}
    try:
        request = parse_request([body.input], [reference], params, limits, reference_text,
                                voice_locale or locale)
        if label == REFERENCE_VOICE:  # a well-formed clip: whether it may be cloned
            (cloning or Cloning()).allow(body.consent_attestation, "reference_audio")
    except RequestError as e:
        raise bad_request(e) from None
    streamed = body.stream_format == "audio" or body.response_format == "pcm"
    return Speech(request, body.response_format, streamed, label)


def _voice(body: SpeechBody, voices: VoiceStore) -> tuple[str | None, str | None, str, str | None]:
    """(reference clip in base64, its transcript, the voice label, its locale or None) for the body's voice
    or clip."""
    name = body.voice.get("id") if isinstance(body.voice, dict) else body.voice
    if not isinstance(name, str) or not name:
        raise ApiError(400, "voice: give a voice id (GET /v1/audio/voices) or 'default'", "voice")
    if body.reference_audio is not None:
        if name != DEFAULT_VOICE:
            raise ApiError(400, f"voice {quoted(name)} and reference_audio both given; send voice 'default' "
                           "with reference_audio, or leave reference_audio out", "voice")
        return body.reference_audio, body.reference_text, REFERENCE_VOICE, None
    if name == DEFAULT_VOICE:
        return None, body.reference_text, DEFAULT_VOICE, None  # reference_text alone: refused by the schema
    found = voices.find(name)
    if found is None:
        known = ", ".join([DEFAULT_VOICE, *(v.id for v in voices.all())][:20])
        raise ApiError(400, f"voice {quoted(name)}: no such voice; known: {known} (GET /v1/audio/voices)",
                       "voice")
    voice, folder = found
    return voice.clip_base64(folder), body.reference_text or voice.text, voice.id, voice.locale


@dataclass
class Said:
    """What a request made so far, for the metrics."""

    audio_seconds: float = 0.0
    first_chunk_s: float | None = None


def say(batcher: Batcher, speech: Speech, admission: Admission, deadline: Deadline, said: Said
        ) -> Iterator[np.ndarray]:
    """The request's audio, one sentence at a time, each a row of the batcher's batch (which marks it, so a
    streamed answer is marked chunk by chunk), inside one admission slot (taken at the first next(), given
    back when the generator ends or is closed)."""
    asked = time.perf_counter()
    admission.enter(deadline)
    try:
        start = time.perf_counter()
        # the first sentence's wait includes the waiting room's
        for future in batcher.submit(speech.request, sentences(speech.request.spoken[0]), deadline, asked):
            audio = future.result()
            said.audio_seconds += audio.size / batcher.model.audio_vae.out_sample_rate
            if said.first_chunk_s is None:
                said.first_chunk_s = time.perf_counter() - start
            yield audio
    finally:
        admission.leave()
