"""Issue 22: one validated request schema for `voxpipe synthesize` and the served pyfunc model.

The fast test feeds the schema itself every hostile value of the issue; the slow one sends them to a
real `mlflow models serve` process (`--env-manager local`) on 127.0.0.1 serving a registered tiny
model, and checks each gets an HTTP 4xx whose message is one line naming the field, while a good
request still gets audio.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from servers import free_port, serving
from test_track import write_eval, write_mfu, write_training

from voxpipe.cli import main
from voxpipe.data.ingest_row import RowChecks, _spoken_text
from voxpipe.params import Params
from voxpipe.serve.request import (
    MAX_TEXT_CHARS,
    Limits,
    RequestError,
    generation,
    model_locale,
    parse_request,
)
from voxpipe.steps.model import ModelParams
from voxpipe.track.register import register
from voxpipe.train.init_model import init_model


def clip_b64(seconds: float, sr: int = 16000, value: float | None = None, channels: int = 1,
             subtype: str = "PCM_16") -> str:
    n = int(seconds * sr)
    wav = 0.1 * np.sin(np.arange(n) * 2 * np.pi * 220 / sr).astype(np.float32)
    if value is not None:
        wav[n // 2] = value
    buf = io.BytesIO()
    sf.write(buf, np.stack([wav] * channels, axis=1), sr, format="WAV", subtype=subtype)
    return base64.b64encode(buf.getvalue()).decode()


HOSTILE = {  # what: (rows, params, the one-line reason expected)
    "NaN cfg": ([{"text": "hi"}], {"cfg_value": float("nan")}, r"params.cfg_value=nan: .*finite"),
    "inf cfg": ([{"text": "hi"}], {"cfg_value": float("inf")}, r"params.cfg_value=inf: .*finite"),
    "max_len=-5": ([{"text": "hi"}], {"max_len": -5}, r"params.max_len=-5: .*greater than or equal to 1"),
    "timesteps=0": ([{"text": "hi"}], {"inference_timesteps": 0}, r"params.inference_timesteps=0: .*greater"),
    "timesteps=1e6": ([{"text": "hi"}], {"inference_timesteps": 1e6}, r"inference_timesteps=1000000.*less"),
    "NaN reference": ([{"text": "hi", "reference_audio": clip_b64(1, value=float("nan"), subtype="FLOAT")}],
                      {}, r"reference_audio of row 0: the reference clip holds NaN"),
    "10-minute reference": ([{"text": "hi", "reference_audio": clip_b64(600, sr=8000)}], {},
                            r"reference_audio of row 0: 600.0 s long; at most 30 s"),
    "/etc/passwd": ([{"text": "hi", "reference_audio": "/etc/passwd"}], {},
                    r"reference_audio of row 0: not base64 audio; .*names none\)"),
    "huge text": ([{"text": "a" * 1_000_000}], {},
                  rf"text of row 0: 1000000 characters; at most {MAX_TEXT_CHARS}"),
}


def test_the_schema_refuses_each_hostile_value_in_one_line():
    for what, (rows, params, reason) in HOSTILE.items():
        with pytest.raises(RequestError, match=reason) as refused:
            parse_request([r["text"] for r in rows], [r.get("reference_audio") for r in rows], params,
                          Limits())
        assert "\n" not in str(refused.value), what
    # what passes: defaults filled in, JSON's integral floats taken as integers, stereo 48 kHz downmixed and
    # resampled to 16 kHz mono
    stereo = clip_b64(2, sr=48000, channels=2)
    ok = parse_request(["hi"], [stereo], {"max_len": 8.0, "cfg_value": 3}, Limits())
    assert ok.generation == {"seed": 0, "cfg_value": 3.0, "inference_timesteps": 10, "max_len": 8}
    assert ok.references[0].ndim == 1 and ok.references[0].size == 32000
    assert generation(None)["cfg_value"] == 2.0
    with pytest.raises(RequestError, match=r"params \['temperature'\]: unknown"):
        generation({"temperature": 1.0})
    # the clip limit is configurable; a path only inside a folder the deployment names
    with pytest.raises(RequestError, match="2.0 s long; at most 1 s"):
        parse_request(["hi"], [clip_b64(2)], {}, Limits(max_reference_seconds=1))


def test_paths_only_inside_the_deployments_folder(tmp_path):
    folder = tmp_path / "voices"
    folder.mkdir()
    (folder / "me.wav").write_bytes(base64.b64decode(clip_b64(1)))
    (tmp_path / "secret.wav").write_bytes(base64.b64decode(clip_b64(1)))
    (folder / "link.wav").symlink_to(tmp_path / "secret.wav")
    limits = Limits(reference_dir=folder)
    assert parse_request(["hi"], ["me.wav"], {}, limits).references[0].size == 16000
    for escape in ("../secret.wav", str(tmp_path / "secret.wav"), "link.wav"):
        with pytest.raises(RequestError, match="this one is outside it"):
            parse_request(["hi"], [escape], {}, limits)
    with pytest.raises(RequestError, match="names none"):  # no folder named: no path, existing or not
        parse_request(["hi"], [str(folder / "me.wav")], {}, Limits())


def test_the_cli_refuses_what_the_served_model_refuses(tmp_path, capsys):
    long = tmp_path / "long.wav"
    long.write_bytes(base64.b64decode(clip_b64(40)))
    base = ["synthesize", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "x.wav")]
    assert main([*base, "--text", "hi", "--reference", str(long)]) == 1
    assert f"synthesize.reference {long}: 40.0 s long; at most 30 s" in capsys.readouterr().err
    assert main([*base, "--text", "hi", "--reference", str(long), "--max-reference-seconds", "60"]) == 1
    assert "nor a checkpoint folder (no config.json)" in capsys.readouterr().err  # got past the check
    assert main([*base, "--text", "hi", "--set", "synthesize.cfg_value=.nan"]) == 1
    assert "cfg_value" in capsys.readouterr().err and not (tmp_path / "x.wav").exists()


SAID = {"It costs $12.50 on 3/5/2024.":
        "It costs twelve dollars and fifty cents on March fifth twenty twenty four.",
        "2026年12月2日下午2点，第2名": "二零二六年十二月二日下午两点，第二名"}


def test_a_request_is_spoken_as_ingest_spoke_the_training_text():
    """One function, one language detection: what the model is given to say is what ingest made of the
    same transcript; `normalize: false` passes the text as written."""
    texts = list(SAID)
    request = parse_request(texts, [None, None], {}, Limits())
    assert request.texts == texts and request.spoken == list(SAID.values())
    assert request.spoken == [_spoken_text(t, RowChecks(16000, 0, 30, 0, ""))[0] for t in texts]
    assert parse_request(texts, [None, None], {"normalize": False}, Limits()).spoken == texts
    assert parse_request(texts, [None, None], {"normalize": np.False_}, Limits()).spoken == texts
    assert parse_request(["hi"], [None], {"normalize": True, "seed": 3}, Limits()).generation["seed"] == 3
    with pytest.raises(RequestError, match=r"^params.normalize='yes': must be true or false$"):
        parse_request(["hi"], [None], {"normalize": "yes"}, Limits())


class _Recorder:
    """A stand-in model: records what it was given to say, answers a short silence."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def generate(self, texts, references, **generation):
        import torch

        from voxpipe.model.voxcpm2 import GeneratedSpeech

        self.said += texts
        return GeneratedSpeech([torch.zeros(480) for _ in texts], [torch.zeros(1, 1) for _ in texts],
                               [False] * len(texts), 48000)


