"""The evaluation backends by kind and name: the one place each is registered.

Three kinds, one small registry each: `ASR` (evaluate.asr, a list: each language takes the first
that covers it), `SPEAKER` (evaluate.speaker, one encoder) and `QUALITY` (DNSMOS, the only one; no
param picks it). An entry is the backend's name, the evaluate.* fields its factory takes (by name,
from the evaluate params) and the factory itself, as "module:callable".

The factory is named, not imported: this module sits in the bottom layer (params.py validates
evaluate.asr / evaluate.speaker against these names), below the evaluate modules that hold the
backends, so it imports one only when evaluate loads it (`Backend.load`).

Adding a backend: its class in its kind's module (voxpipe/evaluate/asr.py, speaker.py, quality.py;
the wavlm-ecapa speaker encoder has a module of its own, ecapa.py),
one entry here, its config field in params.py's EvaluateParams if it takes one, its test, and the docs
(`make generate` for params.yaml and docs/params.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Backend:
    name: str
    factory: str  # "module:callable": a class or function returning the backend
    fields: tuple[str, ...] = ()  # evaluate.* params passed to the factory, as keyword arguments
    about: str = ""  # what evaluate.asr / evaluate.speaker's description says of it
    label: str = ""  # what a figure calls its scores (eval.png); the name when empty

    def load(self, config: Mapping[str, Any], **extra: Any) -> Any:
        """The backend, built from its fields of `config` (the evaluate params; a missing one is None)."""
        module, attr = self.factory.split(":")
        make = getattr(importlib.import_module(module), attr)
        return make(**{f: config.get(f) for f in self.fields}, **extra)


def _registry(*backends: Backend) -> dict[str, Backend]:
    return {b.name: b for b in backends}


ASR = _registry(
    Backend("pocketsphinx", "voxpipe.evaluate.asr:PocketSphinx", about="bundled, English"),
    Backend("whisper", "voxpipe.evaluate.asr:Whisper", ("whisper_model",), about="whisper_model"),
    Backend("paraformer-zh", "voxpipe.evaluate.asr:ParaformerZh", ("paraformer_model",),
            about="paraformer_model, Chinese"),
)
SPEAKER = _registry(
    Backend("resemblyzer", "voxpipe.evaluate.speaker:SpeakerEncoder", about="bundled GE2E", label="GE2E"),
    Backend("wavlm", "voxpipe.evaluate.speaker:WavLMEncoder", ("wavlm_model",),
            about="WavLMForXVector from wavlm_model", label="WavLM x-vector"),
    Backend("wavlm-ecapa", "voxpipe.evaluate.ecapa:WavLMEcapaEncoder", ("ecapa_model",),
            about="ecapa_model, Seed-TTS-eval's WavLM-Large + ECAPA-TDNN: published SIM's model",
            label="WavLM-ECAPA (Seed-TTS-eval)"),
)
QUALITY = _registry(Backend("dnsmos", "voxpipe.evaluate.quality:DnsmosScorer", label="DNSMOS"))
QUALITY_BACKEND = "dnsmos"  # what evaluate scores clips with (one backend: no param picks it)


def listed(registry: Mapping[str, Backend]) -> str:
    """`name (about), ...` for a param's description."""
    return ", ".join(f"{b.name} ({b.about})" if b.about else b.name for b in registry.values())
