"""The README's paths, run as a user runs them: its own command blocks, in its order, in a scratch clone of
this repo, on a voice no fixture has (tests/hf_voice.py: a Hugging Face parquet written by `datasets`, 44.1
kHz, numbers, dates and money in its text).

The commands are read from README.md itself, so a README change changes what runs here: `make demo` (Try
it), the own-folder block ("No accelerator yet?", the parquet written into its `data/my-voice`), `make
sweep GRID=...` (after any set-up command its section names), `voxpipe compare --sweep <parent run id>`
with compare.html opened in headless Chromium, `voxpipe serve` spoken to with the README's own `openai`
line (plain, then streamed) and its `curl` line, and `voxpipe synthesize`. Where this machine needs a
stand-in, it is one named substitution in STAND_INS that fails, naming itself, once the README no longer
shows the text it replaces. Every block runs even
when one before it failed (as far as what it needs was made), and the test fails at the end with one
paragraph per failed block: which block, the command, and the end of its output.

The README's GPU block (`voxpipe params --recipe voxcpm2-lora-gpu1 --write params.yaml`, `dvc repro`) runs
too, in its own test: on a folder of WAVs in the LJSpeech layout, with the tiny model, the CPU and a few
steps standing in for the checkpoint, the GPU and an hour of speech (GPU_STAND_INS, given as `--set`).
"""

from __future__ import annotations

import glob
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import soundfile as sf
from hf_voice import TEXTS, write_consent, write_voice
from servers import free_port

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
STAMP = ROOT / ".venv" / ".installed"  # the Makefile's install stamp: the clone's make must not reinstall
TIMEOUT_S = 1800  # one block, on a loaded 2-core machine

# What this machine has instead of what the README assumes: (name, the README's text, the stand-in). The
# README's own folder path needs none: it is the CPU path, and the voice is written where it looks.
STAND_INS = {
    # two points, not four: the sweep machinery is the same, each point is a training run
    "two sweep points": ('GRID="train.lr=5e-5,1e-4 train.lora.r=16,32"', 'GRID="train.lr=5e-5,1e-4"'),
    # other servers (and other test runs) may hold port 8000 on a shared machine: the client lines' URL,
    # and `voxpipe serve --port` the same port
    "a free port": ("127.0.0.1:8000", "127.0.0.1:{port}"),
}

BIN = ROOT / ".venv" / "bin"
RECIPE_LINE = re.compile(r"^\s*(voxpipe params --recipe (\S+) --write params\.yaml)\s*$", re.MULTILINE)
# the GPU block's stand-ins, as `--set`: what this machine has instead of a GPU, the checkpoint, an hour
# of speech
GPU_STAND_INS = [
    "model.base=work/base_model", "encode.device=cpu", "train.device=cpu", "evaluate.device=cpu",
    "train.dtype=float32", "local.nproc=1", "train.max_steps=4", "train.warmup_steps=1", "train.val_every=2",
    "train.max_tokens=1024", "train.checkpoint_every=0", "train.export_every=2", "train.log_every=2",
    "evaluate.seeds=[0]", "evaluate.texts_per_speaker=1", "evaluate.max_len=8",
    "evaluate.inference_timesteps=2", "evaluate.asr=false", "model.preset=tiny",
]

# the section's commands this test places itself; any other it names runs before the sweep (the set-up the
# sweep needs, such as tracking your own folder)
SWEEP_SECTION_NAMED = ("make sweep", "dvc exp show", "voxpipe compare")


def stand_in(name: str, text: str, **values: str) -> str:
    readme_text, replacement = STAND_INS[name]
    assert readme_text in text, (
        f"README: the stand-in {name!r} replaces {readme_text!r}, which the README's command no longer shows "
        f"({text[:200]!r}); update STAND_INS in {Path(__file__).name} with the README")
    return text.replace(readme_text, replacement.format(**values))


