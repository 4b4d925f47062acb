"""The recognition and evaluation backends by kind and name: the one place each is registered.

Three kinds, one small registry each: `ASR` (ingest.asr and evaluate.asr, lists: each language takes
the first that covers it), `SPEAKER` (evaluate.speaker, one encoder) and `QUALITY` (DNSMOS, the only
one; no param picks it). An entry is the backend's name, the factory itself, as "module:callable", and
its settings model: the fields the factory takes (by name), each with its description. The schema
composes the settings models (`backend_settings`): ASR's into the `asr` section (voxpipe/steps/asr.py,
read by ingest and evaluate), SPEAKER's into evaluate's (voxpipe/steps/evaluate.py), so neither names a
backend or one of their fields.

The factory is named, not imported: this module sits in the bottom layer (params.py validates
ingest.asr / evaluate.asr / evaluate.speaker against these names), below the modules that hold the
backends, so it imports one only when a step loads it (`Backend.load`).

Adding a backend: its class in its kind's module (voxpipe/data/asr.py, which ingest uses too;
voxpipe/evaluate/speaker.py, quality.py; the wavlm-ecapa speaker encoder has a module of its own,
ecapa.py); its entry here, with its settings model (a `Section` of its own fields) if it takes any; its
test; and the docs (`make generate` for params.yaml and docs/params.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from voxpipe.section import Section


@dataclass(frozen=True)
class Backend:
    name: str
    factory: str  # "module:callable": a class or function returning the backend
    settings: type[Section] | None = None  # its own params, passed to the factory as keyword arguments
    about: str = ""  # what evaluate.asr / evaluate.speaker's description says of it
    label: str = ""  # what a figure calls its scores (eval.png); the name when empty

    @property
    def fields(self) -> tuple[str, ...]:
        """The names of its settings: the keys of `config` that `load` passes."""
        return tuple(self.settings.model_fields) if self.settings else ()

    def imported(self) -> Any:
        """The factory itself, its module imported now."""
        module, attr = self.factory.split(":")
        return getattr(importlib.import_module(module), attr)

    def load(self, config: Mapping[str, Any], **extra: Any) -> Any:
        """The backend, built from its fields of `config` (its section's params; a missing one is None)."""
        return self.imported()(**{f: config.get(f) for f in self.fields}, **extra)


def registry(*backends: Backend) -> dict[str, Backend]:
    return {b.name: b for b in backends}


def backend_settings(*registries: Mapping[str, Backend]) -> tuple[type[Section], ...]:
    """The settings models of the registries' backends, in registry order: the bases a schema composes.

    Reversed, so that as bases (`class Params(*backend_settings(...), Core)`) pydantic, which orders
    fields from the last base to the first, puts the core's fields first, then these in registry order.
    """
    models = [b.settings for r in registries for b in r.values() if b.settings]
    return tuple(reversed(list(dict.fromkeys(models))))


class WhisperSettings(Section):
    whisper_model: str | None = Field(
        None, description="local folder of a transformers Whisper model (e.g. whisper-large-v3), for "
        "whisper in ingest.asr / evaluate.asr"
    )


class ParaformerSettings(Section):
    paraformer_model: str | None = Field(
        None, description="local folder of a sherpa-onnx Paraformer (model.onnx, tokens.txt), for "
        "paraformer-zh in ingest.asr / evaluate.asr"
    )


class SenseVoiceSettings(Section):
    sensevoice_model: str | None = Field(
        None, description="local folder of a sherpa-onnx SenseVoice-Small (model.onnx or model.int8.onnx, "
        "tokens.txt), for sensevoice in ingest.asr / evaluate.asr"
    )


class WavLMSettings(Section):
    wavlm_model: str | None = Field(None, description="local folder of a transformers WavLMForXVector model")


class EcapaSettings(Section):
    ecapa_model: str | None = Field(
        None, description="local path of UniSpeech's wavlm_large_finetune.pth (or a .safetensors copy of its "
        "`model` state dict), for speaker wavlm-ecapa: Seed-TTS-eval's SIM model (docs/evaluation.md)"
    )


ASR = registry(
    Backend("pocketsphinx", "voxpipe.data.asr:PocketSphinx", about="bundled, English"),
    Backend("whisper", "voxpipe.data.asr:Whisper", WhisperSettings, about="whisper_model"),
    Backend("paraformer-zh", "voxpipe.data.asr:ParaformerZh", ParaformerSettings,
            about="paraformer_model, Chinese"),
    Backend("sensevoice", "voxpipe.data.asr:SenseVoice", SenseVoiceSettings,
            about="sensevoice_model; zh, en, ja, ko, yue"),
)
SPEAKER = registry(
    Backend("resemblyzer", "voxpipe.evaluate.speaker:SpeakerEncoder", about="bundled GE2E", label="GE2E"),
    Backend("wavlm", "voxpipe.evaluate.speaker:WavLMEncoder", WavLMSettings,
            about="WavLMForXVector from wavlm_model", label="WavLM x-vector"),
    Backend("wavlm-ecapa", "voxpipe.evaluate.ecapa:WavLMEcapaEncoder", EcapaSettings,
            about="ecapa_model, Seed-TTS-eval's WavLM-Large + ECAPA-TDNN: published SIM's model",
            label="WavLM-ECAPA (Seed-TTS-eval)"),
)
QUALITY = registry(Backend("dnsmos", "voxpipe.evaluate.quality:DnsmosScorer", label="DNSMOS"))
QUALITY_BACKEND = "dnsmos"  # what evaluate scores clips with (one backend: no param picks it)


def listed(registry: Mapping[str, Backend]) -> str:
    """`name (about), ...` for a param's description."""
    return ", ".join(f"{b.name} ({b.about})" if b.about else b.name for b in registry.values())