def test_a_request_is_read_in_the_voices_locale_unless_it_names_another():
    """The voice's locale (recorded at register) reads 12/05/2026; a request's `locale` overrides it, and an
    unknown one is refused naming the field (the pyfunc, serve and synthesize share this schema)."""
    date = ["Due 12/05/2026."]
    assert parse_request(date, [None], None, Limits(), locale="en-GB").spoken == ["Due the twelfth of May "
                                                                                   "twenty twenty six."]
    assert parse_request(date, [None], None, Limits()).spoken == ["Due December fifth twenty twenty six."]
    us = parse_request(date, [None], {"locale": "en-US"}, Limits(), locale="en-GB")
    assert us.locale == "en-US" and us.spoken == ["Due December fifth twenty twenty six."]
    assert parse_request(date, [None], {"locale": ""}, Limits(), locale="en-GB").locale == "en-GB"
    for bad in ("fr-FR", "en_gb", 3, ["en-GB"]):
        with pytest.raises(RequestError, match=r"^params.locale=.*: unknown; one of en-US, en-GB, zh-CN"):
            parse_request(date, [None], {"locale": bad}, Limits())
    assert model_locale(None) == ("en-US", "none recorded with the model: en-US assumed")
    assert model_locale("zh-CN") == ("zh-CN", "recorded at register")