def section(title: str) -> str:
    assert f"## {title}" in README, f"README: no section {title!r}"
    return README.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def sh_lines(block: str) -> list[str]:
    """A ```sh block's commands, comments dropped."""
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def sh_block_after(text: str, marker: str) -> list[str]:
    assert marker in text, f"README: no {marker!r}"
    found = re.search(r"```sh\n(.*?)```", text.split(marker, 1)[1], re.DOTALL)
    assert found, f"README: no ```sh block after {marker!r}"
    return sh_lines(found[1])


def inline(text: str, pattern: str) -> str:
    found = re.search(pattern, text)
    assert found, f"README: no inline command matching {pattern!r}"
    return found[1]


@dataclass(frozen=True)
class ReadmePath:
    """The README's commands, in its order, as this test runs them."""
    demo: list[str]
    own_folder: list[str]
    before_sweep: list[str]  # what "Try several settings" asks for first (anything but the three below)
    sweep: str
    after_sweep: list[str]  # the read-only looks it names (`dvc exp show`)
    compare: str
    serve: str
    openai_line: str
    curl_line: str
    synthesize: list[str]


def readme_path() -> ReadmePath:
    try_it = sh_lines(re.search(r"```sh\n(.*?)```", section("Try it"), re.DOTALL)[1])
    own = section("Fine-tune your own voice")
    several = section("Try several settings")
    commands = re.findall(r"`((?:make|voxpipe|dvc|git) [^`]+)`", several)  # in a user's shell: `&&` too
    return ReadmePath(
        demo=[c for c in try_it if c.startswith("make demo")],
        own_folder=sh_block_after(own, "No accelerator yet?"),
        before_sweep=[c for c in commands if not c.startswith(SWEEP_SECTION_NAMED)],
        sweep=inline(several, r"`(make sweep GRID=[^`]+)`"),
        after_sweep=[c for c in commands if c.startswith("dvc exp show")],
        compare=inline(several, r"`(voxpipe compare --sweep [^`]+)`"),
        serve=inline(own, r"`(voxpipe serve)`"),
        openai_line=inline(own, r"`(openai\.OpenAI\([^`]+)`"),
        curl_line=inline(own, r"`(curl [^`]+)`"),
        synthesize=[c for c in sh_block_after(own, "Say something new")
                    if c.startswith("voxpipe synthesize")],
    )


def test_the_readme_shows_every_command_this_test_runs():
    """Quick, not slow: the extraction itself, so a README edit that loses a block fails in test-fast too."""
    path = readme_path()
    assert path.demo == ["make demo"]
    recipe = [c for c in path.own_folder if c.startswith("voxpipe params --recipe demo-cpu")]
    assert recipe and "dvc repro" in path.own_folder, path.own_folder
    assert "ingest.input=data/my-voice" in recipe[0]  # where the voice is written
    assert "data/my-voice/voices.yaml" in (ROOT / "README.md").read_text()  # its consent (write_consent)
    assert "<parent run id>" in path.compare and path.synthesize
    stand_in("two sweep points", path.sweep)
    stand_in("a free port", path.openai_line, port="1")
    stand_in("a free port", path.curl_line, port="1")


