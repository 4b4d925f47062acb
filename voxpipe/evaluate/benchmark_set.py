"""`evaluate.benchmark`: a standard test set in Seed-TTS-eval's layout, spoken by the base and the fine-tune.

A LoRA on one voice can make the model worse at everything else (other texts, other voices), which the
fixed-seed loss on the user's own val split cannot see. Seed-TTS-eval's sets can: test-en (Common Voice,
1,088 lines), test-zh (DiDiSpeech, 2,020) and test-hard (hard Chinese sentences). `evaluate.benchmark`
names one of them locally: a folder holding `meta.lst` (`seedtts_testset/en`, `.../zh`), or a `.lst` file
(`seedtts_testset/zh/hardcase.lst`). Each line is `utt|prompt_text|prompt_wav|infer_text` (a fifth field,
the ground-truth recording, is ignored), `prompt_wav` relative to the list's folder, as the set ships and
as seed-tts-eval's get_wav_res_ref_text.py reads it.

Every line is generated once per checkpoint, in the voice of its prompt clip, in batches seeded the same
for every checkpoint (a paired comparison). The protocol's figures per checkpoint: WER (English) or CER
(Chinese) as run_wer.py computes them (scoring.py: the mean of per-line rates), and SIM, the mean cosine
between each generated clip and its own prompt clip (comparable with published SIM only with
`evaluate.speaker: wavlm-ecapa`, the model seed-tts-eval uses; and the rates only with Whisper-large-v3 for
English and Paraformer-zh for Chinese, its recognisers).

One known difference: the prompt clip is given to VoxCPM2 as a reference clip (voxpipe's generate has no
continuation mode); `prompt_text` is read and recorded, not spoken before the text.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxpipe.data.asr import Recognisers
from voxpipe.data.audio import AudioDecodeError, decode, to_mono_resampled
from voxpipe.data.language import detect_language
from voxpipe.errors import StepError
from voxpipe.evaluate.scoring import CHARACTER_LANGUAGES, Rate, mean_rate, text_units
from voxpipe.evaluate.speaker import cosine
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.voxcpm2_format import SAMPLE_RATE

BATCH = 8  # lines generated together (each with its own prompt clip)
LIMIT_FACTOR, LIMIT_EXTRA_S = 2.0, 2.0  # max_len 0: twice the prompt's speaking rate times the text + 2 s
# the list's name (its stem, or its folder's for meta.lst) -> the Seed-TTS-eval set it is
SET_NAMES = {"en": "test-en", "test-en": "test-en", "zh": "test-zh", "test-zh": "test-zh",
             "hardcase": "test-hard", "hard": "test-hard", "test-hard": "test-hard"}
# VoxCPM2's published Seed-TTS-eval figures (its model card / paper): rate as a fraction, SIM as a cosine
PUBLISHED = {
    "test-en": {"metric": "wer", "rate": 0.0184, "sim": 0.753, "source": "VoxCPM2, published"},
    "test-zh": {"metric": "cer", "rate": 0.0097, "sim": 0.795, "source": "VoxCPM2, published"},
}


@dataclass(frozen=True)
class BenchmarkLine:
    index: int  # position in the list: seeds its batch, names its clip
    utt: str
    prompt_text: str
    prompt_wav: Path
    text: str
    language: str  # detected from the script of the text (zh -> CER, others WER)


@dataclass(frozen=True)
class Benchmark:
    path: Path  # the .lst file
    name: str  # test-en | test-zh | test-hard, else the list's own name
    lines: list[BenchmarkLine]

    @property
    def published(self) -> dict[str, Any] | None:
        return PUBLISHED.get(self.name)


def read_benchmark(where: str | Path) -> Benchmark:
    """The set at `where` (a folder with meta.lst, or a .lst file), every line checked."""
    path = Path(where)
    lst = path / "meta.lst" if path.is_dir() else path
    if not lst.is_file():
        raise StepError(f"evaluate.benchmark {str(where)!r}: no meta.lst there; name a Seed-TTS-eval set "
                        "folder (e.g. seedtts_testset/en, holding meta.lst and prompt-wavs/) or a .lst file")
    stem = lst.parent.name if lst.name == "meta.lst" else lst.stem
    lines = []
    for number, raw in enumerate(lst.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        fields = raw.strip().split("|")
        if len(fields) not in (4, 5) or not fields[0] or not fields[2] or not fields[3].strip():
            raise StepError(f"{lst}, line {number}: expected `utt|prompt_text|prompt_wav|infer_text` "
                            f"(Seed-TTS-eval's meta.lst layout), got {len(fields)} field(s): {raw[:80]!r}")
        utt, prompt_text, prompt_wav, text = fields[:4]
        wav = Path(prompt_wav) if Path(prompt_wav).is_absolute() else lst.parent / prompt_wav
        if not wav.is_file():
            raise StepError(f"{lst}, line {number} ({utt}): its prompt clip {wav} does not exist; "
                            "prompt_wav is relative to the list's folder")
        lines.append(BenchmarkLine(len(lines), utt, prompt_text, wav, text, detect_language(text)))
    if not lines:
        raise StepError(f"{lst}: no lines; a Seed-TTS-eval list has one "
                        "`utt|prompt_text|prompt_wav|infer_text` per line")
    return Benchmark(lst, SET_NAMES.get(stem, stem), lines)


@dataclass(frozen=True)
class Prompt:
    """A line's prompt clip, loaded once for every checkpoint."""

    wav: np.ndarray  # 16 kHz mono
    embedding: np.ndarray | None  # the speaker encoder's, None when it holds no voice
    seconds_per_unit: float | None  # its speaking rate over prompt_text, for the generation limit


