"""`voxpipe evaluate`: did the fine-tune learn, and does it keep the voice?

1. Fixed-seed loss (voxpipe/train/fixed_seed_loss.py) of the fine-tuned model and the baseline on the
   whole val set, for each seed; mean and spread over seeds tell a real improvement from noise.
2. Generation (generation.py): a fixed list of val texts per speaker, each with the speaker's
   reference clip and without one; speaker similarity, pitch, CER/WER in the row's language
   (scoring.py, asr.py) and DNSMOS per clip (metrics.py), voice consistency per speaker
   (consistency.py), stop failures both ways (premature, runaway) and real-time factor.
   With `evaluate.benchmark`, every line of a standard test set in Seed-TTS-eval's layout too
   (benchmark_set.py): the protocol's WER/CER and SIM of each checkpoint, beside the published ones.
3. The promotion rule (promotion.py) on those figures, each compared figure read as a paired gain
   over the baseline's clips with its bootstrap interval (gains.py), its tolerances the measured noise
   floor's (`evaluate.noise_runs`, noise.py) or the constants; `--require-improvement` fails the step when
   it says no. `evaluate.model` may be a folder of step-N exports: each export of the run in it is
   scored and the rule picks one; exports of another run are skipped and listed (exports.py). Their EMA
   siblings (train.ema_decay) are candidates too, and with `evaluate.average_top_k` so is the average of
   the k exports with the lowest loss (average.py); `candidate_kind` names the kind chosen.

Checkpoints are loaded one after the other (never two in memory). Outputs in `out/`: eval.json
(flat top-level figures for DVC, details nested), samples/*.wav (48 kHz), eval.png, exports.png,
report.json, noise.json (the noise floor, kept across runs).
"""

from __future__ import annotations

import gc
import io
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import soundfile as sf
import torch

from voxpipe.backends import QUALITY, QUALITY_BACKEND, SPEAKER
from voxpipe.data.asr import Recognisers
from voxpipe.data.dataset import EncodedDataset
from voxpipe.data.token_budget import TokenBudget
from voxpipe.device import cpu_threads, resolve_device_type
from voxpipe.errors import StepError
from voxpipe.evaluate.average import average_candidate
from voxpipe.evaluate.benchmark_set import (
    NO_BENCHMARK,
    Benchmark,
    BenchmarkClip,
    BenchmarkRun,
    Prompt,
    benchmark_heard,
    benchmark_report,
    benchmark_run,
    benchmark_similarities,
    clips_16k,
    flat_figures,
    load_prompts,
    read_benchmark,
    synthesize_benchmark,
)
from voxpipe.evaluate.consistency import consistency, no_f0_spread
from voxpipe.evaluate.costs import Costs
from voxpipe.evaluate.exports import Candidate, Scored, choose, own_exports, plot_exports
from voxpipe.evaluate.figure import plot
from voxpipe.evaluate.gains import FIGURES, GAIN_METHOD, flat_gains
from voxpipe.evaluate.generation import Generated, SpeakerPlan, plan_speakers, synthesize
from voxpipe.evaluate.heard import real_rates_by_voice, unheard, voice_report, without_unheard
from voxpipe.evaluate.listen_page import listening_pairs, write_listening_test
from voxpipe.evaluate.marks import marker
from voxpipe.evaluate.metrics import (
    PROTOCOL_BACKEND,
    SIMILARITY_DEFINITIONS,
    ClipMeasures,
    Scorers,
    Voice,
    intelligibility,
    load_16k,
    real_voice,
)
from voxpipe.evaluate.noise import NOISE_FILE, fits, keep_or_mark, read_floor, write_floor
from voxpipe.evaluate.pages import report_lines, why_no_rate_in
from voxpipe.evaluate.promotion import CONSTANTS, Floor, Scores, decide, mean_ci
from voxpipe.evaluate.scoring import CHARACTER_LANGUAGES, Rate, mean_rate
from voxpipe.evaluate.scoring_threads import ScoringThreads
from voxpipe.evaluate.speaker import speaker_encoder
from voxpipe.files import DISK_ERRORS, atomic_write
from voxpipe.integrity import signing_key
from voxpipe.lineage import dvc_md5
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.io import from_pretrained
from voxpipe.model.npu import KernelsChoice
from voxpipe.params import Params
from voxpipe.progress import Progress
from voxpipe.report import write_json, write_report
from voxpipe.steps.evaluate import EvaluateParams
from voxpipe.train.fixed_seed_loss import (
    FixedSeedLoss,
    LossBatch,
    fixed_seed_loss,
    summarize_seeds,
    val_digest,
    val_loss_batches,
)
from voxpipe.voxcpm2_format import checkpoint_config