@dataclass
class Clone:
    """The scratch clone, its environment (the venv's bin first, as `source .venv/bin/activate`), and what
    went wrong so far: one paragraph per failed README block."""
    repo: Path
    env: dict[str, str]
    failures: list[str] = field(default_factory=list)
    took: list[str] = field(default_factory=list)  # each command's seconds, printed at the end

    def sh(self, block: str, command: str, timeout: float = TIMEOUT_S) -> str | None:
        """One README command; its output, or None after recording which block failed and why."""
        start = time.monotonic()
        try:
            proc = subprocess.run(["bash", "-c", command], cwd=self.repo, env=self.env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.failures.append(f"[{block}] `{command}` ran past {timeout:.0f} s: "
                                 f"{str(e.stdout or '')[-2000:]}{str(e.stderr or '')[-2000:]}")
            return None
        out = proc.stdout + proc.stderr
        self.took.append(f"{time.monotonic() - start:6.0f} s  [{block}] {command[:70]}")
        if proc.returncode != 0:
            self.failures.append(f"[{block}] `{command}` exited {proc.returncode}:\n{out[-4000:]}")
            return None
        return out

    def check(self, block: str, what: str, ok: Callable[[], object]) -> bool:
        """A claim the README makes about a block's result; recorded when it does not hold."""
        try:
            result = ok()
        except Exception as e:  # noqa: BLE001 - the failure is reported with the block's name
            result = f"{type(e).__name__}: {e}"
        if result is True:
            return True
        self.failures.append(f"[{block}] {what}: {result!r}"[:4000])
        return False


def scratch_clone(tmp: Path) -> Clone:
    """`git clone` of this repo with the working tree's uncommitted and untracked files laid over it and
    committed (so the clone runs the code under test, and `git status` starts clean), sharing this repo's
    venv: the Makefile's stamp is kept newer than pyproject.toml, so `make` installs nothing."""
    repo = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    changed = subprocess.run(["git", "ls-files", "-z", "-m", "-o", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, changed):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
        elif (repo / name).exists():
            (repo / name).unlink()
    # a user's shell: none of the outer `make test`'s make state (its jobserver's descriptors are not ours)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_", "VOXPIPE_", "PYTEST"))
           and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    env.update(PATH=f"{repo / '.venv' / 'bin'}{os.pathsep}{env['PATH']}", DVC_NO_ANALYTICS="1",
               PYTHONPATH=str(repo),  # the clone's code, not the editable install's (this repo's)
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "the working tree under test"], cwd=repo,
                   check=True)
    (repo / ".venv").symlink_to(ROOT / ".venv")
    # .gitignore's `.venv/` matches a folder, not this link to one: git would list it as untracked
    with (repo / ".git" / "info" / "exclude").open("a") as exclude:
        exclude.write("/.venv\n")
    stamp = STAMP.stat().st_mtime
    os.utime(repo / "pyproject.toml", (stamp - 1, stamp - 1))
    return Clone(repo, env)


def ready(url: str, deadline_s: float) -> bool:
    """Whether the server's /ready answered 200 (the model loaded) within deadline_s."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=5) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def serve_block(clone: Clone, path: ReadmePath) -> None:
    """`voxpipe serve` (on a free port), then the README's `openai` line as written, the same request
    streamed through the client's `with_streaming_response`, and the README's `curl` line."""
    block = "5. serve"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = clone.repo / "work" / "serve-test.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        server = subprocess.Popen([*shlex.split(path.serve), "--port", str(port)], cwd=clone.repo,
                                  env=clone.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not ready(url, 300) or server.poll() is not None:
            clone.failures.append(f"[{block}] `{path.serve} --port {port}` never answered /ready "
                                  f"(exit {server.poll()}):\n{log.read_text()[-4000:]}")
            return
        line = stand_in("a free port", path.openai_line, port=str(port))
        clone.sh(block, f"{sys.executable} -c {shlex.quote('import openai; ' + line)}", timeout=300)
        hello = clone.repo / "hello.wav"
        clone.check(block, "the openai line's hello.wav", lambda: sf.info(str(hello)).frames > 0)
        streamed = line.replace(".audio.speech.create(", ".audio.speech.with_streaming_response.create(")
        streamed = streamed.split(".write_to_file(")[0]
        stream = (f"import openai\nwith {streamed} as r:\n"
                  "    n = sum(len(chunk) for chunk in r.iter_bytes())\nassert n > 44, n\nprint(n)")
        clone.sh(block + " (streamed)", f"{sys.executable} -c {shlex.quote(stream)}", timeout=300)
        if shutil.which("curl"):
            curl = stand_in("a free port", path.curl_line, port=str(port))
            clone.sh(block + " (curl)", curl.replace("-o hello.wav", "-o curl.wav"), timeout=300)
            wav = clone.repo / "curl.wav"
            clone.check(block, "the curl line's WAV", lambda: sf.info(str(wav)).frames > 0)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)


def queue_logs(clone: Clone) -> None:
    """Why the sweep's points failed: the end of `dvc queue logs` of each (the sweep's own error only names
    them), added to the sweep's failure."""
    names = sorted(set(re.findall(r"\bsweep-[0-9a-f]{8}-\d+\b", clone.failures[-1])))
    for name in names:
        proc = subprocess.run(["dvc", "queue", "logs", name], cwd=clone.repo, env=clone.env,
                              capture_output=True, text=True, timeout=300)
        clone.failures[-1] += f"\n`dvc queue logs {name}` ends:\n{(proc.stdout + proc.stderr)[-1500:]}"


