import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voxpipe.data.manifest import build_manifest
from voxpipe.data.validate import validate_manifest
from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.steps.manifest import ManifestParams


def flac(path: Path, seconds: float, sr: int = 16000, channels: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * sr)) / sr
    tone = 0.3 * np.sin(2 * np.pi * 220 * t)
    sf.write(path, np.stack([tone] * channels, axis=1), sr, format="FLAC", subtype="PCM_16")
    return path


def row(audio: str, text: str = "hello there", duration: float = 1.0, **extra) -> str:
    return json.dumps({"id": audio, "audio": audio, "text": text, "duration": duration, **extra})


def check(manifest: Path):
    out = manifest.parent / "v"
    result = validate_manifest(Params(validate={"manifest": str(manifest), "out": str(out)}))
    assert json.loads((out / "validate.json").read_text())["usable"] == (result.exit_code == 0)
    return result


def test_a_manifest_from_voxpipe_manifest_is_usable(tmp_path):
    ingest = tmp_path / "ingest"
    lines = []
    for i in range(8):
        flac(ingest / "audio" / f"{i}.flac", 0.5 + 0.1 * i)
        lines.append(json.dumps({"id": f"c{i}", "audio": f"audio/{i}.flac", "text": f"clip {i}",
                                 "speaker": "s" if i % 2 else "t", "duration": 0.5 + 0.1 * i}))
    (ingest / "raw.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "nested" / "manifest"
    params = ManifestParams(input=[str(ingest / "raw.jsonl")], out=str(out), ref_fraction=1.0)
    build_manifest(params)
    result = check(out / "train.jsonl")
    assert result.exit_code == 0 and result.problems == []
    assert result.rows == 6 and result.ref_rows == 6  # each speaker has 4 rows: one of each held out
    assert result.summary().endswith("no problems → usable")
    assert check(out / "val.jsonl").exit_code == 0


def test_every_problem_is_listed_with_its_line_number(tmp_path):
    data = tmp_path / "data"
    flac(data / "good.flac", 1.0)
    flac(data / "stereo48k.flac", 1.0, sr=48000, channels=2)
    flac(data / "short.flac", 0.1)
    (data / "garbage.flac").write_bytes(b"this is not audio " * 20)
    whole = flac(data / "truncated.flac", 2.0).read_bytes()
    (data / "truncated.flac").write_bytes(whole[: len(whole) // 2])
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    lines = [
        row("../data/good.flac", ref_audio="../data/good.flac", ref_duration=1.0),  # 1: fine
        row("../x.flac"),  # 2
        '{"audio": "../data/good.flac", "text": ',  # 3
        row("../data/good.flac", text="   "),  # 4
        row("../data/stereo48k.flac"),  # 5
        row("../data/short.flac", duration=0.1),  # 6
        row("../data/good.flac", duration=5.0),  # 7
        row("../data/garbage.flac"),  # 8
        row("../data/truncated.flac", duration=2.0),  # 9
        row("../data/good.flac", ref_audio="../data/gone.flac"),  # 10
        row("../nope.flac", text=""),  # 11: two problems on one line
        "",  # 12: blank lines are skipped
        '["a", "list"]',  # 13
        json.dumps({"id": "x", "duration": 1.0}),  # 14
    ]
    manifest = manifests / "train.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    result = check(manifest)
    expected = [
        (2, "audio file ../x.flac does not exist"),
        (3, "not valid JSON (Expecting value)"),
        (4, "text is blank"),
        (5, "audio file ../data/stereo48k.flac has the wrong format: "
            "expected 16 kHz mono, got 48000 Hz 2 ch"),
        (6, "audio file ../data/short.flac is 0.100 s, outside [0.3, 30] s"),
        (7, "duration field says 5.000 s but audio file ../data/good.flac is 1.000 s"),
        (8, "audio file ../data/garbage.flac cannot be read as audio"),
        (9, "audio file ../data/truncated.flac does not decode"),
        (10, "ref_audio file ../data/gone.flac does not exist"),
        (11, "text is blank"),
        (11, "audio file ../nope.flac does not exist"),
        (13, "a JSON list, not an object"),
        (14, "text is missing"),
        (14, "audio is missing"),
    ]
    assert [p.line for p in result.problems] == [line for line, _ in expected]
    summary = result.summary()
    for (line, fragment), problem in zip(expected, result.problems, strict=True):
        assert fragment in problem.message
        assert f"{manifest}:{line}: {problem.message}" in summary
    assert result.rows == 13 and result.exit_code == 1
    assert summary.splitlines()[-1].endswith("14 problem(s) on 12 line(s) → NOT usable")


def test_cli_exit_code_and_report(tmp_path):
    flac(tmp_path / "a.flac", 1.0)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(row("a.flac") + "\n" + row("b.flac") + "\n")
    voxpipe = str(Path(sys.executable).with_name("voxpipe"))
    done = subprocess.run([voxpipe, "validate", "--manifest", str(manifest)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert f"{manifest}:2: audio file b.flac does not exist" in done.stdout
    manifest.write_text(row("a.flac") + "\n")
    done = subprocess.run([voxpipe, "validate", "--manifest", str(manifest)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_empty_manifest_is_not_usable(tmp_path):
    (tmp_path / "m.jsonl").write_text("")
    result = check(tmp_path / "m.jsonl")
    assert result.exit_code == 1 and "m.jsonl: no rows" in result.summary()


def test_missing_manifest_is_a_run_level_error(tmp_path):
    with pytest.raises(StepError, match="manifest .*nothing.jsonl does not exist"):
        check(tmp_path / "nothing.jsonl")
