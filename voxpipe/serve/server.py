"""`voxpipe serve`: the registered model (default `@champion`) or a checkpoint folder on OpenAI's speech API,
on FastAPI and uvicorn (routes: app.py, docs/serving.md).

    voxpipe serve                     # register.model_name@champion from tracking.uri, on 127.0.0.1:8000
    voxpipe serve --model @candidate --port 8001
    VOXPIPE_API_KEY=... voxpipe serve --host 0.0.0.0

The server listens at once (/health answers) and loads the model in the background; /ready answers 200,
and one log line says the URL, once it is loaded. A registered version is loaded through MLflow as every
serving path loads it (the pyfunc's load_context), and its voices come from the version itself (the
"voices" artifact `register` logs), so serving needs no data folder.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from voxpipe.cores import use_cores
from voxpipe.errors import StepError
from voxpipe.evaluate.provenance import credentials
from voxpipe.params import Params
from voxpipe.serve.adapter import adapter_sha256
from voxpipe.serve.admission import Admission
from voxpipe.serve.app import API_KEY_ENV, Service, build_app
from voxpipe.serve.batcher import DECODING_STREAMS, Batcher
from voxpipe.serve.cloning import Cloning
from voxpipe.serve.connections import BACKLOG, Guard, check_file_limit, guarded_protocol
from voxpipe.serve.finishing import finishers
from voxpipe.serve.models import check_registered, model_uri
from voxpipe.serve.request import Limits, model_locale
from voxpipe.serve.served import ServedModel
from voxpipe.serve.voices import VoiceStore
from voxpipe.steps.serve import ServeParams
from voxpipe.track.tracking import resolve_tracking_uri, session
from voxpipe.voxcpm2_format import is_checkpoint

if TYPE_CHECKING:
    from voxpipe.model.voxcpm2 import VoxCPM2

log = logging.getLogger("voxpipe.serve")


def _weights(checkpoint: Path, base: str | None, device: str) -> tuple[VoxCPM2, str | None]:
    """The model to serve from a checkpoint folder and its adapter's sha256 (None without one): with
    serve.base, the base plus the folder's lora/ unmerged (serve/adapter.py), else the merged weights."""
    from voxpipe.device import resolve_device_type
    from voxpipe.serve.adapter import load_served as load_checkpoint

    loaded = load_checkpoint(checkpoint, base=base, device=resolve_device_type(device))
    return loaded.model, loaded.adapter_sha256


@dataclass
class ServeResult:
    url: str
    exit_code: int = 0

    def summary(self) -> str:
        return f"serve: stopped ({self.url})" if self.exit_code == 0 else ""  # the error was logged


def resolve(params: Params) -> str:
    """The pinned registry version (models:/NAME/N) or the checkpoint folder to serve, checked before the
    server starts, so that a wrong --model is one paragraph and exit 1, not a server that never gets ready."""
    p = params.serve
    uri = model_uri(p.model, params.registered_model_name())
    if uri is None:
        if not is_checkpoint(p.model):
            raise StepError(f"serve.model {p.model}: neither a registered model (@champion, @ALIAS, a "
                            "version number, models:/NAME@ALIAS) nor a checkpoint folder (no config.json)")
        return p.model
    tracking = params.tracking
    with session(resolve_tracking_uri(tracking.uri, Path(tracking.work))) as client:
        return check_registered(client, uri, "serve.model")


def load_served(params: Params, source: str) -> ServedModel:
    """The model `resolve` named, loaded (a registry version through MLflow's pyfunc loader)."""
    p, s = params.serve, params.synthesize
    if model_uri(source, params.registered_model_name()) is None:
        return _from_folder(Path(source), p)
    import mlflow

    tracking = params.tracking
    with session(resolve_tracking_uri(tracking.uri, Path(tracking.work))):
        loaded = mlflow.pyfunc.load_model(source, model_config={
            "device": p.device, "max_reference_seconds": s.max_reference_seconds, "deadline_s": s.deadline_s})
    tts = loaded.unwrap_python_model()
    voices = Path(tts.voices) if getattr(tts, "voices", None) else None
    model, adapter = tts.model, adapter_sha256(Path(tts.checkpoint))
    if p.base is not None:
        tts.model = None  # the pyfunc's merged copy: replaced by base + adapter, not kept beside it
        model, adapter = _weights(Path(tts.checkpoint), p.base, p.device)
    return ServedModel(model, source, voices, model.audio_vae.out_sample_rate, int(time.time()), adapter,
                       tts.locale)


