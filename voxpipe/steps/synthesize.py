"""`synthesize`'s section (the request bounds serve and the pyfunc share too) and its step."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from voxpipe.section import Section
from voxpipe.steps import Step


class SynthesizeParams(Section):
    """`synthesize`: text to a WAV file with a registered model or a checkpoint folder, optionally in the
    voice of a reference clip (the pyfunc model's `reference_audio`). Same seed, same audio."""

    model: str = Field(
        "@champion", description="a registered model (models:/NAME@ALIAS, models:/NAME/VERSION, or @ALIAS / "
        "a version number of register.model_name: the voice's own model by default, from tracking.uri) or a "
        "checkpoint folder (upstream layout)"
    )
    text: str = Field("", max_length=2000, description="what to say (at most 2000 characters; the served "
                      "model takes the same)")
    normalize: bool = Field(
        True, description="spell out numbers, dates and money before speaking, as ingest did for training "
        "(the same function and language detection; the summary shows what was said); --no-normalize: "
        "the text as written. The served model takes the same as its `normalize` param"
    )
    locale: str = Field(  # checked by the request schema (serve/request.py), as the served model does
        "", description="how the text is read: en-US, en-GB or zh-CN (as ingest.locale); \"\": the "
        "locale the model's training text was read in, recorded at register (en-US, said so, for a model "
        "that recorded none). The served model takes the same as its `locale` param"
    )
    reference: str | None = Field(
        None, description="an audio file of the voice to speak in (a few seconds is enough; at most "
        "max_reference_seconds); None: the voice the model learned"
    )
    max_reference_seconds: float = Field(
        30.0, gt=0, le=600, description="longest reference clip accepted, here and by the served model (a "
        "longer one costs memory and time, not quality)"
    )
    out: str = Field("work/synthesize/out.wav", description="the WAV file written (48 kHz, 16 bit)",
                     json_schema_extra={"result": False})
    device: Literal["auto", "cpu", "cuda", "npu"] = Field(
        "auto", description="auto = npu, else cuda, else cpu"
    )
    seed: int = Field(0, ge=0, le=2**53, description="generation seed (0 to 2^53): the same seed and "
                      "inputs give the same audio")
    cfg_value: float = Field(2.0, gt=0, le=20, description="classifier-free guidance scale (finite, (0, 20])")
    inference_timesteps: int = Field(10, ge=1, le=100, description="Euler steps per patch (1-100)")
    max_len: int | None = Field(None, ge=1, le=4096, description="generation limit in patches (160 ms each; "
                                "1-4096); None: sized for the text, 25 + 2 per character (a request that "
                                "leaves it out never runs to the 4096 maximum)")
    deadline_s: float = Field(
        50.0, gt=0, le=3600, description="the most seconds one request may take (`synthesize`, the served "
        "pyfunc, `voxpipe serve`): generation stops at it, its memory is freed and the answer is a 503 "
        "naming it; below MLflow's 60 s scoring timeout, so the work ends before that server gives up on "
        "the client"
    )
    watermark: Literal["perth", "off"] = Field(
        "perth", description="the mark in the audio of every clip synthesize, serve and evaluate's samples "
        "make (voxpipe/evaluate/marks.py): perth = Resemble's PerTh neural watermark, which `voxpipe detect` "
        "reads back; off needs watermark_off_reason, which the model card records"
    )
    watermark_off_reason: str = Field(
        "", max_length=500, validate_default=True, description="why the clips go unmarked (required with "
        "watermark: off; recorded in the model card)"
    )
    c2pa_key: str = Field(
        "", description="the team's C2PA signing key (PEM) by reference, never its value: a file path, or "
        "env:NAME for an environment variable that holds the PEM; \"\": WAV and MP3 go out without a C2PA "
        "manifest, and serve says so in its X-Voxpipe-C2PA header",
        json_schema_extra={"result": False}
    )
    c2pa_cert: str = Field(
        "", description="the certificate chain (PEM, signer first) that goes with c2pa_key: a file path or "
        "env:NAME", json_schema_extra={"result": False}
    )

    @field_validator("watermark", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        """YAML 1.1 reads a bare `off` as false: it means "off" here."""
        return "off" if value is False else value

    @field_validator("watermark_off_reason")
    @classmethod
    def _off_says_why(cls, reason: str, info: ValidationInfo) -> str:
        if info.data.get("watermark") == "off" and not reason.strip():
            raise ValueError(
                "synthesize.watermark is off but watermark_off_reason is empty: an unmarked clip cannot be "
                "told from a real recording, so turning the watermark off needs its reason on record (the "
                "model card shows it). Set synthesize.watermark_off_reason, or leave synthesize.watermark "
                "at perth")
        return reason

ORDER = 150
SECTIONS = {"synthesize": SynthesizeParams}

STEPS = (
    Step("synthesize", "say --text with a registered model (models:/NAME@champion) or a checkpoint folder "
         "into a WAV file, optionally in the voice of --reference",
         target="voxpipe.serve.synthesize:synthesize",
         reads=("synthesize", "register.model_name", "ingest.input", "tracking.uri", "tracking.work"),
         out_folder=False),
)
