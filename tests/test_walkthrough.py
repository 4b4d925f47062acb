"""The README's "Fine-tune your own voice" walkthrough, end to end, with its own commands: a folder of WAVs in
the LJSpeech layout (made here from one speaker of the shipped sample), a recipe written into params.yaml,
`dvc repro`, then the samples to listen to and the registered model. Stand-ins, given as `--set`: the tiny
random-init model (init-model's output) for the downloaded checkpoint, the CPU for the GPU, a few steps."""

from __future__ import annotations

import glob
import io
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import soundfile as sf

pytestmark = pytest.mark.slow  # the whole walkthrough: ingest to a registered model, through the CLI
ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
README = (ROOT / "README.md").read_text(encoding="utf-8")
RECIPE_LINE = re.compile(r"^\s*(voxpipe params --recipe (\S+) --write params\.yaml)\s*$", re.MULTILINE)
STAND_INS = [  # what this machine has instead of a GPU, the checkpoint and an hour of speech
    "model.base=work/base_model", "encode.device=cpu", "train.device=cpu", "evaluate.device=cpu",
    "train.dtype=float32", "local.nproc=1", "train.max_steps=4", "train.warmup_steps=1", "train.val_every=2",
    "train.max_tokens=1024", "train.checkpoint_every=0", "train.export_every=2", "train.log_every=2",
    "evaluate.seeds=[0]", "evaluate.texts_per_speaker=1", "evaluate.max_len=8",
    "evaluate.inference_timesteps=2", "evaluate.asr=false", "model.preset=tiny",
]


def readme_walkthrough() -> tuple[str, str]:
    """The recipe command of the README's walkthrough and its recipe name."""
    section = README.split("## Fine-tune your own voice", 1)[1].split("\n## ", 1)[0]
    match = RECIPE_LINE.search(section)
    assert match, "README: the walkthrough shows no `voxpipe params --recipe NAME --write params.yaml`"
    assert re.search(r"^\s*dvc repro\s*$", section, re.MULTILINE), "README: no `dvc repro` in the walkthrough"
    return match[1], match[2]


def write_ljspeech(folder: Path, speaker: str = "spk_f") -> int:
    """metadata.csv (id|text|normalized text) + wavs/<id>.wav at 22.05 kHz: one voice, as LJSpeech ships."""
    table = pq.read_table(sorted(glob.glob(str(ROOT / "data" / "sample" / "*.parquet")))[0]).to_pylist()
    rows = [r for r in table if r["speaker"] == speaker]
    (folder / "wavs").mkdir(parents=True)
    lines = []
    for i, row in enumerate(rows):
        audio, rate = sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="float32")
        sf.write(folder / "wavs" / f"MV-{i:04d}.wav", audio, rate, subtype="PCM_16")
        lines.append(f"MV-{i:04d}|{row['text']}|{row['text']}")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(rows)


def run(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env['PATH']}", DVC_NO_ANALYTICS="1", OMP_NUM_THREADS="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com")
    proc = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{out[-6000:]}"
    return out


def test_own_voice_walkthrough_from_a_wav_folder_to_a_registered_model(tmp_path):
    command, recipe = readme_walkthrough()
    repo = tmp_path / "project"
    repo.mkdir()
    for name in ("dvc.yaml", ".dvcignore", ".gitignore", "params.yaml"):
        shutil.copy(ROOT / name, repo / name)
    for folder in ("voxpipe", "recipes"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    recipe_input = json.loads(run(repo, str(BIN / "python"), "-c", (
        "import json; from voxpipe.params import load_params; "
        f"print(json.dumps(load_params(recipe={recipe!r}).ingest.input))")).strip().splitlines()[-1])
    clips = write_ljspeech(repo / recipe_input[0])  # where the recipe looks: data/my-voice
    run(repo, "git", "init", "-q")
    run(repo, str(BIN / "dvc"), "init", "-q")

    args = command.split()[1:] + [a for s in STAND_INS for a in ("--set", s)]
    run(repo, str(BIN / "voxpipe"), *args)
    run(repo, str(BIN / "dvc"), "repro")

    ingest = json.loads((repo / "work" / "ingest" / "report.json").read_text())
    assert ingest["rows_kept"] == clips and list(ingest["speakers"]) == ["default"]
    assert any("one speaker" in notice for notice in ingest["notices"])  # no speaker column: said so
    assert json.loads((repo / "work" / "validate" / "validate.json").read_text())["usable"]
    trained = json.loads((repo / "work" / "train" / "report.json").read_text())
    assert trained["lora"] is True and trained["steps"] == 4  # the recipe's LoRA, the stand-in's steps
    wavs = (repo / "work" / "eval" / "samples").glob("*.wav")
    samples = [s for s in wavs if not s.name.startswith("baseline-")]
    assert samples and all(sf.info(str(s)).frames > 0 for s in samples)  # where the README says to listen
    registered = json.loads((repo / "work" / "register" / "registered.json").read_text())
    assert registered["model_uri"].startswith("models:/") and "candidate" in registered["aliases"]

    # "say something new in your voice": the README's command, on the version just registered
    say = shlex.split(re.search(r"^voxpipe synthesize .*$", README, re.MULTILINE)[0])
    run(repo, str(BIN / "voxpipe"), *say[1:], "--model", registered["model_uri"], "--max-len", "8",
        "--device", "cpu")
    out = repo / say[say.index("--out") + 1]
    assert sf.info(str(out)).frames > 0
