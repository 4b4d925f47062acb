"""Issue 41 part 4: a `voxpipe serve` that a gone client or a slow one cannot hold.

One real server per module: `voxpipe serve` of a tiny checkpoint whose stop head never fires (every request
runs to its max_len, so a gone client's generation would hold the only slot for minutes), with a single-
speaker voices folder, concurrency 1, 16 connections at most, 2 s for headers, 5 s for a body, 1 s of
keep-alive and the process limited to 256 open files. The clients are raw sockets (slowloris, disconnects),
urllib and OpenAI's own; no test times the server: a held slot shows as the next request's client timing out.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf
from servers import free_port, serving
from test_request import clip_b64
from test_serve import KEY, client, get

from voxpipe.errors import StepError
from voxpipe.serve.request import Limits
from voxpipe.serve.voices import VoiceStore
from voxpipe.steps.model import ModelParams
from voxpipe.track.voices import write_training_voices
from voxpipe.train.init_model import init_model

LONG = {"input": "A text said for as long as the model is let.", "max_len": 4096, "inference_timesteps": 10}
SHORT = {"inference_timesteps": 1, "max_len": 4}
HEAD = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
LIMIT_FILES = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); "
               "os.execv(sys.argv[1], sys.argv[1:])")


def runaway_checkpoint(folder: Path) -> Path:
    """The tiny model with a stop head that never says stop, and one speaker's voice, as a single-speaker
    training set's register writes it (the speaker "default")."""
    from safetensors.torch import load_file, save_file

    init_model(ModelParams(preset="tiny", out=str(folder)))
    state = load_file(folder / "model.safetensors")
    state["stop_proj.weight"].zero_()
    state["stop_proj.bias"].fill_(10.0)  # silu(10) > 0 in every unit: the "go on" logit always wins
    state["stop_head.weight"].zero_()
    state["stop_head.weight"][0].fill_(1.0)
    save_file(state, folder / "model.safetensors")
    ingest = folder.parent / "ingest"
    ingest.mkdir()
    sf.write(ingest / "a.wav", 0.1 * np.sin(np.arange(32000) / 8).astype(np.float32), 16000)
    row = {"speaker": "default", "duration": 2.0, "audio": "a.wav", "text": "a tone"}
    write_training_voices(ingest, [row], folder / "voices")
    return folder


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory) -> Iterator[tuple[str, int, Path]]:
    root = tmp_path_factory.mktemp("hostile")
    model = runaway_checkpoint(root / "runaway")
    port = free_port()
    voxpipe = str(Path(sys.executable).with_name("voxpipe"))
    args = [sys.executable, "-c", LIMIT_FILES, voxpipe, "serve", "--model", str(model), "--port", str(port),
            "--voices", str(root / "voices"), "--device", "cpu", "--concurrency", "1", "--queue", "4",
            "--synthesize-deadline-s", "3600", "--set", "serve.max_connections=16",
            "--set", "serve.header_timeout_s=2", "--set", "serve.body_timeout_s=5",
            "--set", "serve.keep_alive_s=1", "--set", "serve.stall_timeout_s=2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update({"VOXPIPE_API_KEY": KEY, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    with serving(args, f"{url}/health", root / "serve.log", env, cwd=root):
        for _ in range(800):
            if get(url, "/ready")[0] == 200:
                break
            time.sleep(0.3)
        yield url, port, root / "serve.log"
    log = (root / "serve.log").read_text()
    assert "Traceback" not in log and "Too many open files" not in log, log[-3000:]


def metric(url: str, pattern: str) -> float:
    page = get(url, "/metrics")[1].decode()
    m = re.search(pattern, page, re.M)
    return float(m.group(1)) if m else 0.0


def in_flight(url: str) -> float:
    return metric(url, r"^voxpipe_speech_in_flight (\S+)$")


def wait_for(what, tries: int = 300) -> None:
    for _ in range(tries):
        if what():
            return
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def send_speech(port: int, body: dict, whole: bool = True) -> socket.socket:
    data = json.dumps(body).encode()
    s = connect(port)
    head = HEAD.format(key=KEY) + f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    s.sendall(head.encode() + (data if whole else data[:10]))
    return s


def closed_by_server(s: socket.socket, tries: int = 100) -> bytes | None:
    """What the server sent before it closed the connection; None while it keeps it open (~10 s at most)."""
    s.settimeout(0.1)
    got = b""
    for _ in range(tries):
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk
    return None


def still_serves(url: str) -> None:
    """The only slot is free: a short request answers before its client gives up (60 s; the gone request
    it followed would run for minutes)."""
    audio = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60).audio.speech.create(
        model="m", voice="default", input="Still here.", extra_body=SHORT).read()
    assert audio[:4] == b"RIFF"
    wait_for(lambda: in_flight(url) == 0)


