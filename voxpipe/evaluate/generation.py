"""What to synthesise and how: a fixed list of val texts per speaker, each with and without a reference.

Per speaker (speakers of the val set, sorted): its val rows sorted by id give the texts (train rows
fill in when val has fewer than `texts_per_speaker`, marked `source: train`); one fixed real clip
of the speaker, preferably a train clip not among the texts, is the reference for all of them, so
differences between utterances come from the model, not from changing references. Each text's expected
length is the speaker's speaking rate (seconds per character, over all its rows) times its characters:
a clip far shorter stopped prematurely, one that reaches the limit ran away. Every text is
generated once with that reference ("cloning") and once without ("the voice the model learned"),
in one batch per condition whose seed is the same for every checkpoint: a paired comparison.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from voxpipe.data.dataset import EncodedDataset
from voxpipe.data.language import detect_language
from voxpipe.evaluate.scoring import text_units
from voxpipe.model.voxcpm2 import VoxCPM2

REAL_CLIPS_PER_SPEAKER = 8  # real recordings that define a voice's centre embedding and pitch
AUTO_LIMIT_FACTOR, AUTO_LIMIT_EXTRA_S = 2.0, 2.0  # max_len 0: twice the real clip + 2 s


@dataclass(frozen=True)
class Utterance:
    index: int  # position in the plan: names the wav and seeds the generation
    speaker: str
    row_id: str
    source: str  # "val", or "train" when val had too few texts for the speaker
    text: str
    real_audio: Path  # the real recording of this text
    real_seconds: float
    with_reference: bool
    language: str  # the row's `language` (ingest), else detected from the script of its text
    expected_seconds: float | None  # the speaker's speaking rate times the text's characters


    @property
    def name(self) -> str:
        return f"{self.index:03d}-{self.speaker}-{'ref' if self.with_reference else 'noref'}"


@dataclass(frozen=True)
class SpeakerPlan:
    speaker: str
    utterances: list[Utterance]
    reference_id: str
    reference: torch.Tensor  # the reference clip's VAE latents [D, frames]
    reference_audio: Path  # the reference clip itself: similarity_to_prompt compares clips made with it to it
    real_clips: list[Path]
    seconds_per_unit: float | None  # speaking rate over all the speaker's rows (scoring.text_units)


Row = tuple[str, EncodedDataset, int]  # (source split, its dataset, row index)


def _audio_path(row: Row) -> Path:
    _, data, i = row
    return (data.root / data.rows[i]["audio"]).resolve()


def _speaker_rows(pools: list[tuple[str, EncodedDataset]], speaker: str) -> list[Row]:
    """The speaker's rows: val first, then train, each sorted by row id."""
    out: list[Row] = []
    for source, data in pools:
        mine = [i for i, r in enumerate(data.rows) if r["speaker"] == speaker]
        out += [(source, data, i) for i in sorted(mine, key=lambda i, d=data: d.rows[i]["id"])]
    return out


def speaking_rate(rows: list[tuple[str, float]]) -> float | None:
    """Seconds per text unit over (text, seconds) rows: total duration / total characters."""
    units = sum(text_units(text) for text, _ in rows)
    return sum(seconds for _, seconds in rows) / units if units else None


