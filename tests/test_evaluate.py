"""`voxpipe evaluate` on the encoded sample: fixed-seed loss, the improvement gate, voice metrics on the
sample's two real voices, and the whole step through the CLI with the tiny model. Real audio, the real
Resemblyzer encoder, pyin and pocketsphinx; nothing is mocked.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

from voxpipe.cli import main
from voxpipe.data.audio import decode
from voxpipe.data.dataset import EncodedDataset
from voxpipe.evaluate.consistency import consistency
from voxpipe.evaluate.gains import FIGURES
from voxpipe.evaluate.pitch import median_f0
from voxpipe.evaluate.promotion import CONSTANTS, LossReference, Scores, loss_criterion
from voxpipe.evaluate.speaker import SpeakerEncoder, cosine, unit_mean
from voxpipe.evaluate.step import EvaluateResult
from voxpipe.model.io import from_pretrained
from voxpipe.train.device import distributed_runtime
from voxpipe.train.fixed_seed_loss import fixed_seed_loss, summarize_seeds, val_loss_batches
from voxpipe.train.loop import validate

CPU = torch.device("cpu")
SEEDS = [0, 1, 2]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def val(encoded_sample) -> EncodedDataset:
    return EncodedDataset(encoded_sample.encoded, "val")


@pytest.fixture(scope="module")
def base(encoded_sample):
    return from_pretrained(encoded_sample.base_model)


def _losses(model, batches, seeds=SEEDS):
    return [fixed_seed_loss(model, batches, CPU, s) for s in seeds]


def _per_seed(model_losses, base_losses):
    return [{"seed": s, "model": m.as_dict(), "baseline": b.as_dict()}
            for s, m, b in zip(SEEDS, model_losses, base_losses, strict=True)]


def _loss_criterion(summary):
    """The promotion rule's loss criterion on a model/baseline seed summary."""
    def scores(who):
        total = summary[who]["total"]
        return Scores(total["mean"], total["std"], {}, None, [])

    base = scores("baseline")
    return loss_criterion(scores("model"), LossReference("baseline", base.loss, base.loss_std))


# -- fixed-seed loss --------------------------------------------------------------------------------


def test_fixed_seed_loss_repeats_exactly_and_moves_a_little_with_the_seed(base, val):
    batches = val_loss_batches(val, base.patch_size, max_tokens=4096)
    base.train()
    first = fixed_seed_loss(base, batches, CPU, seed=0)
    again = fixed_seed_loss(base, batches, CPU, seed=0)
    other = fixed_seed_loss(base, batches, CPU, seed=1)
    assert base.training, "the model's mode is restored"
    assert first == again  # bit for bit: diff, stop and patch count
    assert first.patches == sum(float(r["audio_frames"]) / base.patch_size for r in val.rows)  # whole val set
    assert other.total != first.total
    assert abs(other.total - first.total) < 0.1 * first.total  # the seed is noise, not a different figure
    assert other.stop == pytest.approx(first.stop, rel=1e-6)  # the stop loss draws nothing


def test_batch_order_does_not_matter_and_the_trainer_validation_agrees(base, val):
    """Each batch carries its own seeded generator: reordering batches leaves the figures unchanged, and
    the trainer's in-loop validation on the same batches gives the same numbers."""
    batches = val_loss_batches(val, base.patch_size, max_tokens=160)
    assert len(batches) > 1
    forward = fixed_seed_loss(base, batches, CPU, seed=3)
    backward = fixed_seed_loss(base, batches[::-1], CPU, seed=3)
    assert backward.total == pytest.approx(forward.total, rel=1e-12)
    with distributed_runtime("cpu") as rt:
        figures = validate(base, SimpleNamespace(val_batches=lambda: batches), rt, 3)
    assert figures["val/loss"] == pytest.approx(forward.total, rel=1e-12)
    assert figures["val/diff"] == pytest.approx(forward.diff, rel=1e-12)


