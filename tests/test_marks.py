"""Every clip marked (issue 44, parts 3 and 4): synthesize's output carries PerTh's watermark and, signed with
the team's key, a C2PA manifest that c2pa-python reads back naming the model version; real recordings test
negative; the watermark goes off only with a reason; the weights load only when their sha256 matches."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from tests.marks_chain import SIGNER, signing_chain
from tests.servers import free_port, serving
from tests.test_serve import KEY, get
from voxpipe.cli import main
from voxpipe.errors import StepError
from voxpipe.evaluate import marks

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data/demo-base"
TEXT = "The quick brown fox jumps over the lazy dog."


def _synthesize(tmp_path: Path, out: str, *extra: str) -> None:
    assert main(["synthesize", "--model", str(DEMO), "--text", TEXT, "--device", "cpu",
                 "--out", str(tmp_path / out), *extra]) == 0


def _detect(capsys, *files: Path) -> list[dict]:
    capsys.readouterr()
    assert main(["detect", "--format", "json", "--files", *map(str, files)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def team_key(tmp_path, monkeypatch) -> list[str]:
    """The team's key and chain by reference: the key in an env var, the chain in a file."""
    key, chain = signing_chain()
    monkeypatch.setenv("VOXPIPE_TEST_C2PA_KEY", key.decode())
    (tmp_path / "chain.pem").write_bytes(chain)
    return ["--c2pa-key", "env:VOXPIPE_TEST_C2PA_KEY", "--c2pa-cert", str(tmp_path / "chain.pem")]


@pytest.mark.parametrize("suffix", ["wav", "mp3"])
def test_synthesize_output_is_marked_and_its_manifest_names_the_model(tmp_path, capsys, team_key, suffix):
    import c2pa

    _synthesize(tmp_path, f"out.{suffix}", *team_key)
    assert "watermark perth, C2PA signed" in capsys.readouterr().out
    (found,) = _detect(capsys, tmp_path / f"out.{suffix}")
    assert found["watermark"] and found["score"] > marks.THRESHOLD
    assert found["c2pa"]["valid"] and found["c2pa"]["signer"] == SIGNER
    assert found["c2pa"]["model_version"] == str(DEMO)
    # read back with c2pa-python itself: the AI-generated assertion and the claim generator
    mime = {"wav": "audio/wav", "mp3": "audio/mpeg"}[suffix]
    with open(tmp_path / f"out.{suffix}", "rb") as f, c2pa.Reader(mime, f) as reader:
        manifest = reader.get_active_manifest()
    assert manifest["claim_generator_info"][0]["name"] == "voxpipe"
    actions = next(a for a in manifest["assertions"] if a["label"].startswith("c2pa.actions"))
    assert actions["data"]["actions"][0]["digitalSourceType"].endswith("/trainedAlgorithmicMedia")


def test_a_mark_survives_mp3_and_16_khz(tmp_path, capsys):
    _synthesize(tmp_path, "out.wav")
    audio, rate = sf.read(tmp_path / "out.wav", dtype="float32")
    sf.write(tmp_path / "out.mp3", audio, rate, format="MP3")
    sf.write(tmp_path / "16k.wav", marks._resample(audio, rate, 16000), 16000)
    found = _detect(capsys, tmp_path / "out.mp3", tmp_path / "16k.wav")
    assert [f["watermark"] for f in found] == [True, True]


def test_without_a_key_the_clip_is_marked_but_carries_no_manifest(tmp_path, capsys):
    _synthesize(tmp_path, "out.wav")
    assert "C2PA unsigned (no key)" in capsys.readouterr().out
    (found,) = _detect(capsys, tmp_path / "out.wav")
    assert found["watermark"] and found["c2pa"] == {"present": False, "why": "no C2PA manifest in the file"}
    assert main(["detect", "--files", str(tmp_path / "out.wav")]) == 0  # the table: one line per file
    assert re.search(r"out\.wav\s+yes\s+[01]\.\d{3}\s+none$", capsys.readouterr().out, re.M)


def test_real_recordings_test_negative(tmp_path, capsys):
    """The shipped sample's recordings (every 8th) carry no mark."""
    table = pq.read_table(ROOT / "data/sample/train-00000-of-00002.parquet", columns=["audio"])
    files = []
    for i, row in enumerate(table.column("audio").to_pylist()[::8]):
        audio, rate = sf.read(io.BytesIO(row["bytes"]), dtype="float32")
        files.append(tmp_path / f"real{i}.wav")
        sf.write(files[-1], audio, rate)
    found = _detect(capsys, *files)
    assert [f["watermark"] for f in found] == [False] * len(files)
    assert all(f["c2pa"]["present"] is False for f in found)


