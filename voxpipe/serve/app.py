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
import threading
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
from starlette.requests import ClientDisconnect

from voxpipe.errors import quoted
from voxpipe.evaluate.provenance import MIME, UNSIGNED, Credentials, sign
from voxpipe.serve.admission import Admission, Busy
from voxpipe.serve.cloning import FIELD, Cloning
from voxpipe.serve.deadline import ClientGone, Deadline, RequestStopped
from voxpipe.serve.formats import encode, pcm16, streamed_wav_header
from voxpipe.serve.metrics import Metrics
from voxpipe.serve.openai_speech import ApiError, Said, Speech, bad_request, parse_body, say
from voxpipe.serve.request import MAX_REFERENCE_BYTES_PER_SECOND, MAX_TEXT_CHARS, Limits, RequestError
from voxpipe.serve.voices import VoiceStore
from voxpipe.steps.serve import ServeParams
from voxpipe.track.voices import DEFAULT_VOICE

if TYPE_CHECKING:
    from voxpipe.serve.batcher import Batcher
    from voxpipe.serve.served import ServedModel

log = logging.getLogger("voxpipe.serve")
access = logging.getLogger("voxpipe.serve.access")
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
    body_timeout_s: float = ServeParams.model_fields["body_timeout_s"].default
    metrics: Metrics = field(default_factory=Metrics)
    served: ServedModel | None = None  # set once the model is loaded (/ready)
    batcher: Batcher | None = None  # generation's one thread, with the model
    voices: VoiceStore | None = None
    cloning: Cloning = field(default_factory=Cloning)  # attested, with no records: no clip is cloned
    load_error: str | None = None
    watermark: str = "perth"  # synthesize.watermark: every sentence is marked as it is made (marks.py)
    c2pa: Credentials | None = None  # the key that signs non-streamed WAV and MP3 (provenance.py)

    def loaded(self) -> tuple[ServedModel, VoiceStore]:
        if self.served is None or self.voices is None or self.batcher is None:
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