def test_gate_fails_a_model_against_itself_and_passes_one_that_learned_the_val_set(base, val, encoded_sample):
    batches = val_loss_batches(val, base.patch_size, max_tokens=4096)
    base_losses = _losses(base, batches)
    same = summarize_seeds(_per_seed(base_losses, _losses(base, batches)))
    criterion = _loss_criterion(same)
    assert not criterion.passed
    assert same["delta"]["total"]["mean"] == 0.0 and same["seed_spread"] > 0
    assert f"seed spread {same['seed_spread']:.5f}" in criterion.detail

    # A genuinely better model: a copy of the base trained on the val rows themselves, so its fixed-seed
    # val loss has to fall by far more than the seed noise.
    learner = from_pretrained(encoded_sample.base_model)
    optimizer = torch.optim.Adam(learner.parameters(), lr=3e-3)
    torch.manual_seed(0)
    learner.train()
    for _ in range(8):
        for lb in batches:
            out = learner(**lb.batch)
            (out["loss/diff"] + out["loss/stop"]).backward()
            optimizer.step()
            optimizer.zero_grad()
    better = summarize_seeds(_per_seed(_losses(learner, batches), base_losses))
    criterion = _loss_criterion(better)
    assert criterion.passed, criterion.detail
    assert -better["delta"]["total"]["mean"] > 3 * better["seed_spread"]
    assert better["delta"]["total"]["max"] < 0  # better under every seed, not just on average


# -- voice metrics on the sample's two real voices ----------------------------------------------------


@pytest.fixture(scope="module")
def real_clips(encoded_sample) -> dict[str, list[np.ndarray]]:
    """Six real 16 kHz clips per speaker (espeak m3 low pitch / f4 high pitch), in row-id order."""
    data = EncodedDataset(encoded_sample.encoded, "train")
    out: dict[str, list[np.ndarray]] = {}
    for row in sorted(data.rows, key=lambda r: r["id"]):
        clips = out.setdefault(row["speaker"], [])
        if len(clips) < 6:
            clips.append(decode(data.root / row["audio"], 16000))
    assert sorted(out) == ["spk_f", "spk_m"]
    return out


@pytest.fixture(scope="module")
def measured(real_clips):
    encoder = SpeakerEncoder()
    return {
        speaker: {"embeddings": [encoder.embed(w, 16000) for w in clips], "f0": [median_f0(w) for w in clips]}
        for speaker, clips in real_clips.items()
    }


def test_the_two_real_voices_come_out_as_two_voices(measured):
    # centre of each voice from three clips, scored on the other three (no clip scores against itself)
    centres = {s: unit_mean(m["embeddings"][:3]) for s, m in measured.items()}
    within = [cosine(e, centres[s]) for s, m in measured.items() for e in m["embeddings"][3:]]
    across = [cosine(e, centres[o]) for s, m in measured.items() for e in m["embeddings"][3:]
              for o in centres if o != s]
    assert min(within) > max(across) + 0.1, (within, across)
    assert min(within) > 0.75
    # pitch: every clip of the low voice under every clip of the high voice, more than a fifth apart
    low, high = measured["spk_m"]["f0"], measured["spk_f"]["f0"]
    assert None not in low + high
    assert max(low) * 1.5 < min(high), (low, high)


def test_voice_split_flag_fires_on_two_voices_under_one_label_and_not_on_one_voice(measured):
    m, f = measured["spk_m"], measured["spk_f"]
    centre = unit_mean(m["embeddings"])

    def group(embeddings, f0s):
        return consistency([cosine(e, centre) for e in embeddings], f0s, embeddings)

    mixed = group(m["embeddings"][:3] + f["embeddings"][:3], m["f0"][:3] + f["f0"][:3])
    assert mixed["voice_split"]
    assert len(mixed["split_reasons"]) == 2  # pitch and timbre both say so
    assert mixed["f0_gap_ratio"] > 2.0
    for voice in (m, f):
        single = group(voice["embeddings"], voice["f0"])
        assert not single["voice_split"], single
        assert single["f0_spread_semitones"] < 2.0
        assert single["two_voice_similarity"] > 0.8
    # the mixed set also spreads far more in pitch than either voice alone
    assert mixed["f0_spread_semitones"] > 4 * group(m["embeddings"], m["f0"])["f0_spread_semitones"]


