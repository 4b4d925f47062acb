"""`serve`'s section and step: OpenAI's speech API over a registered model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Step


class ServeParams(Section):
    """`serve`: the registered model (or a checkpoint folder) behind OpenAI's speech API on HTTP
    (docs/serving.md). Requests are checked by the `synthesize` section's bounds and deadline."""

    model: str = Field("@champion", description="what to serve, as synthesize.model names it: @ALIAS, a "
                       "version number, models:/NAME@ALIAS or a checkpoint folder")
    host: str = Field("127.0.0.1", description="the address to listen on; 127.0.0.1 = this machine only "
                      "(0.0.0.0 in a pod, with VOXPIPE_API_KEY set)")
    port: int = Field(8000, ge=1, le=65535, description="the TCP port")
    device: Literal["auto", "cpu", "cuda", "npu"] = Field("auto", description="auto = cuda when available, "
                                                          "else cpu")
    base: str | None = Field(None, description="a LoRA run's base checkpoint folder: serve it with the "
                             "model's lora/ adapter applied unmerged (None: the model's merged weights)")
    voices: str = Field("work/serve/voices", description="the folder the voices that clients add "
                        "(POST /v1/audio/voices) are kept in, across restarts")
    cloning: Literal["off", "attested", "open"] = Field(
        "attested", description="voice cloning from a clip (reference_audio, POST /v1/audio/voices): "
        "attested = the request's consent_attestation names a voices.yaml record of ingest.input with scope "
        "voice_clone; off = refused; open = any clip (docs/responsible-release.md)")
    max_voices: int = Field(32, ge=0, le=1000, description="most voices clients may add")
    max_voice_bytes: int = Field(64 * 2**20, ge=0, le=2**34, description="most bytes of added voice clips "
                                 "together")
    concurrency: int = Field(8, ge=1, le=64, description="requests generating at once, each a row of one "
                             "batch (the batch size): a row joins between patches and leaves when its "
                             "sentence ends; each holds its KV caches")
    queue: int = Field(16, ge=0, le=256, description="requests waiting for a row of the batch (the waiting "
                       "room); past them a 429, and a 503 when one waits past its deadline")
    batch_window_ms: float = Field(10.0, ge=0, le=1000, description="milliseconds an idle batcher waits "
                                   "after a request arrives for others to start with it (later ones join "
                                   "between patches)")
    max_connections: int = Field(64, ge=1, le=10000, description="open connections at most; past it a new "
                                 "one closes the oldest still waiting for its request (/health still "
                                 "answers)")
    header_timeout_s: float = Field(10.0, gt=0, le=300, description="seconds a connection has to send a "
                                    "request's line and headers; then it is closed (slow clients, slowloris)")
    body_timeout_s: float = Field(60.0, gt=0, le=3600, description="seconds a request has to send its body "
                                  "once its headers are in; then a 408")
    stall_timeout_s: float = Field(30.0, gt=0, le=3600, description="seconds a client may leave its answer "
                                   "unread (the send buffer full); then it is cut off, its request stopped")
    keep_alive_s: float = Field(5.0, gt=0, le=300, description="seconds an idle kept-alive connection stays "
                                "open between requests (uvicorn's timeout_keep_alive)")


ORDER = 160
SECTIONS = {"serve": ServeParams}

STEPS = (
    Step("serve", "serve a registered model (@champion) or a checkpoint folder on OpenAI's speech API: "
         "/v1/audio/speech (streamed PCM), /v1/audio/voices, /v1/models, /health, /ready, /metrics",
         target="voxpipe.serve.server:serve",
         reads=("serve", "synthesize.deadline_s", "synthesize.max_reference_seconds", "synthesize.watermark",
                "synthesize.watermark_off_reason", "synthesize.c2pa_key", "synthesize.c2pa_cert",
                "register.model_name", "ingest.input", "tracking.uri", "tracking.work"),
         out_folder=False),
)
