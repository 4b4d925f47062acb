"""The CLI's conventions: flags generated from the schema, repeated flags append, `python -m voxpipe`,
`--version`, the top-level help listing the steps in pipeline order, `voxpipe params`."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from voxpipe import __version__
from voxpipe.cli import STEPS, build_parser, main, step_flags
from voxpipe.params import load_params
from voxpipe.paramspec import keys

ROOT = Path(__file__).resolve().parents[1]
PIPELINE_ORDER = ["ingest", "manifest", "validate", "init-model", "encode", "train", "evaluate", "mfu",
                  "register", "compare"]


def voxpipe(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voxpipe", *args], cwd=cwd, capture_output=True, text=True,
                          check=True)


def test_python_dash_m_runs_and_version_matches_the_package():
    out = voxpipe("--version").stdout.strip()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert out == f"voxpipe {__version__}" == f"voxpipe {version}"


def test_top_level_help_lists_every_step_in_pipeline_order_one_line_each():
    text = voxpipe("--help").stdout
    overview = text.split("steps, in pipeline order:\n")[1].split("\n\n")[0]
    listed = [line.split()[0] for line in overview.splitlines()]
    assert listed == [s.name for s in STEPS]
    assert [name for name in listed if name in PIPELINE_ORDER] == PIPELINE_ORDER
    for step in STEPS:
        assert f"  {step.name} " in text and step.help in text.replace("\n", " ")


def test_every_key_is_described_once_in_the_schema():
    missing = [k.key for k in keys() if not k.description]
    assert not missing, f"give these schema fields a description= (it is their flag help and docs): {missing}"


def test_flags_are_the_schema_keys_with_their_descriptions():
    parser = build_parser()
    train = next(s for s in STEPS if s.name == "train")
    flags = {f.name: f for f in step_flags(train)}
    assert flags["--max-steps"].key.key == "train.max_steps"
    assert flags["--model-base"].key.key == "model.base"
    assert flags["--tracking-uri"].key.key == "tracking.uri"
    assert flags["--lora"].key.key == "train.lora.enabled" and flags["--lora-r"].key.key == "train.lora.r"
    help_text = " ".join(parser._subparsers._group_actions[0].choices["train"].format_help().split())
    for flag in flags.values():  # each flag's help is its field's description, written nowhere else
        assert " ".join(flag.key.description.split()) in help_text, flag.name


def test_repeated_list_flags_append_and_bools_take_no():
    args = build_parser().parse_args(
        ["encode", "--manifest", "a.jsonl", "--manifest", "b.jsonl", "c.jsonl", "--model-base", "ckpt"])
    assert getattr(args, "encode.manifest") == ["a.jsonl", "b.jsonl", "c.jsonl"]
    args = build_parser().parse_args(["train", "--no-resume", "--lora", "--lora-r", "8", "--max-steps", "7"])
    train = next(s for s in STEPS if s.name == "train")
    flags = {f.key.key: getattr(args, f.key.key) for f in step_flags(train)}
    p = load_params(None, ["train.max_steps=3"], flags)
    assert (p.train.resume, p.train.lora.enabled, p.train.lora.r, p.train.max_steps) == (False, True, 8, 7)
    assert p.train.activation_checkpointing is False  # not given: the file's value, not argparse's False


def test_validate_encode_and_evaluate_read_the_keys_they_share():
    p = load_params(None, ["ingest.sample_rate=22050", "train.max_tokens=999", "model.base=/ckpt"])
    assert p.ingest.sample_rate == 22050 and p.train.max_tokens == 999 and p.model.base == "/ckpt"
    for gone in ("validate.sample_rate", "evaluate.max_tokens", "encode.model", "train.tracking_uri"):
        with pytest.raises(Exception, match="unknown key"):
            load_params(None, [f"{gone}=1"])


def test_params_command_prints_and_writes_the_effective_params(tmp_path, capsys):
    assert main(["params", "--set", "train.lr=0.003"]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "params.yaml"
    assert main(["params", "--set", "train.lr=0.003", "--write", str(out)]) == 0
    assert out.read_text() == printed
    assert load_params(out) == load_params(None, ["train.lr=0.003"])


def _refused(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "voxpipe", *argv], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("argv", [
    ("encode", "--model", "X"), ("train", "--model", "X"), ("mfu", "--model", "X"),
    ("train", "--max-step", "3"), ("params", "--wri", "p.yaml"),
])
def test_a_prefix_of_a_flag_is_refused_as_unrecognized(argv):
    """argparse's prefix matching is off: `encode --model X` used to mean --model-base silently."""
    assert f"unrecognized arguments: {' '.join(argv[1:])}" in _refused(*argv)


def test_one_flag_names_one_model_in_every_step():
    """--model-base is always the base checkpoint (model.base); --model always the fine-tune (promote: the
    fine-tune's registered model, whose version it names)."""
    for step in STEPS:
        for flag in step_flags(step):
            if flag.name == "--model-base":
                assert flag.key.key == "model.base", step.name
            elif flag.name == "--model":
                models = ("evaluate.model", "register.model", "synthesize.model", "serve.model",
                          "promote.model")
                assert flag.key.key in models, step.name
    evaluate = next(s for s in STEPS if s.name == "evaluate")
    assert {"--model", "--model-base"} <= {f.name for f in step_flags(evaluate)}
