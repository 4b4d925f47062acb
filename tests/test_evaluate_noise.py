"""The noise floor (voxpipe/evaluate/noise.py): the spread of each figure under other generation seeds,
recorded in noise.json and read back as the rule's tolerances only while it fits the evaluation."""

from __future__ import annotations

import json

import pytest

from voxpipe.cli import main
from voxpipe.errors import StepError
from voxpipe.evaluate.noise import keep_or_mark, read_floor, spreads, write_floor
from voxpipe.evaluate.promotion import CONSTANTS

FIT = {"val_digest": "abc", "speaker": "resemblyzer", "texts_per_speaker": 8, "max_len": 0, "cfg_value": 2.0,
       "inference_timesteps": 10, "min_duration_ratio": 0.5, "asr": ["pocketsphinx"]}


def clips(similarities: list[float], mos: float = 3.0) -> dict:
    return {f"{i:03d}": {"speaker": "spk", "with_reference": i % 2 == 0, "similarity": s, "quality": mos,
                         "stop_failures": 0.0, "wer": None, "cer": None} for i, s in enumerate(similarities)}


def test_the_spread_is_the_worst_reseeded_run_against_the_first():
    first = clips([0.80, 0.70, 0.80, 0.70])
    runs = [first, clips([0.81, 0.71, 0.81, 0.71]), clips([0.77, 0.67, 0.77, 0.67], mos=3.2)]
    got = spreads(runs)
    assert got["similarity"] == pytest.approx(0.03) and got["similarity[spk]"] == pytest.approx(0.03)
    assert got["quality"] == pytest.approx(0.2) and got["stop_failures"] == 0.0
    assert "wer" not in got  # no pair: no spread, the constant stays
    # clips that move both ways under another seed: the mean stays, the interval the rule reads does not
    scattered = spreads([first, clips([0.84, 0.66, 0.76, 0.74])])
    assert scattered["similarity"] > 0.01 and spreads([first, first])["similarity"] == 0.0


def test_a_floor_is_read_only_while_it_fits_the_evaluation(tmp_path):
    path = tmp_path / "noise.json"
    floor, why = read_floor(path, FIT)
    assert floor is None and "missing" in why
    keep_or_mark(path, 0)  # DVC expects the output: it says nothing was measured
    assert json.loads(path.read_text())["measured"] is False
    floor, why = read_floor(path, FIT)
    assert floor is None and "no measured noise floor" in why
    write_floor(path, [clips([0.8, 0.7]), clips([0.82, 0.72])], [1], {"path": "x", "step": None}, FIT)
    floor, why = read_floor(path, FIT)
    assert floor is not None and floor.spreads["similarity"] == pytest.approx(0.02) and why == floor.source
    keep_or_mark(path, 0)  # a measured floor is kept by a run that measures nothing
    assert json.loads(path.read_text())["measured"] is True
    floor, why = read_floor(path, {**FIT, "inference_timesteps": 4, "val_digest": "def"})
    assert floor is None and "another inference_timesteps, val_digest" in why


def test_a_broken_noise_file_is_one_paragraph_with_the_way_out(tmp_path):
    path = tmp_path / "noise.json"
    path.write_text("{not json")
    with pytest.raises(StepError, match=r"noise.json: cannot read .*Delete it .* evaluate.noise_runs"):
        read_floor(path, FIT)


@pytest.mark.slow
def test_noise_runs_measure_a_floor_the_rule_then_uses_and_other_settings_set_aside(encoded_sample,
                                                                                     tmp_path):
    out = tmp_path / "eval"
    base_model = str(encoded_sample.base_model)
    args = ["evaluate", "--model", base_model, "--model-base", base_model, "--data",
            str(encoded_sample.encoded), "--out", str(out), "--device", "cpu", "--seeds", "0",
            "--set", "evaluate.texts_per_speaker=1", "--set", "evaluate.max_len=4",
            "--set", "evaluate.asr=false"]
    assert main([*args, "--set", "evaluate.inference_timesteps=2", "--set", "evaluate.noise_runs=1"]) == 0
    noise = json.loads((out / "noise.json").read_text())
    assert noise["measured"] and noise["runs"] == 1 and noise["generation_seeds"] == [1]
    assert set(noise["spreads"]) >= {"similarity", "quality", "stop_failures", "similarity[spk_f]"}
    report = json.loads((out / "eval.json").read_text())
    assert report["tolerance_source"].startswith("the noise floor of") and "1 other seed" in report[
        "tolerance_source"]
    tolerances = report["promotion"]["tolerances"]
    assert tolerances["similarity[spk_f]"]["tolerance"] == pytest.approx(
        noise["spreads"].get("similarity[spk_f]", noise["spreads"]["similarity"]))
    # the noise runs' clips never join samples/ (2 speakers x 1 text x with/without reference, 2 checkpoints)
    assert len(list((out / "samples").glob("*.wav"))) == 8
    # other generation settings: the floor stays on disk but does not stand for this run's noise
    assert main([*args, "--set", "evaluate.inference_timesteps=3"]) == 0
    again = json.loads((out / "eval.json").read_text())
    assert again["tolerance_source"].startswith(CONSTANTS)
    assert "another inference_timesteps" in again["tolerance_source"]
    assert json.loads((out / "noise.json").read_text()) == noise