async def _read_body(request: Request, limit: int, timeout_s: float) -> Any:
    """The JSON body, read up to `limit` bytes; past it a 413. What is over is read and dropped, up to as much
    again, so that the client (still sending) gets the answer rather than a reset connection. A body still
    arriving after `timeout_s` is a 408 (a slow client holds no connection for longer)."""
    chunks, total = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                total += len(chunk)
                if total > 2 * limit:
                    break
                if total <= limit:
                    chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"the body did not arrive within {timeout_s:g} s (serve.body_timeout_s); send it "
                       "at once") from None
    except ClientDisconnect:
        raise ApiError(400, "the client left before its body was sent") from None
    if total > limit:
        raise ApiError(413, f"the body is over {limit} bytes, the most a request can need (the longest text "
                       "and reference clip)")
    try:
        return json.loads(b"".join(chunks) or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not JSON ({str(e)[:120]}); send a JSON object") from None
    except RecursionError:
        raise ApiError(400, "the body is JSON nested too deep; send a flat JSON object") from None


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
                _access(request, 401, start)
                return response
        try:
            response = await call_next(request)
        except Exception:  # noqa: BLE001 - the stack goes to the log, never to the client
            log.exception("voxpipe serve: %s %s failed", request.method, request.url.path)
            response = JSONResponse(ApiError(500, "internal error; the server's log has the details").body(),
                                    status_code=500)
        metrics.requests.labels(route, str(response.status_code)).inc()
        if not getattr(request.state, "streamed", False):  # (a stream's when it ends: `_stream`)
            metrics.latency.labels(route).observe(time.perf_counter() - start)
            _access(request, response.status_code, start)
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
        served, voices = service.loaded()
        listed = [{"id": DEFAULT_VOICE, "name": DEFAULT_VOICE, "origin": "model", "text": None,
                   "seconds": None, "locale": served.locale,
                   "description": "no reference: the voice the model learned"}]
        names = {DEFAULT_VOICE}
        for v in voices.all():  # a speaker named like one listed already (a single-speaker set's "default")
            name = v.speaker if v.speaker not in names else v.id  # is named by its id, unique
            names.add(name)
            listed.append({"id": v.id, "name": name, "origin": v.origin, "text": v.text,
                           "seconds": v.seconds, "locale": v.locale or served.locale,  # text read in it
                           # recorded with the voice, else (a version registered before) ingest.input's
                           "consent": v.consent or (service.cloning.scope_of(v.speaker)
                                                    if v.origin == "model" else None)})
        return {"object": "list", "voices": listed}

    @app.post("/v1/audio/voices")
    async def add_voice(request: Request) -> JSONResponse:
        _, voices = service.loaded()
        body = await _read_body(request, limit, service.body_timeout_s)
        if not isinstance(body, dict) or set(body) - {"name", "audio", "text", FIELD}:
            raise ApiError(400, "send a JSON object {name, audio (the clip's bytes in base64), text "
                           f"(what the clip says), {FIELD} (the consent record's id)}}")
        try:
            def consent() -> dict[str, Any] | None:
                return service.cloning.scope_of_id(service.cloning.allow(body.get(FIELD), "audio"))

            voice = await run_in_threadpool(voices.add, body.get("name"), body.get("audio"), body.get("text"),
                                            service.limits, consent)
        except RequestError as e:
            raise ApiError(400, str(e), str(e).split(":")[0].split()[0]) from None
        return JSONResponse({"id": voice.id, "name": voice.speaker, "origin": voice.origin,
                             "text": voice.text, "seconds": voice.seconds,
                             "consent": voice.consent}, status_code=201)

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
        raw = await _read_body(request, limit, service.body_timeout_s)
        speech = await run_in_threadpool(parse_body, raw, voices, service.limits, served.locale,
                                         service.cloning)
        labels = service.labels(speech.voice)
        said = Said()
        request.state.voice, request.state.said = speech.voice, said  # for the access log line
        chunks = say(service.batcher, speech, service.admission, deadline, said)
        watcher = asyncio.create_task(_watch(request, deadline))
        start = time.perf_counter()
        try:
            first = await run_in_threadpool(next, chunks, None)  # a 429 / 503 / 400 is still a status here
        except (Busy, RequestStopped, RequestError) as e:
            watcher.cancel()
            raise _refusal(e) from None
        headers = {"X-Sample-Rate": str(served.sample_rate), "X-Voxpipe-Model-Version": served.version,
                   "X-Voxpipe-Adapter": served.adapter_label, "X-Voxpipe-Voice": speech.voice,
                   "X-Voxpipe-Locale": speech.request.locale,  # the input was read in it
                   "X-Voxpipe-Watermark": service.watermark,
                   "X-Voxpipe-C2PA": _c2pa_state(service, speech)}
        metrics.first_byte.labels(**labels).observe(time.perf_counter() - start)
        if speech.streamed:
            def done() -> None:
                metrics.spoken(labels, said.audio_seconds, time.perf_counter() - start)
                metrics.latency.labels("/v1/audio/speech").observe(time.perf_counter() - start)

            def finish() -> None:
                chunks.close()  # gives the slot back
                _access(request, 200, start, "streamed, the client left" if deadline.gone.is_set() else
                        "streamed")

            body = Stoppable(_stream(first, chunks, speech, served.sample_rate, done), deadline.gone, finish)
            watcher.add_done_callback(lambda _: body.stop())  # the client left, or the answer is sent
            request.state.streamed = True  # its access line is written when the stream ends
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
        if headers["X-Voxpipe-C2PA"] == "signed":
            data = await run_in_threadpool(sign, data, speech.response_format, service.c2pa, "speech",
                                           served.version, None, service.watermark)
        return Response(data, media_type=speech.media_type, headers=headers)

    KNOWN = {r.path for r in app.routes}  # noqa: N806 - the routes' own paths label the metrics
    return app


def _access(request: Request, status: int, start: float, how: str = "") -> None:
    """The access log line of a request: method, route (its template: no id, no query), status, seconds, the
    audio's seconds and the voice; never the text, a clip or the key."""
    route = getattr(request.scope.get("route"), "path", None) or "other"
    said = getattr(request.state, "said", None)
    audio = f"{said.audio_seconds:.2f} s of audio" if said else "no audio"
    access.info("%s %s %d %.3f s, %s, voice %s%s", request.method, route, status,
                time.perf_counter() - start, audio, getattr(request.state, "voice", "-"),
                f" ({how})" if how else "")


def _refusal(e: Exception) -> ApiError:
    if isinstance(e, Busy):
        return ApiError(429, str(e))
    if isinstance(e, ClientGone):
        return ApiError(499, str(e))  # nginx's "client closed request": for the log and the metrics alone
    if isinstance(e, RequestStopped):
        return ApiError(503, str(e))
    return bad_request(e)


async def _watch(request: Request, deadline: Deadline) -> None:
    """Marks the request's deadline `gone` when its client disconnects, so its generation stops at the next
    patch rather than running on for nobody. It waits on the ASGI receive channel, which (the body read)
    yields nothing until `http.disconnect`: uvicorn sends that the moment the connection is lost."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)  # not the protocol's order; never a busy loop
    deadline.gone.set()


class Stoppable:
    """A streamed answer's chunks, which a client's leaving ends at once. Starlette pulls each chunk in a
    worker thread and, when the client leaves, stops pulling but does not close the generator: suspended
    between sentences, it held the request's slot until the garbage collector came by (10 s and more)."""

    def __init__(self, chunks: Iterator[bytes], gone: threading.Event, finish: Callable[[], None]) -> None:
        self.chunks, self.gone, self.finish = chunks, gone, finish  # finish: once, when the stream ends
        self.lock, self.finished = threading.Lock(), False

    def __iter__(self) -> Stoppable:
        return self

    def __next__(self) -> bytes:
        with self.lock:
            try:
                if not self.gone.is_set():
                    chunk = next(self.chunks)  # a generation the client leaves stops at its next patch
                    if not self.gone.is_set():
                        return chunk
            except BaseException:  # the end (StopIteration) or a fault: the slot goes back either way
                self._finish()
                raise
            self._finish()
            raise StopIteration

    def stop(self) -> None:
        """Ends the stream now if it is between sentences; while one is being made the generation stops
        itself at its next patch (the deadline's `gone`), and __next__ ends the stream after it."""
        if self.lock.acquire(blocking=False):
            try:
                self._finish()
            finally:
                self.lock.release()

    def _finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.chunks.close()
            self.finish()


def _c2pa_state(service: Service, speech: Speech) -> str:
    """What the X-Voxpipe-C2PA header says: "signed", or why the answer carries no manifest."""
    if speech.streamed:
        return "unsigned (streamed: the watermark marks it)"
    if speech.response_format not in MIME:
        return f"unsigned ({speech.response_format}: manifests go in wav and mp3)"
    return "signed" if service.c2pa is not None else UNSIGNED


def _stream(first: np.ndarray | None, chunks: Iterator[np.ndarray], speech: Speech, rate: int,
            done: Callable[[], None]) -> Iterator[bytes]:
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
