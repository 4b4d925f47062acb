"""Texts to speech, optionally in the voice of a reference clip: what the served model and `voxpipe
synthesize` both run, so a registered model and a checkpoint folder say the same thing. Every
request is checked first, and its texts normalized as ingest normalized the training transcripts
(request.py: one schema for both paths). One deadline per request (deadline.py) stops the generation
between patches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from voxpipe.serve.deadline import Deadline, RequestStopped, release_memory
from voxpipe.serve.request import Limits, Request, parse_request, sized_max_len
from voxpipe.track.voices import ASSUMED_LOCALE

if TYPE_CHECKING:
    from voxpipe.model.voxcpm2 import GeneratedSpeech, VoxCPM2


def generate(model: VoxCPM2, request: Request, deadline: Deadline,
             sentences: list[str] | None = None) -> GeneratedSpeech:
    """One batch of generation for a checked request, or for `sentences` of its one text (streaming says
    them one at a time, each with its own sized max_len); stopped at the deadline, with what it held freed."""
    texts, refs, gen = request.spoken, request.references, request.generation
    if sentences is not None:
        texts, refs = sentences, request.references[:1] * len(sentences)
        gen = {**gen, "max_len": sized_max_len(sentences, request.max_len)}
    try:
        return model.generate(texts, refs, **gen, reference_text=request.reference_text, check=deadline.check)
    except RequestStopped:
        release_memory()
        raise


def speak(model: VoxCPM2, texts: list[Any], references: list[Any], params: dict[str, Any] | None,
          limits: Limits, deadline: Deadline | None = None, locale: str = ASSUMED_LOCALE
          ) -> tuple[list[str], GeneratedSpeech]:
    """(the texts as spoken, one batch of generation); row i in the voice of references[i] (None: the
    learned voice); the texts read in `locale` (the model's) unless the params name another."""
    request = parse_request(texts, references, params, limits, locale=locale)
    return request.spoken, generate(model, request, deadline or Deadline())