log = logging.getLogger(__name__)
STAGING = ".samples-new"  # this run's clips until eval.json is written (then they become samples/)
# torch's intra-op threads on the CPU: one, so the figures never depend on the core count, and generation
# and the two scoring threads beside it (scoring_threads.py) do not multiply into more threads than cores
CPU_THREADS = 1


@dataclass
class EvaluateResult:
    out: Path
    figures: dict[str, Any]  # eval.json as written
    verdict: str

    def summary(self) -> str:
        """A short report: the verdict's criteria as a table, the similarity's definition and ceiling."""
        lines = report_lines(self.figures)
        return "\n".join([f"evaluate: {lines[0]} -> {self.out / 'eval.json'}", *lines[1:]])


def _open_split(root: Path, split: str) -> EncodedDataset | None:
    try:
        return EncodedDataset(root, split)
    except FileNotFoundError:
        return None


def _read_config(path: Path) -> VoxCPM2Config:
    return VoxCPM2Config.from_file(checkpoint_config(path))


def _check_data(val: EncodedDataset, config: VoxCPM2Config, where: Path) -> None:
    if (val.patch_size, val.latent_dim) != (config.patch_size, config.feat_dim):
        raise StepError(
            f"{val.path}: encoded with patch_size {val.patch_size} and latent dim {val.latent_dim}, but "
            f"{where} expects {config.patch_size} and {config.feat_dim}; encode with this model's checkpoint"
        )