def test_watermark_off_needs_a_reason(tmp_path, capsys):
    assert main(["synthesize", "--model", str(DEMO), "--text", "hi", "--watermark", "off"]) != 0
    err = capsys.readouterr().err
    # the params error's header, then one line naming the key, why and the way out
    assert "watermark_off_reason is empty" in err and len(err.strip().splitlines()) == 2
    assert "Traceback" not in err
    _synthesize(tmp_path, "out.wav", "--watermark", "off", "--watermark-off-reason", "a listening test")
    assert "watermark off (a listening test)" in capsys.readouterr().out
    assert not _detect(capsys, tmp_path / "out.wav")[0]["watermark"]


def test_a_c2pa_key_without_its_certificate_is_refused_before_any_model_loads(tmp_path, capsys):
    assert main(["synthesize", "--model", str(tmp_path / "no-model"), "--text", "hi",
                 "--c2pa-key", str(tmp_path / "key.pem")]) != 0
    assert "synthesize.c2pa_cert is empty while its pair is set" in capsys.readouterr().err


def test_weights_with_another_sha256_are_never_unpickled(tmp_path):
    weights = tmp_path / "perth_net_250000.pth.tar"
    shutil.copy(marks._perth_root() / marks.WEIGHTS, weights)
    with weights.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(StepError, match="not the pinned"):
        marks._checked_weights(weights)


def test_detect_names_a_missing_file(tmp_path, capsys):
    assert main(["detect", "--files", str(tmp_path / "gone.wav")]) != 0
    err = capsys.readouterr().err
    assert "no such file " in err and "gone.wav; nothing was checked" in err  # a long path keeps its name


def test_a_mark_keeps_the_clip_length_and_rate():
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(48000)).astype(np.float32)
    marked = marks.mark(audio, 48000)
    assert marked.shape == audio.shape and marked.dtype == np.float32


def test_the_mark_rebuilds_only_its_band_as_perths_full_round_trip_would():
    """mark rebuilds only the bins below 2 kHz from the marked magnitude; perth's magphase_to_signal takes
    every bin through dB and back. In float32 the two clips agree to rounding (a shifted band or a lost
    phase would not), and both read as marked."""
    import torch

    net = marks._net()  # float32: the reference
    rows = pq.read_table(sorted((ROOT / "data/sample").glob("*.parquet"))[0]).to_pylist()
    audio, rate = sf.read(io.BytesIO(rows[0]["audio"]["bytes"]), dtype="float32")
    low = torch.from_numpy(marks._resample(audio, rate, net.hp.sample_rate))
    hp = net.hp
    with torch.inference_mode():
        spec = marks._spectrum(net, low)
        level = marks._normalized_db(net, spec)
        marked = net.encoder(level[None])[0][0]
        full = torch.polar(marks._magnitude(net, marked), spec.angle())
        clips = [torch.istft(s, hp.n_fft, hp.hop_size, hp.window_size, net.window, center=True,
                             length=low.numel()) for s in (marks._embedded(net, spec, level), full)]
        assert float((clips[0] - clips[1]).abs().max()) < 1e-5
        assert float((clips[0] - low).abs().max()) > 1e-3  # a mark, not the clip unchanged
        levels = [marks._normalized_db(net, marks._spectrum(net, c)) for c in clips]
        assert all(marks._confidence(net, level) > marks.THRESHOLD for level in levels)


@pytest.mark.parametrize("frames", [13, 240, 241, 673])
def test_the_marking_networks_give_perths_answer_at_any_length(frames):
    """`mark`'s convolution stacks (padded to FRAME_MULTIPLE frames, the padding zeroed after each layer,
    weights packed for oneDNN, or F.conv2d without it) give perth's own layers' answer in float32, at
    lengths that need padding and at both of the packed weights' sizes; torch.istft's answer comes back from
    `_inverse_spectrum`."""
    import copy

    import torch

    net = marks._net()
    with torch.inference_mode():
        x = torch.rand(1, net.encoder.subband, frames)
        ours = marks._channels_last(copy.deepcopy(net.encoder.layers))
        assert all(conv.packed is not None for conv in ours.convs) == torch.backends.mkldnn.is_available()
        assert float((ours(x) - net.encoder.layers(x)).abs().max()) < 1e-6
        for conv in ours.convs:  # a torch without oneDNN's packed convolutions: F.conv2d
            conv.packed = None
        assert float((ours(x) - net.encoder.layers(x)).abs().max()) < 1e-6
        length = 320 * (frames - 1) + 7
        spec = marks._spectrum(net, 0.1 * torch.randn(length))
        expected = torch.istft(spec, 2048, 320, 2048, net.window, center=True, length=length)
        assert float((marks._inverse_spectrum(net, spec, length) - expected).abs().max()) < 1e-6