# --- a client that leaves: its work stops within a patch, its slot or queue place is given back ---

def leave_while_generating(url: str, port: int) -> None:
    s = send_speech(port, LONG)
    wait_for(lambda: in_flight(url) == 1)
    time.sleep(0.5)  # some patches in
    s.close()


def leave_while_queued(url: str, port: int) -> None:
    first = send_speech(port, LONG)
    wait_for(lambda: in_flight(url) == 1)
    queued = [send_speech(port, LONG) for _ in range(3)]
    wait_for(lambda: in_flight(url) == 4)
    for s in queued:
        s.close()
    wait_for(lambda: in_flight(url) == 1)  # their places are back while the first still generates
    first.close()


def leave_mid_body(url: str, port: int) -> None:
    send_speech(port, LONG, whole=False).close()


def leave_mid_stream(url: str, port: int) -> None:
    many = "This is one sentence of a text that goes on. " * 30  # each sentence up to 200 patches
    s = send_speech(port, {**LONG, "input": many, "max_len": 200, "response_format": "pcm"})
    s.settimeout(30)
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    s.close()


def leave_at_once(url: str, port: int) -> None:
    s = send_speech(port, LONG)
    s.shutdown(socket.SHUT_RDWR)
    s.close()


MOMENTS = [leave_while_generating, leave_while_queued, leave_mid_body, leave_mid_stream, leave_at_once]


@pytest.mark.parametrize("moment", MOMENTS, ids=lambda f: f.__name__)
def test_a_client_that_leaves_gives_its_slot_back(hostile_server, moment):
    url, port, _ = hostile_server
    before = metric(url, r'^voxpipe_requests_total\{route="/v1/audio/speech",status="499"\} (\S+)$')
    moment(url, port)
    still_serves(url)
    if moment in (leave_while_generating, leave_while_queued):  # a non-streamed request that nobody hears
        after = metric(url, r'^voxpipe_requests_total\{route="/v1/audio/speech",status="499"\} (\S+)$')
        assert after > before


# --- slow clients: header and body timeouts, keep-alive, the connection cap ---

def test_a_request_line_trickled_a_byte_at_a_time_is_closed(hostile_server):
    _, port, _ = hostile_server
    with closing(connect(port)) as s:
        s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\n")
        s.settimeout(0.3)
        for i in range(40):  # 12 s at most; the header timeout is 2 s
            try:
                s.sendall(b"X-Slow: %d\r\n" % i)
                if s.recv(100) == b"":
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        else:
            pytest.fail("a trickled request held its connection past the header timeout")


def test_a_connection_that_sends_nothing_is_closed(hostile_server):
    _, port, _ = hostile_server
    with closing(connect(port)) as s:
        assert closed_by_server(s) == b""


def test_a_body_that_does_not_arrive_is_a_408(hostile_server):
    _, port, _ = hostile_server
    with closing(send_speech(port, LONG, whole=False)) as s:
        answer = closed_by_server(s)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
    assert b"serve.body_timeout_s" in answer