def compare_block(clone: Clone, path: ReadmePath) -> None:
    """`voxpipe compare --sweep <parent run id>`, then compare.html in headless Chromium: a player per run,
    and every player decodes."""
    from test_ui import CHECK, CHROMIUM, page_check

    block = "4. compare"
    sweep = json.loads((clone.repo / "work" / "sweep" / "sweep.json").read_text())
    if clone.sh(block, path.compare.replace("<parent run id>", sweep["parent_run"])) is None:
        return
    page = clone.repo / "work" / "compare" / "compare.html"
    if not clone.check(block, "work/compare/compare.html exists", page.is_file):
        return
    text = page.read_text()
    runs = int((re.search(r"<h1>(\d+) runs compared</h1>", text) or [0, 0])[1])
    said = re.sub(r"\s+", " ", re.sub(r"<[^>]+>|data:[^'\"]+", " ", text))[:800]
    clone.check(block, "compare.html has the sweep's 2 runs, a player for each", lambda: runs == 2
                and text.count("<audio") >= runs and "no sample" not in text.lower()
                or f"{runs} runs, {text.count('<audio')} players; the page says: {said}")
    if CHROMIUM is None:
        return  # the players' decoding needs Chromium (tests/test_ui.py says how to install it)
    checked = page.with_name("checked.html")
    checked.write_text(text.replace("</body>", CHECK))
    durations = page_check(checked)[0]["audio"]
    clone.check(block, "every compare.html player decodes in Chromium (durations)",
                lambda: bool(durations) and all(d > 0 for d in durations) or durations)


@pytest.mark.slow
def test_the_readme_path_on_a_new_voice(tmp_path):
    if not STAMP.is_file():
        pytest.skip(f"no {STAMP.relative_to(ROOT)}: the clone shares this repo's venv (`make install` first)")
    path = readme_path()
    clone = scratch_clone(tmp_path)
    repo = clone.repo

    # 1. Try it: make demo, then git status shows the three files the README names, and only those
    for command in path.demo:
        demo = clone.sh("1. make demo", command)
    if demo is not None:
        clone.check("1. make demo", "a registered model", lambda: "registered: models:/" in demo)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo,
                                capture_output=True, text=True).stdout
        changed = {line[3:] for line in status.splitlines()}
        clone.check("1. make demo", "git status shows only dvc.lock, work/eval/eval.json, work/mfu/mfu.json",
                    lambda: changed <= {"dvc.lock", "work/eval/eval.json", "work/mfu/mfu.json"} or changed)

    # 2. Your own folder on the CPU: the voice where the README's block looks for it
    write_voice(repo / "data" / "my-voice")
    own = [clone.sh("2. own folder", command) for command in path.own_folder]
    if None not in own:
        ingest = json.loads((repo / "work" / "ingest" / "report.json").read_text())
        clone.check("2. own folder", "ingest kept every clip",
                    lambda: ingest["rows_kept"] == len(TEXTS) or ingest)
        spoken = " ".join(json.loads(line)["text"] for line in (repo / "work/ingest/raw.jsonl").open())
        clone.check("2. own folder", "numbers, dates and money spelled out",
                    lambda: "dollars" in spoken and "$" not in spoken and not re.search(r"\d", spoken)
                    or spoken[:400])
        registered = json.loads((repo / "work" / "register" / "registered.json").read_text())
        clone.check("2. own folder", "its own registered model, voxpipe-my-voice",
                    lambda: registered["model_uri"].startswith("models:/voxpipe-my-voice/") or registered)

    # 3. Try several settings: the README's sweep, on two points
    for command in path.before_sweep:
        clone.sh("3. sweep set-up", command)
    swept = clone.sh("3. make sweep", stand_in("two sweep points", path.sweep))
    for command in path.after_sweep if swept is not None else ():
        clone.sh("3. after the sweep", command)
    if swept is None:
        queue_logs(clone)
        clone.failures.append("[4. compare] not run: it compares the sweep's runs, and the sweep failed")
    else:
        compare_block(clone, path)  # 4.

    # 5. and 6.: serve and synthesize the own voice's registered model
    if None in own:
        clone.failures.append("[5. serve, 6. synthesize] not run: the own folder's model was not registered")
    else:
        serve_block(clone, path)
        for command in path.synthesize:
            args = shlex.split(command)
            said = repo / args[args.index("--out") + 1]
            if clone.sh("6. synthesize", command) is not None:
                clone.check("6. synthesize", f"{said.name} has sound",
                            lambda s=said: sf.info(str(s)).frames > 0)

    print("\n".join(clone.took))  # where the time goes (pytest shows it with -rP, or on a failure)
    assert not clone.failures, "the README's path failed:\n\n" + "\n\n".join(clone.failures)