@contextmanager
def _served(root: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`voxpipe serve` of the demo checkpoint on a free port; yields its URL once /ready."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(Path(sys.executable).with_name("voxpipe")), "serve", "--model", str(DEMO),
            "--port", str(port), "--voices", str(root / "voices"), "--device", "cpu", *flags]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, "VOXPIPE_API_KEY": KEY,
           **(env or {})}
    with serving(args, f"{url}/health", root / "serve.log", env, cwd=root):
        for _ in range(800):
            if get(url, "/ready")[0] == 200:
                break
            time.sleep(0.3)
        yield url


def _speech(url: str, response_format: str, stream: bool = False) -> tuple[bytes, dict[str, str]]:
    body = {"model": "m", "voice": "default", "input": "The first sentence is here. A second one follows it.",
            "response_format": response_format, "inference_timesteps": 2, "max_len": 40,
            **({"stream_format": "audio"} if stream else {})}
    status, data, headers = get(url, "/v1/audio/speech", method="POST", body=json.dumps(body).encode())
    assert status == 200, data[:500]
    return data, {k.lower(): v for k, v in headers.items()}


@pytest.mark.slow
def test_served_clips_are_marked_streamed_or_whole_and_signed_when_whole(tmp_path, capsys):
    """Whole WAV and MP3 carry a manifest naming the served version; streamed PCM is marked sentence by
    sentence; a server without the team's key says so in X-Voxpipe-C2PA."""
    key, chain = signing_chain()
    (tmp_path / "chain.pem").write_bytes(chain)
    with _served(tmp_path, "--synthesize-c2pa-key", "env:VOXPIPE_TEST_C2PA_KEY",
                 "--synthesize-c2pa-cert", str(tmp_path / "chain.pem"),
                 env={"VOXPIPE_TEST_C2PA_KEY": key.decode()}) as url:
        for fmt in ("wav", "mp3"):
            data, headers = _speech(url, fmt)
            assert headers["x-voxpipe-c2pa"] == "signed" and headers["x-voxpipe-watermark"] == "perth"
            (tmp_path / f"served.{fmt}").write_bytes(data)
        pcm, headers = _speech(url, "pcm", stream=True)
        assert headers["x-voxpipe-c2pa"].startswith("unsigned (streamed")
        sf.write(tmp_path / "streamed.wav", np.frombuffer(pcm, "<i2"), 48000, subtype="PCM_16")
    found = _detect(capsys, tmp_path / "served.wav", tmp_path / "served.mp3", tmp_path / "streamed.wav")
    assert [f["watermark"] for f in found] == [True, True, True]
    assert [f["c2pa"].get("model_version") for f in found[:2]] == [headers["x-voxpipe-model-version"]] * 2
    assert all(f["c2pa"]["valid"] and f["c2pa"]["signer"] == SIGNER for f in found[:2])
    (tmp_path / "nokey").mkdir()
    with _served(tmp_path / "nokey") as url:
        data, headers = _speech(url, "wav")
    assert headers["x-voxpipe-c2pa"] == "unsigned (no key)"


def test_detect_names_a_file_that_is_not_audio(tmp_path, capsys):
    (tmp_path / "notes.wav").write_text("not audio")
    assert main(["detect", "--files", str(tmp_path / "notes.wav")]) != 0
    err = capsys.readouterr().err
    assert "notes.wav is not audio soundfile reads" in err and "Traceback" not in err


def test_a_key_reference_to_an_unset_variable_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("VOXPIPE_NO_SUCH_KEY", raising=False)
    (tmp_path / "chain.pem").write_bytes(signing_chain()[1])
    assert main(["synthesize", "--model", str(tmp_path / "no-model"), "--text", "hi", "--c2pa-key",
                 "env:VOXPIPE_NO_SUCH_KEY", "--c2pa-cert", str(tmp_path / "chain.pem")]) != 0
    assert "names the environment variable VOXPIPE_NO_SUCH_KEY, which is unset" in capsys.readouterr().err