def load_prompts(bench: Benchmark, encoder: Any) -> list[Prompt]:
    out = []
    for line in bench.lines:
        try:
            wav = decode(line.prompt_wav, SAMPLE_RATE)
        except (AudioDecodeError, OSError) as e:
            raise StepError(f"{bench.path} ({line.utt}): cannot read its prompt clip {line.prompt_wav} "
                            f"({e})") from e
        units = text_units(line.prompt_text)
        rate = wav.size / SAMPLE_RATE / units if units else None
        out.append(Prompt(wav, encoder.embed(wav, SAMPLE_RATE), rate))
    return out


@dataclass(frozen=True)
class BenchmarkClip:
    line: BenchmarkLine
    audio: np.ndarray  # mono float32 at sample_rate
    sample_rate: int
    hit_limit: bool
    seconds: float  # this clip's share of its batch's generation time


def _limit(model: VoxCPM2, line: BenchmarkLine, prompt: Prompt, max_len: int) -> int:
    if max_len:
        return max_len
    vae = model.audio_vae
    patch_seconds = model.patch_size * vae.hop_length / vae.sample_rate
    rate = prompt.seconds_per_unit or prompt.wav.size / SAMPLE_RATE / max(text_units(line.text), 1)
    return math.ceil((LIMIT_FACTOR * rate * text_units(line.text) + LIMIT_EXTRA_S) / patch_seconds)


