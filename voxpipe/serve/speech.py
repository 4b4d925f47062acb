"""Texts to speech, optionally in the voice of a reference clip: what the served model and `voxpipe
synthesize` both run, so a registered model and a checkpoint folder say the same thing. Every
request is checked first, and its texts normalized as ingest normalized the training transcripts
(request.py: one schema for both paths)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from voxpipe.serve.request import Limits, parse_request

if TYPE_CHECKING:
    from voxpipe.model.voxcpm2 import GeneratedSpeech, VoxCPM2


def speak(model: VoxCPM2, texts: list[Any], references: list[Any], params: dict[str, Any] | None,
          limits: Limits) -> tuple[list[str], GeneratedSpeech]:
    """(the texts as spoken, one batch of generation); row i in the voice of references[i] (None: the
    learned voice)."""
    request = parse_request(texts, references, params, limits)
    return request.spoken, model.generate(request.spoken, request.references, **request.generation)