def test_an_idle_kept_alive_connection_is_closed(hostile_server):
    _, port, _ = hostile_server
    with closing(connect(port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = closed_by_server(s)
    assert answer is not None and answer.startswith(b"HTTP/1.1 200"), answer


def test_a_stream_nobody_reads_is_cut_off_and_gives_its_slot_back(hostile_server):
    """A client that keeps its connection but reads nothing: the stream fills the buffers between them, and
    after serve.stall_timeout_s the server cuts it off; before, its generator waited between sentences
    holding the only slot for as long as the client pleased."""
    url, port, _ = hostile_server
    data = json.dumps({**LONG, "input": "This is one sentence of a text that goes on. " * 30, "max_len": 200,
                       "response_format": "pcm"}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's buffer fills
    s.connect(("127.0.0.1", port))
    with closing(s):
        s.sendall((HEAD.format(key=KEY) + f"Content-Type: application/json\r\nContent-Length: {len(data)}"
                   "\r\n\r\n").encode() + data)
        still_serves(url)  # while the reader still holds its connection, unread


def test_300_half_sent_requests_neither_take_the_files_nor_stop_health(hostile_server):
    """The issue's case, with a 16-connection cap and 256 files: each new connection closes the oldest
    still waiting, /health and a speech request answer while they are all open, and no accept fails."""
    url, port, log = hostile_server
    socks = []
    try:
        for _ in range(300):
            s = connect(port)
            s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        assert get(url, "/health", key=None)[0] == 200
        still_serves(url)
    finally:
        for s in socks:
            s.close()
    assert "Too many open files" not in log.read_text()


def test_health_answers_when_every_connection_has_a_request_running(hostile_server):
    """16 requests whose bodies are still coming hold the cap (none may be closed to make room); a probe
    still answers, another route is a 503, and the bodies' timeout frees them."""
    url, port, _ = hostile_server
    slow = [send_speech(port, LONG, whole=False) for _ in range(16)]
    time.sleep(0.5)  # the server has read their headers (their bodies have 5 s)
    try:
        assert get(url, "/health", key=None)[0] == 200
        assert get(url, "/v1/models")[0] == 503
    finally:
        for s in slow:
            s.close()
    still_serves(url)


# --- bad bodies: a 4xx naming the field, never a 500 ---

BAD_BODIES = {  # what: (the body's bytes, the status, the param named or None, the message)
    "JSON nested 200,000 deep": (b"[" * 200_000 + b"]" * 200_000, 400, None, r"nested too deep"),
    "an object nested 50,000 deep": (b'{"input": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001, 400, None,
                                     r"nested too deep"),
    "a lone surrogate in input": (b'{"input": "hi \\ud800 there"}', 400, "input", r"lone UTF-16 surrogate"),
    "a lone low surrogate in input": (b'{"input": "\\udfff"}', 400, "input", r"lone UTF-16 surrogate"),
    "a surrogate in reference_text": (b'{"input": "hi", "reference_text": "\\ud800", "reference_audio": "'
                                      + clip_b64(1).encode() + b'"}', 400, "reference_text", r"surrogate"),
    "a surrogate in reference_audio": (b'{"input": "hi", "reference_audio": "\\ud800"}', 400,
                                       "reference_audio", r"surrogate"),
    "a surrogate as a field name": (b'{"input": "hi", "\\ud800": 1}', 400, None, r"surrogate"),
    "a surrogate as the voice": (b'{"input": "hi", "voice": "\\udc00"}', 400, "voice", r"no such voice"),
    "input a number": (b'{"input": 5}', 400, "input", r"input: int 5, not a string"),
    "input a list": (b'{"input": ["hi"]}', 400, "input", r"not a string"),
    "input an object": (b'{"input": {"text": "hi"}}', 400, "input", r"not a string"),
    "input true": (b'{"input": true}', 400, "input", r"not a string"),
    "input null": (b'{"input": null}', 400, "input", r"input: missing"),
    "no input": (b'{"voice": "default"}', 400, "input", r"input: missing"),
    "the body a list": (b'["hi"]', 400, None, r"body: .*dictionary"),
    "the body a string": (b'"hi"', 400, None, r"body: .*dictionary"),
    "not UTF-8": (b'{"input": "\xff\xfe"}', 400, None, r"not JSON"),
    "a 5,000-digit number": (b'{"input": "hi", "seed": ' + b"9" * 5000 + b"}", 400, None, r"not JSON"),
    "NaN cfg_value": (b'{"input": "hi", "cfg_value": NaN}', 400, "cfg_value", r"cfg_value"),
    "max_len a string": (b'{"input": "hi", "max_len": "4"}', 400, "max_len", r"max_len"),
    "voice a list": (b'{"input": "hi", "voice": ["a"]}', 400, "voice", r"voice"),
    "speed a string": (b'{"input": "hi", "speed": "fast"}', 400, "speed", r"speed"),
}


@pytest.mark.parametrize("what", list(BAD_BODIES))
def test_every_bad_body_is_a_4xx_naming_the_field(hostile_server, what):
    url, _, _ = hostile_server
    body, status, param, message = BAD_BODIES[what]
    got, answer, _ = get(url, "/v1/audio/speech", method="POST", body=body)
    error = json.loads(answer)["error"]
    assert got == status and error["param"] == param, (got, error)
    assert re.search(message, error["message"]) and "\n" not in error["message"], error
    assert len(error["message"]) < 400 and "Traceback" not in error["message"]


@pytest.mark.parametrize("body", [b'{"name": "\\ud800", "audio": "AAAA", "text": "hi"}',
                                  b'{"name": "ok", "audio": "AAAA", "text": "\\udfff"}',
                                  b'{"name": 5, "audio": "AAAA", "text": "hi"}', b"[" * 100_000])
def test_a_bad_voice_body_is_a_400(hostile_server, body):
    url, _, _ = hostile_server
    status, answer, _ = get(url, "/v1/audio/voices", method="POST", body=body)
    assert status == 400 and "\n" not in json.loads(answer)["error"]["message"], answer


# --- voices, the access log ---

def test_a_single_speaker_models_voices_are_each_named_once(hostile_server):
    url, _, _ = hostile_server
    voices = json.loads(get(url, "/v1/audio/voices")[1])["voices"]
    names = [v["name"] for v in voices]
    assert len(names) == len(set(names)) == 2, voices
    assert voices[0]["id"] == "default" and voices[1]["id"] == voices[1]["name"] == "default-voice", voices


def test_one_access_line_a_request_without_the_text_or_the_key(hostile_server):
    url, _, log = hostile_server
    secret = "Words only the client should know."
    client(url).audio.speech.create(model="m", voice="default-voice", input=secret, extra_body=SHORT).read()
    get(url, "/v1/audio/voices/nobody", method="DELETE")
    time.sleep(0.2)  # the line is written after the answer
    text = log.read_text()
    lines = [line for line in text.splitlines() if "voxpipe.serve.access" in line]
    assert any(re.search(r"POST /v1/audio/speech 200 \d+\.\d+ s, \d+\.\d\d s of audio, voice default-voice$",
                         line) for line in lines), lines[-5:]
    assert any("DELETE /v1/audio/voices/{vid} 404" in line for line in lines), lines[-5:]
    assert secret not in text and KEY not in text


# --- corrupt voices files ---

JUNK = [b"\x00\xff\x13binary junk", b'{"voices": []}', b"[" * 100_000, b'"a string"']


@pytest.mark.slow  # starts `voxpipe serve` once a file
@pytest.mark.parametrize("junk", JUNK)
def test_a_corrupt_voices_file_is_one_paragraph_at_start(tmp_path, junk):
    model = tmp_path / "tiny"
    init_model(ModelParams(preset="tiny", out=str(model)))
    (tmp_path / "voices").mkdir()
    (tmp_path / "voices" / "voices.json").write_bytes(junk)
    voxpipe = str(Path(sys.executable).with_name("voxpipe"))
    args = [voxpipe, "serve", "--model", str(model), "--port", str(free_port()), "--device", "cpu",
            "--voices", str(tmp_path / "voices")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "voices.json: not a voices file" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_a_voice_that_is_not_whole_is_set_aside_with_its_reason(tmp_path, caplog):
    folder = tmp_path / "voices"
    (folder / "clips").mkdir(parents=True)
    sf.write(folder / "clips" / "good.flac", np.zeros(16000, np.float32), 16000)
    (folder / "clips" / "junk.wav").write_bytes(b"RIFF\x00junk")
    sf.write(folder / "clips" / "long.flac", np.zeros(8000 * 40, np.float32), 8000)
    good = {"id": "good", "speaker": "Good", "text": "hi", "file": "clips/good.flac", "seconds": 1.0}
    rows = [good,
            {**good, "id": "no-clip", "file": "clips/missing.wav"},
            {**good, "id": "junk", "file": "clips/junk.wav"},
            {**good, "id": "outside", "file": "../../etc/passwd"},
            {**good, "id": "bad-seconds", "seconds": "long"},
            {**good, "id": "too-long", "file": "clips/long.flac"},
            {**good, "id": "surrogate", "speaker": "\ud800"},
            {"id": "no-speaker", "file": "clips/good.flac"},
            "a string",
            {**good, "speaker": "Again"},  # the id taken
            {**good, "id": "default"}]
    (folder / "voices.json").write_text(json.dumps(rows))
    with caplog.at_level(logging.WARNING, logger="voxpipe.serve"):
        store = VoiceStore(None, folder, 10, 1 << 20)
    assert [v.id for v in store.all()] == ["good"]
    reasons = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(reasons) == len(rows) - 1, reasons
    for why in ("no clip 'clips/missing.wav'", "is not audio", "no clip '../../etc/passwd'", "seconds:",
                "40.0 s long; a reference is at most 30 s", "speaker: a lone UTF-16 surrogate",
                "speaker: missing", "not an object", "'good' is taken", "'default' is taken"):
        assert any(why in r for r in reasons), (why, reasons)
    with pytest.raises(StepError, match=r"voices.json: not a voices file"):
        (folder / "voices.json").write_bytes(b"\x89PNG\r\n")
        VoiceStore(None, folder, 10, 1 << 20)
    assert store.add("Another", clip_b64(1), "a tone", Limits()).id == "another"  # the store still works


# --- the MLflow-served pyfunc's deadline ---

def test_the_pyfunc_deadline_ends_before_mlflows_scoring_timeout(monkeypatch):
    from voxpipe.serve.pyfunc import SCORING_MARGIN_S, TAIL_S_PER_PATCH, VoxpipeTTS

    served = VoxpipeTTS()
    served.deadline_s = 50.0
    assert served.deadline(1).seconds == 50.0  # MLflow's default 60 s leaves room
    monkeypatch.setenv("MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT", "20")
    deadline = served.deadline(3)
    assert deadline.seconds == 20 - SCORING_MARGIN_S
    assert "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT" in deadline.source
    assert deadline.tail_s_per_patch == 3 * TAIL_S_PER_PATCH
    deadline.start -= deadline.seconds - 10 * deadline.tail_s_per_patch  # time left for 10 patches' audio
    for _ in range(10):
        deadline.check()
    with pytest.raises(Exception, match=r"would have run past, decoding and sending its audio, its 15 s"):
        deadline.check()


@pytest.mark.slow  # registers a model and starts `mlflow models serve`
def test_mlflow_serving_gets_voxpipes_503_not_mlflows_504(tmp_path):
    """The issue's case: a 1,950-character request without params (sized to 3,925 patches) to a model that
    never stops, under a 20 s scoring timeout: voxpipe's 503 naming the limit, and the worker is free."""
    import urllib.error
    import urllib.request

    from test_request import invoke, mlflow_served

    model = runaway_checkpoint(tmp_path / "runaway")
    timeout = {"MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": "20", "OMP_NUM_THREADS": "1"}
    with mlflow_served(tmp_path, model, "voxpipe-runaway", timeout) as url:
        text = ("A sentence of some length to say. " * 60)[:1950]
        body = json.dumps({"dataframe_records": [{"text": text}]}).encode()
        request = urllib.request.Request(f"{url}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=120)
        answer = e.value.read().decode()
        assert e.value.code == 503, (e.value.code, answer[:300])  # MLflow's own would be a 504
        assert "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT" in json.loads(answer)["message"], answer
        status, out = invoke(url, [{"text": "hi"}], {"max_len": 4, "inference_timesteps": 1})
        assert status == 200 and len(out["predictions"][0]["audio"]) > 0