def synthesize_benchmark(model: VoxCPM2, bench: Benchmark, prompts: list[Prompt], *, max_len: int,
                         cfg_value: float, inference_timesteps: int, seed: int) -> list[BenchmarkClip]:
    """Every line in its prompt clip's voice, BATCH lines at a time, each batch seeded by seed + its first
    line's index (the same for every checkpoint)."""
    out = []
    for start in range(0, len(bench.lines), BATCH):
        lines, mine = bench.lines[start:start + BATCH], prompts[start:start + BATCH]
        limits = [_limit(model, line, prompt, max_len) for line, prompt in zip(lines, mine, strict=True)]
        began = time.perf_counter()
        speech = model.generate([line.text for line in lines], [torch.from_numpy(p.wav) for p in mine],
                                max_len=max(limits), cfg_value=cfg_value,
                                inference_timesteps=inference_timesteps, seed=seed + start)
        seconds = time.perf_counter() - began
        total = sum(a.numel() for a in speech.audio)
        for line, limit, audio, latents, hit in zip(lines, limits, speech.audio, speech.latents,
                                                    speech.hit_length_limit, strict=True):
            patches = latents.shape[1] // model.patch_size
            if patches > limit:  # past its own limit: cut back, a runaway
                audio, hit = audio[: audio.numel() * limit // patches], True
            out.append(BenchmarkClip(line, audio.numpy().astype(np.float32), speech.sample_rate, bool(hit),
                                     seconds * audio.numel() / max(total, 1)))
    return out


@dataclass(frozen=True)
class BenchmarkRun:
    records: list[dict[str, Any]]  # one per line, what eval.json lists
    rates: list[Rate | None]

    def figures(self) -> dict[str, float | None]:
        """The protocol's figures: wer (non-Chinese lines) and cer (Chinese lines), means of per-line rates;
        sim, the mean cosine of each clip with its prompt clip."""
        def rate(chinese: bool) -> float | None:
            return mean_rate([r for rec, r in zip(self.records, self.rates, strict=True)
                              if (rec["language"] in CHARACTER_LANGUAGES) == chinese])

        sims = [r["similarity_to_prompt"] for r in self.records if r["similarity_to_prompt"] is not None]
        return {"wer": rate(False), "cer": rate(True), "sim": statistics.fmean(sims) if sims else None}


def clips_16k(clips: list[BenchmarkClip]) -> list[np.ndarray]:
    """The clips as both scorers take them (mono, 16 kHz): resampled once for the two halves."""
    return [to_mono_resampled(c.audio, c.sample_rate, SAMPLE_RATE) for c in clips]


def benchmark_similarities(clips: list[BenchmarkClip], wavs: list[np.ndarray], prompts: list[Prompt],
                           encoder: Any) -> list[float | None]:
    """Each clip's SIM: its speaker embedding (of `wavs`, clips_16k) against its prompt's (None where
    either has no voice)."""
    out = []
    for clip, wav in zip(clips, wavs, strict=True):
        embedding = encoder.embed(wav, SAMPLE_RATE) if wav.size else None
        prompt = prompts[clip.line.index].embedding
        out.append(cosine(embedding, prompt) if embedding is not None and prompt is not None else None)
    return out


def benchmark_heard(clips: list[BenchmarkClip], wavs: list[np.ndarray], recognisers: Recognisers
                    ) -> list[tuple[dict[str, Any], Rate | None]]:
    """Each clip's transcript and WER/CER in its line's language (metrics.intelligibility, on `wavs`)."""
    from voxpipe.evaluate.metrics import intelligibility  # metrics imports generation; this stays beside it

    return [intelligibility(wav, c.line.text, c.line.language, recognisers)
            for c, wav in zip(clips, wavs, strict=True)]


def benchmark_run(clips: list[BenchmarkClip], similarities: list[float | None],
                  heard: list[tuple[dict[str, Any], Rate | None]]) -> BenchmarkRun:
    """The scored lines: evaluate computes the two halves on the scorers' own threads (scoring_threads.py)."""
    records = [{"utt": c.line.utt, "text": c.line.text, "language": c.line.language,
                "prompt_wav": str(c.line.prompt_wav), "prompt_text": c.line.prompt_text,
                "audio_seconds": c.audio.size / c.sample_rate, "hit_limit": c.hit_limit,
                "similarity_to_prompt": sim, **words}
               for c, sim, (words, _) in zip(clips, similarities, heard, strict=True)]
    return BenchmarkRun(records, [rate for _, rate in heard])


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def benchmark_report(bench: Benchmark, model: BenchmarkRun, baseline: BenchmarkRun, speaker_backend: str,
                     asr: list[dict[str, Any]]) -> dict[str, Any]:
    """eval.json's `benchmark`: both checkpoints' protocol figures, the delta, and the published ones."""
    mine, base = model.figures(), baseline.figures()
    published = bench.published
    return {
        "set": bench.name, "list": str(bench.path), "lines": len(bench.lines),
        "languages": sorted({line.language for line in bench.lines}),
        "model": mine, "baseline": base, "delta": {k: _delta(mine[k], base[k]) for k in mine},
        "published": published,
        "published_null_reason": None if published else
        f"no published VoxCPM2 figure recorded for {bench.name!r} (voxpipe records test-en and test-zh)",
        "sim_comparable_to_published": speaker_backend == "wavlm-ecapa",
        "speaker_backend": speaker_backend, "asr": asr,
        "utterances": {"model": model.records, "baseline": baseline.records},
    }


NO_BENCHMARK = "no evaluate.benchmark set"


def flat_figures(report: dict[str, Any] | None) -> dict[str, Any]:
    """The top-level numbers for DVC: benchmark_{wer,cer,sim} (fine-tune) and _baseline; null with a reason
    when there is no benchmark or the set has no line of that metric."""
    out: dict[str, Any] = {}
    for key in ("wer", "cer", "sim"):
        for tag, suffix in (("model", ""), ("baseline", "_baseline")):
            value = None if report is None else report[tag][key]
            out[f"benchmark_{key}{suffix}"] = value
            if value is None:
                out[f"benchmark_{key}{suffix}_null_reason"] = (
                    NO_BENCHMARK if report is None else f"no {key} figure on {report['set']} (no line of it "
                    "scored: its language, no recogniser for it, or no clip with a voice)")
    return out
