import subprocess
import sys

import pytest

from voxpipe.errors import StepError
from voxpipe.params import Params, load_params

DEMO = {"evaluate.texts_per_speaker": 2, "train.export_every": 40,  # the demo: its time budget on 2 cores
        "model.base": "data/demo-base",  # the shipped demo base (docs/demo-base.md)
        "train.lr": 1e-4}  # the tiny base was pretrained at 1e-3: 1e-5 barely moves it in 40 steps


def test_repo_params_yaml_matches_schema_defaults():
    # params.yaml is the documented source of truth; it must validate and equal the schema defaults, but
    # for the demo's values
    here, defaults = load_params("params.yaml").flat(), Params().flat()
    assert {k: v for k, v in here.items() if defaults[k] != v} == DEMO


def test_set_override_and_flag_precedence(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("ingest:\n  min_seconds: 0.5\n")
    p = load_params(f, ["ingest.min_seconds=0.7", "manifest.seed=3"])
    assert p.ingest.min_seconds == 0.7 and p.manifest.seed == 3
    p = load_params(f, ["ingest.min_seconds=0.7"], {"ingest.min_seconds": 1.5, "ingest.out": None})
    assert p.ingest.min_seconds == 1.5 and p.ingest.out == "work/ingest"


@pytest.mark.parametrize(
    "override, message",
    [
        ("ingest.bogus=1", "ingest.bogus: unknown key"),
        ("nosuch.key=1", "nosuch: unknown key"),
        ("ingest.min_seconds=abc", "ingest.min_seconds"),
        ("ingest.workers=1.5", "ingest.workers"),
        ("ingest.min_seconds", "expected section.key=value"),
        ("ingest=3", "must be section.key"),
    ],
)
def test_bad_overrides_name_the_key(tmp_path, override, message):
    with pytest.raises(StepError, match=message.replace(".", r"\.")):
        load_params(None, [override])


def test_a_key_at_its_old_place_still_loads_where_it_is_now(tmp_path):
    """evaluate.whisper_model moved to asr.whisper_model (ingest reads it too): an older file loads."""
    f = tmp_path / "p.yaml"
    f.write_text("evaluate:\n  whisper_model: models/whisper\n  paraformer_model: null\n")
    p = load_params(f)
    assert p.asr.whisper_model == "models/whisper" and "whisper_model" not in p.evaluate.model_fields
    assert load_params(f, ["asr.whisper_model=models/whisper"]).asr.whisper_model == "models/whisper"
    with pytest.raises(StepError, match=r"evaluate\.whisper_model \(its old place\) is 'models/whisper' but "
                       r"asr\.whisper_model is 'models/other': keep only asr\.whisper_model"):
        load_params(f, ["asr.whisper_model=models/other"])


def test_missing_params_file_is_an_error(tmp_path):
    with pytest.raises(StepError, match="does not exist"):
        load_params(tmp_path / "nope.yaml")


def test_cli_reports_param_errors_and_exits_nonzero():
    r = subprocess.run(
        [sys.executable, "-m", "voxpipe.cli", "ingest", "--set", "ingest.max_seconds=-1"],
        capture_output=True, text=True,
    )
    assert r.returncode == 1
    assert "ingest.max_seconds" in r.stderr


def test_a_list_key_takes_one_value():
    """`--set ingest.input=data/my-voice` is the one-folder list, as `[data/my-voice]` is."""
    assert load_params(None, ["ingest.input=data/my-voice"]).ingest.input == ["data/my-voice"]
    assert load_params(None, ["ingest.input=[a, b]"]).ingest.input == ["a", "b"]


def test_a_wrong_shape_is_shown_the_right_one():
    with pytest.raises(StepError) as raised:
        load_params(None, ["ingest.input={a: 1}", "train.lora.r=[1]"])
    text = str(raised.value)
    assert "ingest.input: Input should be a valid list" in text
    assert "e.g. ingest.input: [data/sample] (on the command line: --set 'ingest.input=[data/sample]')" \
        in text
    assert "e.g. train.lora.r: 32" in text