def test_the_served_model_says_the_normalized_text_and_returns_it():
    import pandas as pd

    from voxpipe.serve.pyfunc import VoxpipeTTS

    served = VoxpipeTTS()
    served.model, served.limits = _Recorder(), Limits()
    out = served.predict(None, pd.DataFrame({"text": list(SAID)}), params={"max_len": 4})
    assert list(out["spoken_text"]) == served.model.said == list(SAID.values())
    raw = served.predict(None, pd.DataFrame({"text": ["$12.50"]}), params={"normalize": False})
    assert list(raw["spoken_text"]) == ["$12.50"] and served.model.said[-1] == "$12.50"
    # the registered signature carries both, or MLflow's server would drop the param and the column
    from voxpipe.track.registry import signature

    assert "normalize" in [p.name for p in signature().params.params]
    assert "spoken_text" in signature().outputs.input_names()


def test_synthesize_says_what_it_spoke(tmp_path, monkeypatch, capsys):
    from voxpipe.model import io as model_io

    recorder = _Recorder()
    monkeypatch.setattr(model_io, "from_pretrained", lambda folder, device: recorder)
    recorder.eval = lambda: recorder
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    base = ["synthesize", "--model", str(tmp_path / "export"), "--out", str(tmp_path / "x.wav"),
            "--device", "cpu"]
    assert main([*base, "--text", "It costs $12.50 on 3/5/2024."]) == 0
    said = SAID["It costs $12.50 on 3/5/2024."]
    # a checkpoint folder records no locale: en-US, and the summary says it was assumed
    assumed = "normalized in en-US: none recorded with the model: en-US assumed"
    assert f"said ({assumed}): {said!r}" in capsys.readouterr().out and recorder.said == [said]
    assert main([*base, "--text", "Due 12/05/2026.", "--locale", "en-GB"]) == 0
    assert "said (normalized in en-GB: --locale): 'Due the twelfth of May" in capsys.readouterr().out
    assert main([*base, "--text", "It costs $12.50.", "--no-normalize"]) == 0
    assert "said (as written): 'It costs $12.50.'" in capsys.readouterr().out
    assert recorder.said[-1] == "It costs $12.50."


# issue 34: a reference that is not a clip is refused, never dropped into the model's own voice
NOT_A_CLIP = {  # what: (reference_audio, the one-line reason expected)
    "a number": (12345, r"reference_audio of row 0: int 12345, not a string; .*base64, or null for the"),
    "empty": ("", r"reference_audio of row 0: empty; send the clip's bytes in base64, or null"),
    "blank": ("   ", r"reference_audio of row 0: empty"),
    "bytes": (b"RIFF", r"reference_audio of row 0: bytes b'RIFF', not a string"),
    "a list": ([1, 2], r"reference_audio of row 0: list \[1, 2\], not a string"),
    "base64 of no audio": (base64.b64encode(b"\0" * 64).decode(), r"reference_audio of row 0: not decodable"),
    "a wav of no samples": (clip_b64(0), r"reference_audio of row 0: the reference clip is empty"),
}


@pytest.mark.parametrize("what", sorted(NOT_A_CLIP))
def test_a_reference_that_is_not_a_clip_is_refused(what):
    value, reason = NOT_A_CLIP[what]
    with pytest.raises(RequestError, match=reason) as refused:
        parse_request(["hi"], [value], {}, Limits())
    assert "\n" not in str(refused.value)


def test_only_a_missing_reference_means_the_models_own_voice():
    missing = [None, float("nan"), np.nan]
    request = parse_request(["a", "b", "c", "d"], [*missing, clip_b64(1)], {}, Limits())
    assert request.references[:3] == [None, None, None] and request.references[3].size == 16000