def plan_speakers(
    val: EncodedDataset, train: EncodedDataset | None, texts_per_speaker: int
) -> list[SpeakerPlan]:
    """The fixed generation plan (a pure function of the encoded data and the count)."""
    pools = [("val", val)] + ([("train", train)] if train is not None else [])
    plans: list[SpeakerPlan] = []
    index = 0
    for speaker in sorted({r["speaker"] for r in val.rows}):
        rows = _speaker_rows(pools, speaker)
        rate = speaking_rate([(d.rows[i]["text"], float(d.rows[i]["duration"])) for _, d, i in rows])
        chosen, rest = rows[:texts_per_speaker], rows[texts_per_speaker:]
        reference_row = ([r for r in rest if r[0] == "train"] or rest or chosen)[0]
        _, ref_data, ref_i = reference_row
        utterances = []
        for row in chosen:
            source, data, i = row
            meta = data.rows[i]
            language = meta.get("language") or detect_language(meta["text"])
            expected = rate * text_units(meta["text"]) if rate is not None else None
            for with_reference in (True, False):
                utterances.append(Utterance(
                    index, speaker, meta["id"], source, meta["text"], _audio_path(row),
                    float(meta["duration"]), with_reference, language, expected,
                ))
                index += 1
        plans.append(SpeakerPlan(
            speaker,
            utterances,
            reference_id=ref_data.rows[ref_i]["id"],
            reference=ref_data[ref_i].latents.T.contiguous(),
            reference_audio=_audio_path(reference_row),
            real_clips=[_audio_path(r) for r in rows[:REAL_CLIPS_PER_SPEAKER]],
            seconds_per_unit=rate,
        ))
    return plans


@dataclass(frozen=True)
class Generated:
    utterance: Utterance
    audio: np.ndarray  # mono float32 at sample_rate
    sample_rate: int
    max_len: int  # patches allowed
    patches: int  # patches generated
    hit_limit: bool  # no stop predicted within max_len: a stop failure (runaway)
    seconds: float  # wall time of generation and decoding

    @property
    def audio_seconds(self) -> float:
        return self.audio.size / self.sample_rate

    def stop(self, min_duration_ratio: float) -> str:
        """"runaway" (hit the limit), "premature" (shorter than min_duration_ratio of the expected length),
        else "ok"."""
        if self.hit_limit:
            return "runaway"
        expected = self.utterance.expected_seconds
        if expected is not None and self.audio_seconds < min_duration_ratio * expected:
            return "premature"
        return "ok"


def patch_limit(model: VoxCPM2, utterance: Utterance, max_len: int) -> int:
    if max_len:
        return max_len
    vae = model.audio_vae
    patch_seconds = model.patch_size * vae.hop_length / vae.sample_rate
    return math.ceil((AUTO_LIMIT_FACTOR * utterance.real_seconds + AUTO_LIMIT_EXTRA_S) / patch_seconds)


def synthesize(
    model: VoxCPM2, plan: SpeakerPlan, *, max_len: int, cfg_value: float, inference_timesteps: int, seed: int
) -> list[Generated]:
    """Generate the plan's utterances, one batch per condition (with / without the reference).

    A batch is seeded by seed + the index of its first utterance, the same for every checkpoint, so the
    comparison stays paired. Batching is what makes 8 texts per speaker affordable: a step of the tiny
    model costs about the same for one row or eight. The batch runs to its longest row's limit; a row
    still speaking past its own limit is a stop failure, cut back to that limit.
    """
    out = []
    for with_reference in (True, False):
        group = [u for u in plan.utterances if u.with_reference == with_reference]
        if not group:
            continue
        limits = [patch_limit(model, u, max_len) for u in group]
        start = time.perf_counter()
        speech = model.generate(
            [u.text for u in group], plan.reference if with_reference else None, max_len=max(limits),
            cfg_value=cfg_value, inference_timesteps=inference_timesteps, seed=seed + group[0].index,
        )
        seconds = time.perf_counter() - start
        total_audio = sum(a.numel() for a in speech.audio)
        for u, limit, audio, latents, hit in zip(group, limits, speech.audio, speech.latents,
                                                 speech.hit_length_limit, strict=True):
            patches = latents.shape[1] // model.patch_size
            if patches > limit:  # past its own limit: a stop failure, cut back to the limit
                audio, patches, hit = audio[: audio.numel() * limit // patches], limit, True
            share = seconds * audio.numel() / max(total_audio, 1)  # the batch's time, by audio length
            out.append(Generated(u, audio.numpy().astype(np.float32), speech.sample_rate, limit, patches,
                                 bool(hit), share))
    return sorted(out, key=lambda g: g.utterance.index)