def gpu_block() -> tuple[str, str]:
    """The recipe command of the README's GPU block and its recipe name."""
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
    write_consent(folder)
    return len(rows)


def run(repo: Path, *args: str) -> str:
    """A command in the walkthrough's repo, the venv's bin first; its output (a failure shows its end)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env['PATH']}", DVC_NO_ANALYTICS="1", OMP_NUM_THREADS="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com")
    proc = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{out[-6000:]}"
    return out


@pytest.mark.slow
def test_the_gpu_block_from_a_wav_folder_to_a_registered_model(tmp_path):
    """The README's GPU recipe block (`voxpipe params --recipe voxcpm2-lora-gpu1 ...`, `dvc repro`) on a
    folder of WAVs in the LJSpeech layout (one voice of the shipped sample), LoRA as the recipe says; in a
    minimal repo (the code, recipes and dvc.yaml), as its stand-ins make it a few seconds of training."""
    command, recipe = gpu_block()
    repo = tmp_path / "project"
    repo.mkdir()
    for name in ("dvc.yaml", ".dvcignore", ".gitignore", "params.yaml"):
        shutil.copy(ROOT / name, repo / name)
    for folder in ("voxpipe", "recipes"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "data").mkdir()
    shutil.copy(ROOT / "data" / "corrections.jsonl", repo / "data")  # ingest's dep: nothing proofread
    recipe_input = json.loads(run(repo, str(BIN / "python"), "-c", (
        "import json; from voxpipe.params import load_params; "
        f"print(json.dumps(load_params(recipe={recipe!r}).ingest.input))")).strip().splitlines()[-1])
    clips = write_ljspeech(repo / recipe_input[0])  # where the recipe looks: data/my-voice
    run(repo, "git", "init", "-q")
    run(repo, str(BIN / "dvc"), "init", "-q")

    args = command.split()[1:] + [a for s in GPU_STAND_INS for a in ("--set", s)]
    run(repo, str(BIN / "voxpipe"), *args)
    run(repo, str(BIN / "dvc"), "repro")

    ingest = json.loads((repo / "work" / "ingest" / "report.json").read_text())
    # no speaker column: the folder's one voice, named after it (data/my-voice)
    assert ingest["rows_kept"] == clips and list(ingest["speakers"]) == [Path(recipe_input[0]).name]
    assert any("one speaker" in notice for notice in ingest["notices"])  # no speaker column: said so
    assert json.loads((repo / "work" / "validate" / "validate.json").read_text())["usable"]
    trained = json.loads((repo / "work" / "train" / "report.json").read_text())
    assert trained["lora"] is True and trained["steps"] == 4  # the recipe's LoRA, the stand-in's steps
    wavs = (repo / "work" / "eval" / "samples").glob("*.wav")
    samples = [s for s in wavs if not s.name.startswith("baseline-")]
    assert samples and all(sf.info(str(s)).frames > 0 for s in samples)  # where the README says to listen
    registered = json.loads((repo / "work" / "register" / "registered.json").read_text())
    assert registered["model_uri"].startswith("models:/") and "candidate" in registered["aliases"]

