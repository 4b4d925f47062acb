"""Per-clip measurements: who it sounds like (speaker embedding), its pitch, what an ASR hears in the row's
language, how clean it sounds (DNSMOS) and whether it stopped where it should.

Real voices first: each speaker's real recordings give the centre of its voice (mean speaker
embedding) and its typical pitch; every generated clip is then compared with the centre of the
speaker whose text (and reference) it was given (`similarity_to_speaker`, the promotion rule's), and
with all the others to name the nearest. A clip made with the speaker's reference clip is also compared
with that clip (`similarity_to_prompt`, Seed-TTS-eval's SIM protocol).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voxpipe.data.asr import Recognisers
from voxpipe.data.audio import AudioDecodeError, decode, to_mono_resampled
from voxpipe.errors import StepError
from voxpipe.evaluate.costs import Costs
from voxpipe.evaluate.generation import Generated, SpeakerPlan
from voxpipe.evaluate.pitch import f0_or_reason, median_f0
from voxpipe.evaluate.quality import DnsmosScorer
from voxpipe.evaluate.scoring import Rate, metric_of, utterance_rate
from voxpipe.evaluate.speaker import Encoder, cosine, unit_mean
from voxpipe.voxcpm2_format import SAMPLE_RATE

PROTOCOL_BACKEND = "wavlm-ecapa"  # the encoder Seed-TTS-eval's published SIM is computed with
SIMILARITY_DEFINITIONS = {
    "similarity_to_speaker": "cosine (evaluate.speaker's encoder) of each generated clip, with and without a "
    "reference clip, to the mean embedding of up to 8 real clips of its speaker; the promotion rule's "
    "similarity criterion reads it, per speaker",
    "similarity_to_prompt": "cosine (evaluate.speaker's encoder) of each clip generated with a reference "
    "clip to that reference clip: Seed-TTS-eval's SIM protocol, comparable to published SIM only with "
    f"evaluate.speaker {PROTOCOL_BACKEND}",
}


@dataclass(frozen=True)
class Voice:
    """A real speaker's voice, from its real recordings."""

    speaker: str
    centre: np.ndarray  # unit mean speaker embedding
    f0_median_hz: float | None  # median over the clips' median F0
    clip_similarities: list[float]  # each real clip against the centre: the same-voice range
    prompt: np.ndarray | None = None  # the embedding of the plan's reference clip (None: no voice in it)

    def as_dict(self) -> dict[str, Any]:
        return {
            "clips": len(self.clip_similarities),
            "f0_median_hz": self.f0_median_hz,
            "clip_similarity_mean": statistics.fmean(self.clip_similarities),
            "clip_similarity_min": min(self.clip_similarities),
        }


def load_16k(path: Path) -> np.ndarray:
    try:
        return decode(path, SAMPLE_RATE)
    except (AudioDecodeError, OSError) as e:
        raise StepError(f"{path}: cannot read the real recording ({e}); evaluate needs the ingest audio the "
                        "encoded rows point at") from e


def real_voice(plan: SpeakerPlan, encoder: Encoder) -> Voice:
    wavs = [load_16k(p) for p in plan.real_clips]
    embeddings = [e for e in (encoder.embed(w, SAMPLE_RATE) for w in wavs) if e is not None]
    if not embeddings:
        raise StepError(f"speaker {plan.speaker!r}: none of its {len(wavs)} real clips has a voice to embed")
    centre = unit_mean(embeddings)
    pitches = [f for f in (median_f0(w) for w in wavs) if f is not None]
    return Voice(
        plan.speaker, centre, statistics.median(pitches) if pitches else None,
        [cosine(e, centre) for e in embeddings], encoder.embed(load_16k(plan.reference_audio), SAMPLE_RATE),
    )


@dataclass(frozen=True)
class ClipMeasures:
    record: dict[str, Any]  # what eval.json lists for the clip
    embedding: np.ndarray | None  # kept apart: the consistency check needs it, the report does not
    rate: Rate | None