def _from_folder(folder: Path, params: ServeParams) -> ServedModel:
    model, adapter = _weights(folder, params.base, params.device)
    voices = folder / "voices"
    locale, how = model_locale(None)  # a checkpoint folder records none
    log.info("voxpipe serve: locale %s (%s)", locale, how)
    return ServedModel(model, str(folder), voices if voices.is_dir() else None,
                       model.audio_vae.out_sample_rate, int(time.time()), adapter, locale)


def _check_port(host: str, port: int) -> None:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        raise StepError(f"serve: cannot listen on {host}:{port} ({e.strerror}); choose another --port, or "
                        "--host an address of this machine") from None


def serve(params: Params) -> ServeResult:
    import uvicorn

    p = params.serve
    _check_port(p.host, p.port)
    source = resolve(params)
    url = f"http://{'[' + p.host + ']' if ':' in p.host else p.host}:{p.port}"
    key = os.environ.get(API_KEY_ENV) or None
    if key is None and p.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("voxpipe serve: listening on %s without an API key: anyone who reaches it may use it; "
                    "set $%s", p.host, API_KEY_ENV)
    check_file_limit(p.max_connections)
    service = Service(Limits(params.synthesize.max_reference_seconds), params.synthesize.deadline_s,
                      Admission(p.concurrency, p.queue), Path(p.voices), p.max_voices, p.max_voice_bytes, key,
                      p.body_timeout_s, cloning=Cloning.read(p.cloning, params.ingest.input),
                      watermark=params.synthesize.watermark,
                      c2pa=credentials(params.synthesize.c2pa_key, params.synthesize.c2pa_cert))
    guard = Guard(p.header_timeout_s, p.max_connections, p.stall_timeout_s)
    server = uvicorn.Server(uvicorn.Config(build_app(service), host=p.host, port=p.port, log_level="warning",
                                           access_log=False, timeout_graceful_shutdown=5,
                                           http=guarded_protocol(guard), timeout_keep_alive=p.keep_alive_s,
                                           backlog=BACKLOG))
    result = ServeResult(url)

    def load() -> None:
        try:
            served = load_served(params, source)
            threads = use_cores(event_loop=True, streams=DECODING_STREAMS)
            log.info("voxpipe serve: torch threads %d intra-op, %d inter-op (%d usable cores: one left for "
                     "the event loop, the rest split between generating and finishing)",
                     threads["intra_op_threads"], threads["inter_op_threads"], threads["usable_cores"])
            for kind, n in threads.items():
                service.metrics.threads.labels(kind).set(n)
            finish = finishers(served.model, params.synthesize.watermark, DECODING_STREAMS,
                               threads["intra_op_threads"])
            service.batcher = Batcher(served.model, p.concurrency, p.batch_window_ms / 1000, finish,
                                      service.metrics)
            service.voices = VoiceStore(served.voices, Path(p.voices), p.max_voices, p.max_voice_bytes,
                                        params.synthesize.max_reference_seconds)
            service.served = served
            service.metrics.model.labels(served.version, served.adapter_label).set(1)
        except Exception as e:  # noqa: BLE001 - any fault ends the server with one paragraph, never a
            # server that is up and never ready; the stack only at debug level
            why = str(e) if isinstance(e, StepError) else f"{type(e).__name__}: {str(e)[:200]}"
            log.debug("voxpipe serve: the load failed", exc_info=True)
            service.load_error = f"the model did not load: {why}"
            log.error("voxpipe serve: error: %s", why)
            result.exit_code = 1
            server.should_exit = True
            return
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        log.info("voxpipe serve: ready: %s (adapter %s, %d voices, %d Hz, text read in %s) at %s%s",
                 served.version, served.adapter_label, len(service.voices.all()), served.sample_rate,
                 served.locale, url,
                 "" if key else " (no API key: set $VOXPIPE_API_KEY to require one)")

    threading.Thread(target=load, name="voxpipe-serve-load", daemon=True).start()
    server.run()
    return result