def _mean(values: list[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


@dataclass
class CheckpointRun:
    losses: list[FixedSeedLoss]
    clips: list[ClipMeasures]
    generation_seconds: float
    audio_seconds: float
    seconds: float
    benchmark: BenchmarkRun | None = None  # evaluate.benchmark's lines, when one is set


def _run_checkpoint(
    tag: str, path: Path, p: EvaluateParams, device: torch.device, batches: list[LossBatch],
    plans: list[SpeakerPlan], voices: dict[str, Future[Voice]], threads: ScoringThreads, samples: Path,
    kernels: KernelsChoice, costs: Costs, mark: Callable[[Any, int], Any],
    bench: tuple[Benchmark, list[Prompt]] | None = None,
    seeds: list[int] | None = None, generation_seed: int | None = None,
) -> Callable[[], CheckpointRun]:
    """Load the checkpoint, its loss (over `seeds`, evaluate.seeds unless given) and its clips (seeded by
    `generation_seed`, evaluate.generation_seed unless given); the clips are queued on the scoring threads,
    and the returned call waits for their scores. The model is gone before this returns, so the next
    checkpoint loads (and generates) while this one's clips are scored, never two models in memory."""
    seeds = p.seeds if seeds is None else seeds
    generation_seed = p.generation_seed if generation_seed is None else generation_seed
    start = time.perf_counter()
    with costs.phase("model_load"):
        model = from_pretrained(path, device=device, kernels=kernels)
    losses = []
    with Progress(len(seeds), f"{tag} loss", log, unit="seed") as bar:
        for seed in seeds:
            with costs.phase("loss"):
                losses.append(fixed_seed_loss(model, batches, device, seed))
            bar.update()
    generated: list[Generated] = []
    pending = []
    with Progress(sum(len(plan.utterances) for plan in plans), f"{tag} generate", log, unit="utt") as bar:
        for plan in plans:
            with costs.phase("generation", len(plan.utterances)):
                mine = synthesize(model, plan, max_len=p.max_len, cfg_value=p.cfg_value,
                                  inference_timesteps=p.inference_timesteps, seed=generation_seed)
            for g in mine:
                # the clip that leaves is marked (marks.py); its scores are the model's own, unmarked
                write_sample(samples / f"{tag}-{g.utterance.name}.wav", mark(g.audio, g.sample_rate),
                             g.sample_rate)
                pending.append(threads.clip(g, voices))
            generated += mine
            bar.update(len(plan.utterances))
    benchmark = None
    if bench is not None:
        with costs.phase("benchmark_generation", len(bench[0].lines)):
            spoken = synthesize_benchmark(model, *bench, max_len=p.max_len, cfg_value=p.cfg_value,
                                          inference_timesteps=p.inference_timesteps, seed=p.generation_seed)
        wavs = clips_16k(spoken)  # once, for both halves
        benchmark = (spoken,
                     threads.voice(_benchmark_similarities, spoken, wavs, bench[1], threads.scorers, costs),
                     threads.asr(_benchmark_heard, spoken, wavs, threads.scorers, costs))
    del model
    gc.collect()
    seconds = time.perf_counter() - start

    def scored() -> CheckpointRun:
        clips = []
        with Progress(len(pending), f"{tag} score", log, unit="utt") as bar:
            for result in pending:
                clips.append(result())
                bar.update()
        return CheckpointRun(losses, clips, sum(g.seconds for g in generated),
                             sum(g.audio_seconds for g in generated), seconds,
                             None if benchmark is None else
                             benchmark_run(benchmark[0], benchmark[1].result(), benchmark[2].result()))

    return scored


def _benchmark_similarities(spoken: list[BenchmarkClip], wavs: list[Any], prompts: list[Prompt],
                            scorers: Scorers, costs: Costs) -> list[float | None]:
    with costs.phase("benchmark_similarity", len(spoken)):
        return benchmark_similarities(spoken, wavs, prompts, scorers.encoder)


def _benchmark_heard(spoken: list[BenchmarkClip], wavs: list[Any], scorers: Scorers, costs: Costs
                     ) -> list[tuple[dict[str, Any], Rate | None]]:
    with costs.phase("benchmark_asr", len(spoken)):
        return benchmark_heard(spoken, wavs, scorers.recognisers)


def _real_voice(plan: SpeakerPlan, scorers: Scorers, costs: Costs) -> Voice:
    with costs.phase("real_voices"):
        return real_voice(plan, scorers.encoder)


def _groups(tag: str, clips: list[ClipMeasures]) -> list[dict[str, Any]]:
    """Consistency per (condition, speaker): the set of utterances that should share one voice."""
    out = []
    keys = sorted({(c.record["with_reference"], c.record["speaker"]) for c in clips}, reverse=True)
    for key in keys:
        mine = [c for c in clips if (c.record["with_reference"], c.record["speaker"]) == key]
        stats = consistency([c.record["similarity_to_speaker"] for c in mine],
                            [c.record["f0_median_hz"] for c in mine], [c.embedding for c in mine])
        with_reference, speaker = key
        out.append({"checkpoint": tag, "speaker": speaker, "with_reference": with_reference, **stats})
    return out


def _stop_rate(records: list[dict[str, Any]], *kinds: str) -> float | None:
    return _mean([r["stop"] in kinds for r in records])


def _mos(records: list[dict[str, Any]], key: str) -> float | None:
    return _mean([r["mos"][key] for r in records if r["mos"] is not None])


def intelligibility_by_language(records: list[dict[str, Any]], rates: list[Rate | None]) -> dict[str, Any]:
    """Per language: its metric (cer for zh, wer otherwise), the mean of per-utterance rates, the backend and
    model that heard it, or null with the reason."""
    out: dict[str, Any] = {}
    for language in sorted({r["language"] for r in records}):
        mine = [(r, rate) for r, rate in zip(records, rates, strict=True) if r["language"] == language]
        value = mean_rate([rate for _, rate in mine])
        heard = sorted({(r["asr"], r["asr_model"]) for r, _ in mine if r["asr"]})
        reasons = sorted({r["asr_reason"] for r, _ in mine if r["asr_reason"]})
        out[language] = {
            "metric": mine[0][0]["metric"], "rate": value, "clips": len(mine),
            "scored": sum(rate is not None for _, rate in mine),
            "asr": heard[0][0] if heard else None, "asr_model": heard[0][1] if heard else None,
            "reason": None if value is not None else ("; ".join(reasons) if reasons else "no clip to score"),
        }
    return out


def _rates(by_language: dict[str, Any]) -> dict[str, float | None]:
    """The flat wer (every non-Chinese language) and cer (Chinese): the mean over their languages' clips."""
    flat: dict[str, float | None] = {}
    for metric, pick in (("wer", lambda lang: lang not in CHARACTER_LANGUAGES),
                         ("cer", lambda lang: lang in CHARACTER_LANGUAGES)):
        parts = [(v["rate"], v["scored"]) for lang, v in by_language.items()
                 if pick(lang) and v["rate"] is not None]
        flat[metric] = sum(r * n for r, n in parts) / sum(n for _, n in parts) if parts else None
    return flat


def _checkpoint_figures(run: CheckpointRun, groups: list[dict[str, Any]]) -> dict[str, Any]:
    records = [c.record for c in run.clips]
    without = [r["similarity_to_speaker"] for r in records if not r["with_reference"]]
    return {
        # every clip, with and without a reference, as the promotion rule's per-speaker means pool them
        "similarity_to_speaker": _mean([r["similarity_to_speaker"] for r in records]),
        "similarity_to_speaker_noref": _mean(without),
        # the protocol's: each clip made with a reference clip against that clip
        "similarity_to_prompt": _mean([r["similarity_to_prompt"] for r in records]),
        "similarity_spread": _mean([g["similarity_std"] for g in groups]),
        "f0_spread": _mean([g["f0_spread_semitones"] for g in groups]),
        "voice_split_flag": int(any(g["voice_split"] for g in groups)),
        "voice_split_groups": sum(g["voice_split"] for g in groups),
        "stop_failure_rate": _stop_rate(records, "premature", "runaway"),
        "premature_stop_rate": _stop_rate(records, "premature"),
        "runaway_stop_rate": _stop_rate(records, "runaway"),
        "rtf": run.generation_seconds / max(run.audio_seconds, 1e-9),
        **_rates(intelligibility_by_language(records, [c.rate for c in run.clips])),
        "mos_ovrl": _mos(records, "ovrl"),
        "mos_sig": _mos(records, "sig"),
        "mos_bak": _mos(records, "bak"),
    }


def _flat(
    summary: dict[str, Any], verdict: bool, per_tag: dict[str, dict[str, Any]], real: dict[str, Any]
) -> dict[str, Any]:
    """The DVC metric: flat top-level numbers (fine-tuned unsuffixed, baseline with _baseline)."""
    flat: dict[str, Any] = {
        "loss_model": summary["model"]["total"]["mean"],
        "loss_baseline": summary["baseline"]["total"]["mean"],
        "loss_delta": summary["delta"]["total"]["mean"],
        "loss_delta_std": summary["delta"]["total"]["std"],
        "loss_seed_spread": summary["seed_spread"],
        "diff_model": summary["model"]["diff"]["mean"],
        "diff_baseline": summary["baseline"]["diff"]["mean"],
        "stop_model": summary["model"]["stop"]["mean"],
        "stop_baseline": summary["baseline"]["stop"]["mean"],
        "improved": int(verdict),
    }
    renames = {"similarity_to_speaker": "similarity_to_speaker_mean", "similarity_to_speaker_noref":
               "similarity_to_speaker_noref_mean", "similarity_to_prompt": "similarity_to_prompt_mean"}
    for key, value in per_tag["model"].items():
        flat[renames.get(key, key)] = value
    for key, value in per_tag["baseline"].items():
        flat[f"{key}_baseline"] = value
    flat["wer_real"], flat["cer_real"] = real["wer"], real["cer"]
    return flat


def _real_asr(plans: list[SpeakerPlan], recognisers: Recognisers, costs: Costs
              ) -> list[tuple[dict[str, Any], Rate | None]]:
    """The ASR on the real recordings of the generated texts: its floor on this data."""
    out = []
    texts = {(plan.speaker, u.row_id, u.text, u.language, u.real_audio)
             for plan in plans for u in plan.utterances}
    with costs.phase("real_asr", len(texts)):
        for speaker, row_id, text, language, audio in sorted(texts):
            heard, rate = intelligibility(load_16k(audio), text, language, recognisers)
            out.append(({"speaker": speaker, "row_id": row_id, "text": text, "language": language, **heard},
                        rate))
    return out


def _scores(run: CheckpointRun, groups: list[dict[str, Any]]) -> Scores:
    """The promotion rule's view of one checkpoint: loss over seeds, similarity per speaker with its CI."""
    totals = [loss.total for loss in run.losses]
    records = [c.record for c in run.clips]
    by_speaker: dict[str, list[float]] = {}
    for c in run.clips:
        by_speaker.setdefault(c.record["speaker"], [])
        if c.record["similarity_to_speaker"] is not None:
            by_speaker[c.record["speaker"]].append(c.record["similarity_to_speaker"])
    return Scores(
        loss=statistics.fmean(totals),
        loss_std=statistics.stdev(totals) if len(totals) > 1 else 0.0,
        similarity={speaker: mean_ci(values) for speaker, values in sorted(by_speaker.items())},
        stop_failure_rate=_stop_rate(records, "premature", "runaway"),
        split_groups=[f"{g['speaker']}/{'ref' if g['with_reference'] else 'noref'}"
                      for g in groups if g["voice_split"]],
        premature_stop_rate=_stop_rate(records, "premature"),
        runaway_stop_rate=_stop_rate(records, "runaway"),
        mos_ovrl=_mos(records, "ovrl"),
        benchmark=None if run.benchmark is None else
        {k: v for k, v in run.benchmark.figures().items() if k in ("wer", "cer")},
        clips=paired_figures(records, None if run.benchmark is None else run.benchmark.records),
    )


def paired_figures(records: list[dict[str, Any]], benchmark: list[dict[str, Any]] | None
                   ) -> dict[str, dict[str, Any]]:
    """Each clip's figures the paired gains pair (gains.FIGURES), by a key the same text, reference and
    seed give in every checkpoint: the utterance's name, `benchmark/<utt>` for a benchmark line."""
    out = {r["name"]: {"speaker": r["speaker"], "with_reference": r["with_reference"],
                       "similarity": r["similarity_to_speaker"],
                       "stop_failures": float(r["stop"] in ("premature", "runaway")),
                       "quality": None if r["mos"] is None else r["mos"]["ovrl"],
                       "wer": r.get("wer"), "cer": r.get("cer")} for r in records}
    for r in benchmark or []:
        out[f"benchmark/{r['utt']}"] = {"benchmark_wer": r.get("wer"), "benchmark_cer": r.get("cer"),
                                        "benchmark_sim": r["similarity_to_prompt"]}
    return out


def _judge(candidates: list[Candidate], scores: dict[str, Scores], base: Scores, p: EvaluateParams,
           floor: Floor | None) -> list[Scored]:
    """The promotion rule on every candidate against the baseline, with the floor's tolerances or the
    constants."""
    return [Scored(c, scores[c.tag], decide(scores[c.tag], base, None, p.similarity_tolerance,
                                            p.mos_tolerance, p.forget_tolerance, floor)) for c in candidates]


def _unmarked(audio: Any, sample_rate: int) -> Any:
    """A noise run's clips are scored and thrown away: nothing leaves to be marked."""
    return audio


def _noise_runs(chosen: Candidate, seeds: list[int], p: EvaluateParams, device: torch.device,
                plans: list[SpeakerPlan], voices: dict[str, Future[Voice]], scorers: Scorers, costs: Costs,
                kernels: KernelsChoice, unheard_voices: dict[tuple[str, str], str]
                ) -> list[dict[str, dict[str, Any]]]:
    """The chosen checkpoint's clips again under each of `seeds` (no loss, no benchmark; the clips go to a
    temporary folder, never into samples/), as the paired gains read them."""
    out = []
    with tempfile.TemporaryDirectory(prefix="voxpipe-noise-") as folder, \
            ScoringThreads(scorers, costs) as threads:
        for seed in seeds:
            run = _run_checkpoint(f"noise-seed-{seed}", chosen.path, p, device, [], plans, voices, threads,
                                  Path(folder), kernels, costs, _unmarked, seeds=[], generation_seed=seed)()
            out.append(paired_figures([c.record for c in without_unheard(run.clips, unheard_voices)], None))
    return out


class ChampionFinder(Protocol):
    """voxpipe/track/champion.py `champion_export`: the voice's @champion, its export under `folder`; None
    when it was scored on `val_digest` too."""

    def __call__(self, params: Params, folder: Path, val_digest: str | None = None) -> Any: ...


def _look_up_champion(params: Params, find: ChampionFinder | None, folder: Path, digest: str,
                      background: ThreadPoolExecutor) -> Future[Any] | None:
    """The registry asked for the voice's champion on a thread of its own, while evaluate works (importing
    MLflow and opening its store cost seconds at the end of every run); None when nothing is to ask."""
    if find is None or not params.evaluate.rescore_champion:
        return None
    return background.submit(find, params, folder, digest)


def _rescore_champion(params: Params, lookup: Future[Any] | None, batches: list[LossBatch], digest: str,
                      val: EncodedDataset, device: torch.device) -> dict[str, Any] | None:
    """The voice's champion's fixed-seed loss on this val set, when it was scored on another (a third
    checkpoint beside the base and the candidate); None when there is none or it was scored on this one."""
    if lookup is None:
        return None
    try:
        found = lookup.result()
    except StepError as e:
        log.warning("the champion was not re-scored: %s", e)
        return {"rescored": False, "reason": str(e)}
    if found is None:
        return None
    _check_data(val, _read_config(found.path), found.path)
    model = from_pretrained(found.path, device=device, kernels=params.model.kernels)
    totals = [fixed_seed_loss(model, batches, device, seed).total for seed in params.evaluate.seeds]
    log.info("champion %s v%s re-scored on this val set: loss %.5f", found.name, found.version,
             statistics.fmean(totals))
    return {"rescored": True, "name": found.name, "version": found.version, "scored_on": found.val_digest,
            "val_digest": digest, "loss": statistics.fmean(totals),
            "loss_std": statistics.stdev(totals) if len(totals) > 1 else 0.0}


def evaluate(params: Params, champion: ChampionFinder | None = None) -> EvaluateResult:
    """`evaluate`: evaluate.model (one checkpoint, or a folder of step-N exports: the best is chosen)
    against model.base, in val batches of train.max_tokens (the trainer's); `champion` (`voxpipe evaluate`
    passes the registry's) finds the voice's champion to re-score when its val set was another.

    A full (or read-only) disk ends in one paragraph naming the folder; the previous evaluation's
    eval.json and samples/ stay as they were (this run's clips are staged and removed)."""
    out = Path(params.evaluate.out)
    try:
        # the champion's export is fetched into a temporary folder, never into the DVC output
        with cpu_threads(torch.device(resolve_device_type(params.evaluate.device)), CPU_THREADS), \
                tempfile.TemporaryDirectory(prefix="voxpipe-champion-") as folder, \
                ThreadPoolExecutor(1, thread_name_prefix="voxpipe-champion") as background:
            return _evaluate(params, champion, Path(folder), background)
    except OSError as e:
        if e.errno not in DISK_ERRORS:
            raise
        shutil.rmtree(out / STAGING, ignore_errors=True)
        raise StepError(
            f"writing into {out} failed ({e.strerror or e}{f': {e.filename}' if e.filename else ''}). This "
            "run's samples were removed; the previous evaluation there (eval.json, samples/) is kept as it "
            "was. Free space on that volume (or make it writable) and rerun evaluate") from e


def write_sample(path: Path, audio: Any, sample_rate: int) -> None:
    """A 16-bit WAV, encoded in memory and written in one go (temp file + rename): a full disk is an
    OSError with its errno here, never libsndfile's own error or a truncated clip."""
    buffer = io.BytesIO()
    sf.write(buffer, audio, sample_rate, subtype="PCM_16", format="WAV")
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(buffer.getvalue()))


def publish(staged: Path, samples: Path) -> None:
    """The staged clips become samples/ (renames only: no space needed); the previous ones go."""
    old = samples.with_name(".samples-old")
    shutil.rmtree(old, ignore_errors=True)
    if samples.exists():
        samples.rename(old)
    staged.rename(samples)
    shutil.rmtree(old, ignore_errors=True)


def _evaluate(params: Params, champion: ChampionFinder | None, champion_folder: Path,
              background: ThreadPoolExecutor) -> EvaluateResult:
    p = params.evaluate
    start, cpu_start = time.perf_counter(), time.process_time()
    out, data_dir, base_path = Path(p.out), Path(p.data), Path(params.model.base)
    val = _open_split(data_dir, "val")
    if val is None or not len(val):
        raise StepError(f"{data_dir}: no encoded val rows (val.jsonl); `voxpipe encode` a val manifest first")
    exports = own_exports(Path(p.model))
    candidates = exports.candidates
    for skipped in exports.skipped:
        log.warning("not scoring %s: %s", skipped["path"], skipped["why"])
    configs = {c.path: _read_config(c.path) for c in candidates}
    configs[base_path] = _read_config(base_path)
    for path, config in configs.items():
        _check_data(val, config, path)
    config = configs[candidates[-1].path]
    device = torch.device(resolve_device_type(p.device))
    benchmark = read_benchmark(p.benchmark) if p.benchmark else None  # a bad set fails before any work

    lengths = val.lengths(config.patch_size)
    # the WHOLE val set: a row longer than the budget gets a batch of its own instead of being dropped
    budget = TokenBudget(params.train.max_tokens).widened_to(max(lengths))
    batches = val_loss_batches(val, config.patch_size, budget.max_tokens, config.max_length)
    digest = val_digest(batches, p.seeds)
    plans = plan_speakers(val, _open_split(data_dir, "train"), p.texts_per_speaker)
    config = p.model_dump()  # each backend takes its own fields (voxpipe/backends.py): evaluate.*
    costs = Costs()
    with costs.phase("scorers_load"):
        scorers = Scorers(speaker_encoder(p.speaker, config), Recognisers(p.asr, params.asr.model_dump()),
                          QUALITY[QUALITY_BACKEND].load(config), p.min_duration_ratio)
    bench = None
    if benchmark is not None:  # before the scoring threads start: the speaker encoder is theirs then
        with costs.phase("benchmark_prompts", len(benchmark.lines)):
            bench = (benchmark, load_prompts(benchmark, scorers.encoder))

    # this run's clips go to a staging folder that replaces samples/ only once eval.json is written: a
    # full disk midway leaves the previous evaluation (eval.json and its samples) as it was
    samples = out / STAGING
    shutil.rmtree(samples, ignore_errors=True)
    samples.mkdir(parents=True)

    with ScoringThreads(scorers, costs) as threads:
        pending_voices = {plan.speaker: threads.voice(_real_voice, plan, scorers, costs) for plan in plans}
        pending_asr = threads.asr(_real_asr, plans, scorers.recognisers, costs)
        mark = marker(params.synthesize.watermark)
        finish = {tag: _run_checkpoint(tag, path, p, device, batches, plans, pending_voices, threads, samples,
                                       params.model.kernels, costs, mark, bench)
                  for tag, path in [("baseline", base_path), *((c.tag, c.path) for c in candidates)]}
        # the registry while the clips are scored (the main thread only waits from here)
        champion_lookup = _look_up_champion(params, champion, champion_folder, digest, background)
        base_run, runs = finish.pop("baseline")(), {tag: done() for tag, done in finish.items()}
        average: dict[str, Any] = {"k": 0, "path": None, "averaged": [],
                                   "null_reason": "evaluate.average_top_k is 0 (off)"}
        if p.average_top_k:
            losses = {c: statistics.fmean(x.total for x in runs[c.tag].losses) for c in candidates}
            averaged, average = average_candidate(losses, p.average_top_k, out, signing_key(Path(p.model)))
            if averaged is not None:
                candidates = [*candidates, averaged]
                runs[averaged.tag] = _run_checkpoint(averaged.tag, averaged.path, p, device, batches, plans,
                                                     pending_voices, threads, samples, params.model.kernels,
                                                     costs, mark, bench)()
        voices = {speaker: v.result() for speaker, v in pending_voices.items()}
        real_asr = pending_asr.result()
    # a voice the recogniser cannot hear in its real recordings gets no WER/CER (heard.py)
    real_by_voice = real_rates_by_voice([r for r, _ in real_asr], [rate for _, rate in real_asr])
    unheard_voices = unheard(real_by_voice, p.asr_max_real_rate)
    for run in (base_run, *runs.values()):
        run.clips = without_unheard(run.clips, unheard_voices)
    base_groups = _groups("baseline", base_run.clips)
    base_scores = _scores(base_run, base_groups)
    groups, all_scores = {}, {}
    for c in candidates:
        groups[c.tag] = _groups("model", runs[c.tag].clips)
        all_scores[c.tag] = _scores(runs[c.tag], groups[c.tag])
    noise_path, fit = out / NOISE_FILE, fits(p.model_dump(), digest)
    # a floor about to be measured again is not read (nor is a broken one fatal then)
    floor, tolerance_source = (None, "") if p.noise_runs else read_floor(noise_path, fit)
    scored = _judge(candidates, all_scores, base_scores, p, floor)
    best, why = choose(scored)
    if p.noise_runs:  # the chosen checkpoint under other seeds; then the rule again, with its floor
        seeds = [p.generation_seed + i for i in range(1, p.noise_runs + 1)]
        again = _noise_runs(best.candidate, seeds, p, device, plans, pending_voices, scorers, costs,
                            params.model.kernels, unheard_voices)
        write_floor(noise_path, [best.scores.clips or {}, *again], seeds,
                    {"path": str(best.candidate.path), "step": best.candidate.step}, fit)
        floor, tolerance_source = read_floor(noise_path, fit)
        scored = _judge(candidates, all_scores, base_scores, p, floor)
        best, why = choose(scored)
    else:
        keep_or_mark(noise_path, p.noise_runs)
    if floor is None:
        tolerance_source = f"{CONSTANTS}: {tolerance_source}"
    chosen = best.candidate
    table = [s.row() for s in scored]
    verdict = best.verdict
    sentence = verdict.sentence()
    model_run = runs[chosen.tag]

    per_seed = [
        {"seed": seed, "model": m.as_dict(), "baseline": b.as_dict(), "delta": m.total - b.total}
        for seed, m, b in zip(p.seeds, model_run.losses, base_run.losses, strict=True)
    ]
    summary = summarize_seeds(per_seed)
    consistency_groups = {"model": groups[chosen.tag], "baseline": base_groups}
    per_tag = {"model": _checkpoint_figures(model_run, consistency_groups["model"]),
               "baseline": _checkpoint_figures(base_run, base_groups)}
    by_language = {tag: intelligibility_by_language([c.record for c in r.clips], [c.rate for c in r.clips])
                   for tag, r in (("model", model_run), ("baseline", base_run))}
    real_by_language = intelligibility_by_language([r for r, _ in real_asr], [rate for _, rate in real_asr])
    figures = _flat(summary, verdict.promoted, per_tag, _rates(real_by_language))
    figures["chosen_step"] = chosen.step
    figures["candidate_kind"] = chosen.kind
    for tag, suffix in (("model", ""), ("baseline", "_baseline")):
        for metric in ("wer", "cer"):
            if figures[f"{metric}{suffix}"] is None:
                figures[f"{metric}{suffix}_null_reason"] = why_no_rate_in(by_language[tag], metric)
    bench_report = None if benchmark is None else benchmark_report(
        benchmark, model_run.benchmark, base_run.benchmark, scorers.encoder.backend,
        [{"backend": r.backend, "model": r.model} for r in scorers.recognisers.loaded])
    figures.update(flat_figures(bench_report))
    figures.update(flat_gains(verdict.gains))
    figures["tolerance_source"] = tolerance_source
    for key in ("similarity_to_prompt_mean", "similarity_to_prompt_baseline"):
        if figures[key] is None:
            figures[f"{key}_null_reason"] = "no clip generated with a reference clip had a voice to embed"
    figures["similarity_to_prompt_comparable"] = int(scorers.encoder.backend == PROTOCOL_BACKEND)
    records = {"model": [c.record for c in model_run.clips], "baseline": [c.record for c in base_run.clips]}
    for tag, key in (("model", "f0_spread"), ("baseline", "f0_spread_baseline")):
        if figures[key] is None:
            figures[f"{key}_null_reason"] = no_f0_spread(records[tag])
    document = {
        **figures,
        "verdict": sentence,
        "promotion": {**verdict.as_dict(), "tolerance": p.similarity_tolerance,
                      "mos_tolerance": p.mos_tolerance, "forget_tolerance": p.forget_tolerance,
                      "tolerances": {**verdict.tolerances, "source": tolerance_source}},
        "gains": verdict.gains,
        "gain_definitions": {**FIGURES, "method": GAIN_METHOD},
        "similarity_definitions": SIMILARITY_DEFINITIONS,
        "benchmark": bench_report,
        "benchmark_null_reason": None if bench_report else NO_BENCHMARK,
        "scores": {"model": best.scores.as_dict(), "baseline": base_scores.as_dict()},
        "val_digest": digest,
        "champion": _rescore_champion(params, champion_lookup, batches, digest, val, device),
        "chosen": {"path": str(chosen.path), "step": chosen.step, "kind": chosen.kind, "tag": chosen.tag,
                   "md5": dvc_md5(chosen.path), "why": why},
        "average": average,
        "exports": table,
        "exports_of_run": exports.as_dict(),
        "languages": sorted({u.language for plan in plans for u in plan.utterances}),
        "intelligibility": {**by_language, "real": real_by_language},
        "backends": {
            "speaker_similarity": {"backend": scorers.encoder.backend, "model": scorers.encoder.model},
            "asr": [{"backend": r.backend, "model": r.model} for r in scorers.recognisers.loaded],
            "quality": {"backend": scorers.dnsmos.backend, "model": scorers.dnsmos.model},
            "speaking_rate": {plan.speaker: plan.seconds_per_unit for plan in plans},
        },
        "loss": {"seeds": per_seed, "summary": summary, "val_rows": len(val), "val_batches": len(batches)},
        "voices": {
            plan.speaker: {**voices[plan.speaker].as_dict(), "reference_id": plan.reference_id,
                           "asr_real": voice_report(real_by_voice, unheard_voices, plan.speaker)}
            for plan in plans
        },
        "consistency": consistency_groups["model"] + base_groups,
        "utterances": records,
        "real_asr": [record for record, _ in real_asr],
        "settings": p.model_dump(),
    }
    encoder = SPEAKER[scorers.encoder.backend]
    plot(out / "eval.png", records, voices, similarity=encoder.label or encoder.name)
    plot_exports(out / "exports.png", table, base_scores, chosen.step)
    write_json(out / "eval.json", document)
    publish(samples, out / "samples")
    write_listening_test(out, p.listening, listening_pairs(plans, chosen.tag, out / "samples"),
                         f"{p.generation_seed}:{digest}", document["chosen"]["md5"], chosen.tag)
    write_report(out, {
        "model": p.model,
        "chosen": str(chosen.path),
        "baseline": str(base_path),
        "data": p.data,
        "device": str(device),
        "seeds": p.seeds,
        "val_rows": len(val),
        "val_batches": len(batches),
        "speakers": len(plans),
        "utterances_per_checkpoint": sum(len(plan.utterances) for plan in plans),
        "checkpoints_scored": len(candidates),
        "exports_skipped": len(exports.skipped),
        "improved": verdict.promoted,
    }, run={
        "seconds": round(time.perf_counter() - start, 3),
        "cpu_seconds": round(time.process_time() - cpu_start, 3),
        "child_cpu_seconds": round(scorers.recognisers.child_cpu_seconds(), 3),  # pocketsphinx's process
        "cpu_threads": CPU_THREADS if device.type == "cpu" else None,
        "costs": costs.as_dict(),
        "checkpoint_seconds": {"baseline": round(base_run.seconds, 3),
                               **{tag: round(r.seconds, 3) for tag, r in runs.items()}},
    })
    if p.require_improvement and not verdict.promoted:
        raise StepError(f"{sentence}. evaluate.require_improvement is set, so this run fails "
                        f"(outputs written to {out})")
    return EvaluateResult(out, document, sentence)