def test_the_cli_refuses_an_empty_or_undecodable_reference_naming_the_file(tmp_path, capsys):
    """`voxpipe synthesize --reference empty.wav` exited 0 and claimed that voice (issue 34)."""
    base = ["synthesize", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "x.wav"),
            "--text", "hi"]
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    assert main([*base, "--reference", str(empty)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"synthesize.reference {empty}: the file is empty (0 bytes)" in err
    assert "leave --reference out to speak in the model's own voice" in err
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"not audio at all" * 64)
    assert main([*base, "--reference", str(garbage)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"synthesize.reference {garbage}: not decodable audio" in err
    assert not (tmp_path / "x.wav").exists()


def test_the_summary_names_the_voice_actually_used(tmp_path, capsys):
    init_model(ModelParams(preset="tiny", out=str(tmp_path / "model")))
    clip = tmp_path / "me.wav"
    clip.write_bytes(base64.b64decode(clip_b64(1)))
    common = ["synthesize", "--model", str(tmp_path / "model"), "--text", "hi", "--max-len", "2",
              "--inference-timesteps", "1", "--device", "cpu"]
    assert main([*common, "--out", str(tmp_path / "own.wav")]) == 0
    assert "in the model's own voice" in capsys.readouterr().out
    assert main([*common, "--out", str(tmp_path / "cloned.wav"), "--reference", str(clip)]) == 0
    out = capsys.readouterr().out
    assert f"in the voice of {clip}" in out and "own voice" not in out


@contextmanager
def mlflow_served(root: Path, model: Path, name: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`model` registered as `name` in a fresh sqlite store under `root` and served by `mlflow models serve
    --env-manager local` on 127.0.0.1 (with `env` added to the server's environment); yields its URL."""
    files = {"model": str(model), "ingest": None, "out": str(root / "register"),
             "train": str(write_training(root / "train", 1e-4, [2.0, 1.9, 1.8])),
             "eval": str(write_eval(root / "eval", 1.9, 2.0)), "mfu": str(write_mfu(root / "mfu", 0.01))}
    (root / "work").mkdir()
    uri = f"sqlite:///{root / 'work' / 'mlflow.db'}"
    # the venv's mlflow and its uvicorn; no MLFLOW_ setting of this process leaks into the server
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    server_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{server_env.get('PATH', '')}"
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("MLFLOW_")]:
            mp.delenv(k)
        reg = register(Params.model_validate({
            "register": {**files, "model_name": name},
            "tracking": {"uri": uri, "work": str(root / "work")}, "launch": {"secret_env": {}}})).registered
    port = free_port()
    args = [str(Path(sys.executable).with_name("mlflow")), "models", "serve", "-m", reg["model_uri"],
            "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"]
    server_env.update({"MLFLOW_TRACKING_URI": uri, **(env or {})})
    with serving(args, f"http://127.0.0.1:{port}/ping", root / "serve.log", server_env, cwd=root):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A registered tiny model served by `mlflow models serve --env-manager local` on 127.0.0.1."""
    root = tmp_path_factory.mktemp("served")
    init_model(ModelParams(preset="tiny", out=str(root / "export")))
    with mlflow_served(root, root / "export", "voxpipe-served") as url:
        yield url


def invoke(url: str, rows: list[dict], params: dict) -> tuple[int, dict]:
    body = json.dumps({"dataframe_records": rows, "params": params}).encode()  # NaN/Infinity as Python writes
    request = urllib.request.Request(f"{url}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_a_served_model_answers_hostile_requests_with_a_4xx_and_one_line(served):
    status, out = invoke(served, [{"text": "hello there", "reference_audio": clip_b64(1)}],
                         {"max_len": 4, "inference_timesteps": 2})
    assert status == 200, out
    (row,) = out["predictions"]
    assert row["sample_rate"] == 48000 and len(row["audio"]) > 0 and np.isfinite(row["audio"]).all()
    for what, (rows, params, reason) in HOSTILE.items():
        status, answer = invoke(served, rows, params)
        assert 400 <= status < 500, (what, status, answer)
        message = answer["message"]
        assert "\n" not in message and len(message) < 400, (what, message[:500])
        assert re.search(reason, message), (what, message)
    # issue 34: MLflow dropped an unknown param and ran with the defaults; now a 400 naming it, and a request
    # without params is sized for its text (max_len None in the signature), not the 4096-patch maximum
    status, answer = invoke(served, [{"text": "hi"}], {"max_lenn": 4})
    assert status == 400 and "params ['max_lenn']: unknown" in answer["message"], answer
    status, out = invoke(served, [{"text": "hi"}], {})
    assert status == 200 and len(out["predictions"][0]["audio"]) <= 29 * 7680, out  # 29 patches of 160 ms
    # issue 34: a number or an empty string as the reference was served in the model's own voice
    for value in (12345, "", "AAAA"):
        status, answer = invoke(served, [{"text": "hi", "reference_audio": value}], {"max_len": 4})
        assert 400 <= status < 500, (value, status, answer)
        assert "reference_audio of row 0" in answer["message"], (value, answer)