@dataclass(frozen=True)
class Scorers:
    """What measures a clip, loaded once for every checkpoint."""

    encoder: Encoder
    recognisers: Recognisers
    dnsmos: DnsmosScorer  # a QUALITY backend of voxpipe/backends.py
    min_duration_ratio: float


def intelligibility(wav: np.ndarray, text: str, language: str, recognisers: Recognisers
                    ) -> tuple[dict[str, Any], Rate | None]:
    """The clip's transcript and CER (zh) / WER (others), or null with the reason; names the backend."""
    choice = recognisers.for_language(language)
    metric = metric_of(language)
    if choice.recogniser is None:
        return {"asr": None, "asr_model": None, "transcript": None, "metric": metric, metric: None,
                "asr_reason": choice.reason}, None
    transcript = choice.recogniser.transcribe(wav, language)
    rate = utterance_rate(text, transcript, language)
    return {"asr": choice.recogniser.backend, "asr_model": choice.recogniser.model, "transcript": transcript,
            "metric": metric, metric: rate.rate if rate else None,
            "asr_reason": None if rate else "the reference has no text left to score"}, rate


def clip_16k(clip: Generated) -> np.ndarray:
    """The generated clip as every scorer takes it: mono float32 at 16 kHz."""
    return to_mono_resampled(clip.audio, clip.sample_rate, SAMPLE_RATE)


def clip_quality(wav: np.ndarray, scorers: Scorers, costs: Costs) -> dict[str, float] | None:
    """DNSMOS of a 16 kHz clip (None for an empty one): the costliest scorer, so evaluate gives it a thread
    of its own (voxpipe/evaluate/scoring_threads.py)."""
    with costs.phase("dnsmos"):
        return scorers.dnsmos.score(wav, SAMPLE_RATE) if wav.size else None


def clip_intelligibility(clip: Generated, wav: np.ndarray, scorers: Scorers, costs: Costs
                         ) -> tuple[dict[str, Any], Rate | None]:
    """What the ASR hears in one generated clip (the record's transcript and rate keys, `intelligibility`)."""
    with costs.phase("asr"):
        return intelligibility(wav, clip.utterance.text, clip.utterance.language, scorers.recognisers)


def measure(clip: Generated, wav: np.ndarray, voices: dict[str, Voice], scorers: Scorers, costs: Costs
            ) -> ClipMeasures:
    """Every figure of one generated clip but the ASR's (`clip_intelligibility`) and DNSMOS (`clip_quality`),
    which the caller adds as the record's last keys; each scorer's time goes to its phase of `costs`."""
    u = clip.utterance
    with costs.phase("speaker"):
        embedding = scorers.encoder.embed(wav, SAMPLE_RATE)
    similarity = nearest = nearest_similarity = to_prompt = None
    if embedding is not None:
        scores = {name: cosine(embedding, v.centre) for name, v in voices.items()}
        similarity = scores[u.speaker]
        nearest = max(scores, key=scores.__getitem__)
        nearest_similarity = scores[nearest]
        prompt = voices[u.speaker].prompt
        to_prompt = cosine(embedding, prompt) if u.with_reference and prompt is not None else None
    with costs.phase("pitch"):
        f0, no_f0 = f0_or_reason(wav)
    record = {
        "name": u.name,
        "speaker": u.speaker,
        "with_reference": u.with_reference,
        "text": u.text,
        "language": u.language,
        "text_source": u.source,
        "row_id": u.row_id,
        "audio_seconds": clip.audio_seconds,
        "real_seconds": u.real_seconds,
        "expected_seconds": u.expected_seconds,
        "patches": clip.patches,
        "max_len": clip.max_len,
        "hit_limit": clip.hit_limit,
        "stop": clip.stop(scorers.min_duration_ratio),
        "rtf": clip.seconds / max(clip.audio_seconds, 1e-9),
        "similarity_to_speaker": similarity,
        "similarity_to_prompt": to_prompt,
        "nearest_speaker": nearest,
        "nearest_similarity": nearest_similarity,
        "f0_median_hz": f0,
        "f0_null_reason": no_f0,
    }
    return ClipMeasures(record, embedding, None)