def test_silence_has_no_voice_and_no_pitch():
    silence = np.zeros(32000, dtype=np.float32)
    assert SpeakerEncoder().embed(silence, 16000) is None
    assert median_f0(silence) is None
    stats = consistency([None, 0.9], [None, 120.0], [None, np.ones(4) / 2])
    assert (stats["no_voice"], stats["no_pitch"], stats["voice_split"]) == (1, 1, False)


# -- the step ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_evaluate_step_writes_metrics_samples_and_figure_then_gates(encoded_sample, tmp_path, capsys):
    """One run of the step, the tiny base against itself with --require-improvement: every output is
    written, then the gate fails the run because nothing improved."""
    out = tmp_path / "eval"
    base_model = str(encoded_sample.base_model)
    rc = main(["evaluate", "--model", base_model, "--model-base", base_model,
               "--data", str(encoded_sample.encoded), "--out", str(out), "--device", "cpu",
               "--seeds", "0", "1", "--set", "evaluate.texts_per_speaker=1", "--set", "evaluate.max_len=4",
               "--set", "evaluate.inference_timesteps=2", "--require-improvement"])
    report = json.loads((out / "eval.json").read_text())
    assert rc == 1
    err = capsys.readouterr().err
    assert f"{report['loss_model']:.5f}" in err and f"{report['loss_baseline']:.5f}" in err
    assert f"seed spread {report['loss_seed_spread']:.5f}" in err and "require_improvement" in err

    for key in ("loss_model", "loss_baseline", "loss_delta", "loss_seed_spread", "similarity_to_speaker_mean",
                "f0_spread", "voice_split_flag", "stop_failure_rate", "premature_stop_rate",
                "runaway_stop_rate", "rtf", "wer", "wer_real", "cer", "mos_ovrl", "mos_ovrl_baseline"):
        assert key in report, key
    numbers = {k: v for k, v in report.items() if not isinstance(v, (dict, list, str))}
    assert all(v is None or (isinstance(v, (int, float)) and math.isfinite(v)) for v in numbers.values())
    assert report["loss_delta"] == 0.0 and report["improved"] == 0 and report["loss_seed_spread"] > 0
    # the promotion rule: the same checkpoint keeps its voice but does not beat itself
    assert [c["name"] for c in report["promotion"]["criteria"] if not c["passed"]] == ["loss"]
    assert "not promoted over the baseline: loss FAIL" in err
    for speaker, ci in report["scores"]["model"]["similarity"].items():
        assert ci["n"] <= 2 and (ci["ci_low"] is None or ci["ci_low"] <= ci["mean"] <= ci["ci_high"]), speaker
    assert report["chosen"]["step"] is None and len(report["exports"]) == 1
    assert (out / "exports.png").is_file()
    assert [s["seed"] for s in report["loss"]["seeds"]] == [0, 1]
    assert report["loss"]["val_rows"] == len(EncodedDataset(encoded_sample.encoded, "val"))
    utterances = report["utterances"]["model"]
    assert len(utterances) == 4  # 2 speakers x 1 text x (with, without reference)
    assert {u["with_reference"] for u in utterances} == {True, False}
    assert all(u["patches"] <= 4 and u["max_len"] == 4 and u["rtf"] > 0 for u in utterances)
    # max_len 4 (0.64 s) is below half of every text's expected length: each clip fails on stopping, a clip
    # that reached the limit as a runaway one, any other as a premature one
    assert all(u["stop"] == ("runaway" if u["hit_limit"] else "premature") for u in utterances)
    assert report["runaway_stop_rate"] == sum(u["hit_limit"] for u in utterances) / 4
    assert report["stop_failure_rate"] == report["premature_stop_rate"] + report["runaway_stop_rate"] == 1.0
    assert all(1 <= u["mos"]["ovrl"] <= 5 and u["language"] == "en" for u in utterances)
    assert report["languages"] == ["en"] and report["intelligibility"]["model"]["en"]["asr"] == "pocketsphinx"
    assert report["backends"]["speaker_similarity"]["backend"] == "resemblyzer"

    # the same checkpoint twice: the same seeds give the same clips, so the same measurements
    def drop_rtf(records):
        return [{k: v for k, v in r.items() if k != "rtf"} for r in records]

    assert drop_rtf(utterances) == drop_rtf(report["utterances"]["baseline"])
    assert sorted(report["voices"]) == ["spk_f", "spk_m"]
    assert report["voices"]["spk_m"]["f0_median_hz"] * 1.5 < report["voices"]["spk_f"]["f0_median_hz"]
    assert 0 <= report["wer_real"] <= 1.5 and len(report["real_asr"]) == 2
    # a voice the recogniser cannot hear in its real clips (above evaluate.asr_max_real_rate) has no WER
    for speaker, voice in report["voices"].items():
        real = voice["asr_real"]["en"]
        assert real["heard"] == (real["rate"] <= 0.5) and real["clips"] == 1, speaker
        mine = [u for u in utterances if u["speaker"] == speaker]
        assert all((u["wer"] is None) != real["heard"] and u["asr_reason"] == real["reason"] for u in mine)
    # the tiny base's clips are a steady buzz, not a voice: no pitch, with the reason
    assert all(u["f0_median_hz"] is None and "steady" in u["f0_null_reason"] for u in utterances)
    assert report["f0_spread"] is None and "steady" in report["f0_spread_null_reason"]
    # the sample's voices are synthetic: pocketsphinx gets most real words wrong, so there is no WER
    assert report["wer"] is None and report["wer_baseline"] is None
    assert "voice 'spk_f'" in report["wer_null_reason"] and "voice 'spk_m'" in report["wer_null_reason"]
    assert "wer (pocketsphinx): n/a: the recogniser cannot hear" in (
        "\n".join(EvaluateResult(out, report, report["verdict"]).summary().splitlines()))

    wavs = sorted((out / "samples").glob("*.wav"))
    assert len(wavs) == 8  # both checkpoints
    assert {sf.info(str(w)).samplerate for w in wavs} == {48000}
    # every sample leaves marked (synthesize.watermark: perth, voxpipe/evaluate/marks.py)
    from voxpipe.evaluate.marks import THRESHOLD, watermark_score

    assert all(watermark_score(*sf.read(w, dtype="float32")) > THRESHOLD for w in wavs)
    assert (out / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the blind listening test (evaluate.listening advisory): a trial per text spoken with a reference
    key = json.loads((out / "listen-key.json").read_text())
    assert len(key["trials"]) == 2 and (out / "listen.html").read_text().count("<section class='trial'") == 2
    assert {t["fine_tune_clip"] for t in key["trials"].values()} <= {w.name for w in wavs}
    assert json.loads((out / "report.json").read_text())["utterances_per_checkpoint"] == 4
    # where the time went (run.json): per phase, over both checkpoints' 4 clips each
    run = json.loads((out / "run.json").read_text())
    assert run["cpu_threads"] == 1 and run["cpu_seconds"] > 0
    costs = run["costs"]
    assert {k: costs["counts"][k] for k in ("generation", "speaker", "pitch", "asr", "dnsmos", "model_load",
                                              "loss", "real_voices")} == {
        "generation": 8, "speaker": 8, "pitch": 8, "asr": 8, "dnsmos": 8, "model_load": 2, "loss": 4,
        "real_voices": 2}
    assert all(costs["phase_seconds"][k] > 0 for k in costs["counts"])
    lines = EvaluateResult(out, report, report["verdict"]).summary().splitlines()
    assert lines[0].startswith("evaluate: ") and lines[0].endswith(str(out / "eval.json"))
    assert lines[1].split() == ["criterion", "candidate", "reference", "gain", "[95%", "interval]", "limit",
                                "pass"]
    # the same checkpoint against itself: every paired gain is 0 with the interval [0, 0]
    for figure in ("similarity", "stop_failures", "quality", "similarity[spk_f]", "similarity[spk_m]"):
        g = report["gains"][figure]
        assert (g["gain"], g["low"], g["high"]) == (0.0, 0.0, 0.0) and g["n"] >= 2, figure
    for figure in FIGURES:  # each compared figure, flat for DVC and MLflow: a number or null with the reason
        assert f"{figure}_gain" in report and f"{figure}_gain_low" in report, figure
        assert report[f"{figure}_gain_low"] is not None or report[f"{figure}_gain_null_reason"], figure
    assert report["similarity_gain"] == 0.0 and report["benchmark_wer_gain"] is None
    assert "no evaluate.benchmark line" in report["benchmark_wer_gain_null_reason"]
    assert report["tolerance_source"].startswith(CONSTANTS)
    assert "noise.json missing" in report["tolerance_source"]
    assert json.loads((out / "noise.json").read_text())["measured"] is False  # DVC's metric exists
    similarity = next(line.split() for line in lines if line.split()[0] == "similarity[spk_f]")
    assert similarity[3:6] == ["+0.0000", "[+0.0000,", "+0.0000]"]
    assert similarity[6:9] == ["gain", "low", ">="]
    assert any(line.startswith("  paired gains") and "similarity +0.0000 [+0.0000, +0.0000]" in line
               for line in lines)
    loss = next(line.split() for line in lines if line.split()[0] == "loss")
    assert loss[1:3] == [f"{report['loss_model']:.5f}", f"{report['loss_baseline']:.5f}"]


def test_missing_val_split_is_a_clear_error(encoded_sample, tmp_path, capsys):
    empty = tmp_path / "encoded"
    empty.mkdir()
    base_model = str(encoded_sample.base_model)
    rc = main(["evaluate", "--model", base_model, "--model-base", base_model,
               "--data", str(empty), "--out", str(tmp_path / "eval"), "--device", "cpu"])
    assert rc == 1
    assert "no encoded val rows" in capsys.readouterr().err


def test_a_random_init_baseline_that_stops_at_once_fails_on_stopping_as_premature(base, encoded_sample):
    """The random-init tiny base predicts a stop within a few patches on texts that take seconds: with the
    automatic limit nothing runs away, and every clip counts as a premature stop, not as a success."""
    from voxpipe.evaluate.generation import plan_speakers, synthesize

    val = EncodedDataset(encoded_sample.encoded, "val")
    plans = plan_speakers(val, EncodedDataset(encoded_sample.encoded, "train"), 1)
    clips = [g for plan in plans for g in synthesize(base, plan, max_len=0, cfg_value=2.0,
                                                     inference_timesteps=2, seed=0)]
    assert all(g.utterance.expected_seconds > 1.0 for g in clips)  # speaking rate x characters
    assert all(not g.hit_limit and g.audio_seconds < 0.5 * g.utterance.expected_seconds for g in clips)
    assert [g.stop(0.5) for g in clips] == ["premature"] * len(clips)
    assert all(g.utterance.language == "en" for g in clips)  # detected from the script: no row names one


def test_a_champion_scored_on_another_val_set_is_re_scored_on_this_one(encoded_sample, val, base, tmp_path):
    """The voice's data changed since its champion was scored: evaluate scores the champion's export a
    third time, on this val set and these seeds (voxpipe/track/champion.py finds it in the registry, on a
    thread of its own, and fetches nothing for a champion scored on this val set)."""
    from concurrent.futures import ThreadPoolExecutor

    from voxpipe.evaluate.step import _look_up_champion, _rescore_champion
    from voxpipe.params import Params
    from voxpipe.track.champion import ChampionExport

    batches = val_loss_batches(val, base.patch_size, max_tokens=4096)
    params = Params.model_validate({"evaluate": {"seeds": SEEDS}})

    def champion_on(digest):
        def find(params, folder, val_digest=None):
            assert folder == tmp_path
            return None if val_digest == digest else ChampionExport("voxpipe-sample", "3", digest,
                                                                    encoded_sample.base_model)
        return find

    def rescore(params, find):
        with ThreadPoolExecutor(1) as background:
            lookup = _look_up_champion(params, find, tmp_path, "this-val", background)
            return _rescore_champion(params, lookup, batches, "this-val", val, CPU)

    again = rescore(params, champion_on("other-val"))
    totals = [loss.total for loss in _losses(base, batches)]
    assert again["rescored"] and (again["version"], again["scored_on"], again["val_digest"]) == (
        "3", "other-val", "this-val")
    assert again["loss"] == pytest.approx(sum(totals) / len(totals), rel=1e-6)
    assert rescore(params, champion_on("this-val")) is None
    assert rescore(params, lambda p, f, d: None) is None
    assert rescore(params, None) is None
    off = Params.model_validate({"evaluate": {"rescore_champion": False}})
    assert rescore(off, champion_on("other-val")) is None


# -- the scoring threads and what evaluate's time went to ---------------------------------------------


@pytest.mark.slow  # loads every scorer: DNSMOS, GE2E, pocketsphinx
def test_clips_scored_on_the_scoring_threads_equal_clips_scored_in_turn(real_clips):
    """Issue 33: evaluate scores clips on threads beside generation (DNSMOS, voice, ASR). Every figure of
    every clip is the one scoring them one after the other gives, to the bit (torch on one thread, as
    evaluate runs it)."""
    from concurrent.futures import Future

    from voxpipe.backends import QUALITY, QUALITY_BACKEND
    from voxpipe.data.asr import Recognisers
    from voxpipe.evaluate.costs import Costs
    from voxpipe.evaluate.generation import Generated, Utterance
    from voxpipe.evaluate.metrics import Scorers, Voice, clip_16k, clip_intelligibility, clip_quality, measure
    from voxpipe.evaluate.scoring_threads import ScoringThreads
    from voxpipe.steps.evaluate import EvaluateParams

    config = EvaluateParams().model_dump()
    scorers = Scorers(SpeakerEncoder(), Recognisers(["pocketsphinx"], config),
                      QUALITY[QUALITY_BACKEND].load(config), 0.5)
    voices = {}
    for speaker, clips in real_clips.items():
        centre = unit_mean([scorers.encoder.embed(w, 16000) for w in clips[:3]])
        voices[speaker] = Voice(speaker, centre, None, [], scorers.encoder.embed(clips[3], 16000))
    generated = [  # one clip a speaker, one with a reference and one without, each scorer on both threads
        Generated(Utterance(i, speaker, f"{speaker}-{i}", "val", "a short test sentence", Path("real.wav"),
                            2.0, i % 2 == 0, "en", 2.0), clips[3], 16000, 8, 4, False, 0.1)
        for i, (speaker, clips) in enumerate(real_clips.items())
    ]
    in_turn = []
    for g in generated:
        m = measure(g, clip_16k(g), voices, scorers, Costs())
        words, _ = clip_intelligibility(g, clip_16k(g), scorers, Costs())
        in_turn.append({**m.record, **words, "mos": clip_quality(clip_16k(g), scorers, Costs())})
    costs = Costs()
    ready = {name: Future() for name in voices}
    with ScoringThreads(scorers, costs) as threads:
        results = [threads.clip(g, ready) for g in generated]
        for name, future in ready.items():  # the real voices arrive after the clips were queued
            future.set_result(voices[name])
        threaded = [r().record for r in results]
    assert threaded == in_turn and [list(r) for r in threaded] == [list(r) for r in in_turn]  # keys in order
    assert all(r["mos"] and r["similarity_to_speaker"] is not None for r in threaded)
    counts = costs.as_dict()["counts"]
    assert counts == {"asr": len(generated), "dnsmos": len(generated), "pitch": len(generated),
                      "speaker": len(generated)}


def test_costs_sum_each_phase_over_its_calls_and_threads():
    import threading
    import time

    from voxpipe.evaluate.costs import Costs

    costs = Costs()

    def work():
        for _ in range(3):
            with costs.phase("wait", items=2):
                time.sleep(0.01)

    workers = [threading.Thread(target=work) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    with costs.phase("busy"):
        sum(i * i for i in range(200_000))
    got = costs.as_dict()
    assert got["counts"] == {"busy": 1, "wait": 12}
    assert set(got) == {"phase_seconds", "phase_cpu_seconds", "counts", "seconds_per_item"}
    # a sleeping phase costs no CPU (each thread's own CPU time), a busy one does
    assert got["phase_cpu_seconds"]["wait"] < got["phase_seconds"]["wait"]
    assert got["phase_cpu_seconds"]["busy"] > 0
    # per item from the unrounded sum: within the rounding of the two printed figures
    assert abs(got["seconds_per_item"]["wait"] - got["phase_seconds"]["wait"] / 12) < 1e-3
