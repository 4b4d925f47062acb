"""The HTTP app of `voxpipe serve` (FastAPI): OpenAI's speech routes, the voices, /v1/models, the probes and
/metrics. Closed and bounded: with VOXPIPE_API_KEY set every route but /health needs `Authorization: Bearer
<key>`; a body is read only up to the schema's limit (MAX_BODY_BYTES: the longest text and reference clip);
every refusal is a 4xx in OpenAI's error shape with one line naming the field, and no answer carries a
traceback (an unexpected fault is a 500 saying only that, its stack in the server's log)."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from voxpipe.errors import quoted
from voxpipe.serve.admission import Admission, Busy
from voxpipe.serve.deadline import Deadline, RequestStopped
from voxpipe.serve.formats import encode, pcm16, streamed_wav_header
from voxpipe.serve.metrics import Metrics
from voxpipe.serve.openai_speech import ApiError, Said, Speech, bad_request, parse_body, say
from voxpipe.serve.request import MAX_REFERENCE_BYTES_PER_SECOND, MAX_TEXT_CHARS, Limits, RequestError
from voxpipe.serve.voices import VoiceStore

if TYPE_CHECKING:
    from voxpipe.serve.server import ServedModel

log = logging.getLogger("voxpipe.serve")
API_KEY_ENV = "VOXPIPE_API_KEY"
OPEN_ROUTES = ("/health",)  # liveness answers without the key


def max_body_bytes(limits: Limits) -> int:
    """The largest body a valid request can be: the longest reference clip in base64, its transcript and the
    input (4 bytes a character at most in UTF-8, 6 escaped in JSON), and room for the other fields."""
    clip = int(limits.max_reference_seconds * MAX_REFERENCE_BYTES_PER_SECOND * 4 / 3)
    return clip + 2 * 6 * MAX_TEXT_CHARS + (64 << 10)


@dataclass
class Service:
    limits: Limits
    deadline_s: float
    admission: Admission
    voices_folder: Path
    max_voices: int
    max_voice_bytes: int
    api_key: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    served: ServedModel | None = None  # set once the model is loaded (/ready)
    voices: VoiceStore | None = None
    load_error: str | None = None

    def loaded(self) -> tuple[ServedModel, VoiceStore]:
        if self.served is None or self.voices is None:
            raise ApiError(503, self.load_error or "the model is still loading; GET /ready answers 200 once "
                           "it is")
        return self.served, self.voices

    def labels(self, voice: str) -> dict[str, str]:
        served = self.served
        served = self.served
        return {"version": served.version if served else "",
                "adapter": served.adapter_label if served else "", "voice": voice}


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _read_body(request: Request, limit: int) -> Any:
    """The JSON body, read up to `limit` bytes; past it a 413. What is over is read and dropped, up to as much
    again, so that the client (still sending) gets the answer rather than a reset connection."""
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > 2 * limit:
            break
        if total <= limit:
            chunks.append(chunk)
    if total > limit:
        raise ApiError(413, f"the body is over {limit} bytes, the most a request can need (the longest text "
                       "and reference clip)")
    try:
        return json.loads(b"".join(chunks) or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not JSON ({e}); send a JSON object") from None


def build_app(service: Service) -> FastAPI:
    app = FastAPI(title="voxpipe serve", docs_url=None, redoc_url=None, openapi_url=None)
    limit = max_body_bytes(service.limits)
    metrics = service.metrics
    metrics.in_flight.set_function(lambda: service.admission.admitted)

    @app.middleware("http")
    async def closed_and_counted(request: Request, call_next):
        start = time.perf_counter()
        route = request.url.path if request.url.path in KNOWN else "other"
        if service.api_key and request.url.path not in OPEN_ROUTES:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {service.api_key}".encode()):
                response = _error(ApiError(401, "a missing or wrong API key: send Authorization: Bearer "
                                           f"<key> (the server's ${API_KEY_ENV})"))
                metrics.requests.labels(route, "401").inc()
                return response
        try:
            response = await call_next(request)
        except Exception:  # noqa: BLE001 - the stack goes to the log, never to the client
            log.exception("voxpipe serve: %s %s failed", request.method, request.url.path)
            response = JSONResponse(ApiError(500, "internal error; the server's log has the details").body(),
                                    status_code=500)
        metrics.requests.labels(route, str(response.status_code)).inc()
        if not isinstance(response, StreamingResponse) or response.status_code >= 400:
            metrics.latency.labels(route).observe(time.perf_counter() - start)
        return response

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        metrics.errors.labels(request.url.path if request.url.path in KNOWN else "other", str(e.status)).inc()
        return _error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return _error(ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}"))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        err = e.errors()[0]
        return _error(ApiError(400, f"{'.'.join(map(str, err['loc']))}: {err['msg']}"))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> dict[str, str]:
        served, _ = service.loaded()
        return {"status": "ready", "model": served.version}

    @app.get("/metrics")
    async def metrics_page() -> Response:
        return Response(metrics.page(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        served, _ = service.loaded()
        return {"object": "list", "data": [{"id": served.version, "object": "model",
                                            "created": served.created, "owned_by": "voxpipe",
                                            "adapter": served.adapter}]}

    @app.get("/v1/audio/voices")
    async def list_voices() -> dict[str, Any]:
        _, voices = service.loaded()
        listed = [{"id": "default", "name": "default", "origin": "model", "text": None, "seconds": None,
                   "description": "no reference: the voice the model learned"}]
        listed += [{"id": v.id, "name": v.speaker, "origin": v.origin, "text": v.text, "seconds": v.seconds}
                   for v in voices.all()]
        return {"object": "list", "voices": listed}

    @app.post("/v1/audio/voices")
    async def add_voice(request: Request) -> JSONResponse:
        _, voices = service.loaded()
        body = await _read_body(request, limit)
        if not isinstance(body, dict) or set(body) - {"name", "audio", "text"}:
            raise ApiError(400, "send a JSON object {name, audio (the clip's bytes in base64), text "
                           "(what the clip says)}")
        try:
            voice = await run_in_threadpool(voices.add, body.get("name"), body.get("audio"), body.get("text"),
                                            service.limits)
        except RequestError as e:
            raise ApiError(400, str(e), str(e).split(":")[0].split()[0]) from None
        return JSONResponse({"id": voice.id, "name": voice.speaker, "origin": voice.origin,
                             "text": voice.text, "seconds": voice.seconds}, status_code=201)

    @app.delete("/v1/audio/voices/{vid}")
    async def delete_voice(vid: str) -> dict[str, Any]:
        _, voices = service.loaded()
        try:
            gone = voices.delete(vid)
        except RequestError as e:
            raise ApiError(400, str(e), "voice") from None
        if not gone:
            raise ApiError(404, f"voice {quoted(vid)}: no added voice of that id", "voice")
        return {"id": vid, "deleted": True}

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        deadline = Deadline(service.deadline_s)
        served, voices = service.loaded()
        raw = await _read_body(request, limit)
        speech = await run_in_threadpool(parse_body, raw, voices, service.limits)
        labels = service.labels(speech.voice)
        said = Said()
        chunks = say(served.model, speech, service.admission, deadline, said)
        watcher = asyncio.create_task(_watch(request, deadline))
        start = time.perf_counter()
        try:
            first = await run_in_threadpool(next, chunks, None)  # a 429 / 503 / 400 is still a status here
        except (Busy, RequestStopped, RequestError) as e:
            watcher.cancel()
            raise _refusal(e) from None
        headers = {"X-Sample-Rate": str(served.sample_rate), "X-Voxpipe-Model-Version": served.version,
                   "X-Voxpipe-Adapter": served.adapter_label, "X-Voxpipe-Voice": speech.voice}
        metrics.first_byte.labels(**labels).observe(time.perf_counter() - start)
        if speech.streamed:
            def done() -> None:
                metrics.spoken(labels, said.audio_seconds, time.perf_counter() - start)
                metrics.latency.labels("/v1/audio/speech").observe(time.perf_counter() - start)

            body = _stream(first, chunks, speech, served.sample_rate, deadline, done)
            return StreamingResponse(body, media_type=speech.media_type, headers=headers)
        try:
            rest = await run_in_threadpool(list, chunks)
        except (RequestStopped, RequestError) as e:
            raise _refusal(e) from None
        finally:
            watcher.cancel()
        audio = np.concatenate([a for a in (first, *rest) if a is not None])
        metrics.spoken(labels, said.audio_seconds, time.perf_counter() - start)
        data = await run_in_threadpool(encode, audio, served.sample_rate, speech.response_format)
        return Response(data, media_type=speech.media_type, headers=headers)

    KNOWN = {r.path for r in app.routes}  # noqa: N806 - the routes' own paths label the metrics
    return app


def _refusal(e: Exception) -> ApiError:
    if isinstance(e, Busy):
        return ApiError(429, str(e))
    if isinstance(e, RequestStopped):
        return ApiError(503, str(e))
    return bad_request(e)


async def _watch(request: Request, deadline: Deadline) -> None:
    """Marks the request's deadline `gone` when its client disconnects, so its generation stops at the next
    patch rather than running on for nobody."""
    while not deadline.gone.is_set():
        if await request.is_disconnected():
            deadline.gone.set()
            return
        await asyncio.sleep(0.25)


def _stream(first: np.ndarray | None, chunks: Iterator[np.ndarray], speech: Speech, rate: int,
            deadline: Deadline, done: Callable[[], None]) -> Iterator[bytes]:
    """The response body: each sentence's PCM as it is made (a WAV header first for wav); a deadline that
    passes mid-stream ends the stream there (the status is sent already), and the log says so."""
    try:
        if speech.response_format == "wav":
            yield streamed_wav_header(rate)
        if first is not None:
            yield pcm16(first)
        for audio in chunks:
            yield pcm16(audio)
        done()
    except RequestStopped as e:
        log.warning("voxpipe serve: a streamed request stopped: %s", e)
    finally:
        chunks.close()  # gives the slot back, also when the client left mid-stream
        deadline.gone.set()  # ends the watcher (a task of the event loop: not cancelled from this thread)
