"""Issue 30 (parts 1-3) and issue 34 (part 1): `voxpipe serve` answers the official `openai` client on
127.0.0.1, and every request's work ends with the request.

One real server per module (`voxpipe serve --model @champion`, a registered tiny model whose version carries
the sample's voices, with VOXPIPE_API_KEY set), started once; the client is OpenAI's own. The fast tests at
the end check the deadline and the pyfunc's unknown params without a server.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf
from servers import free_port, serving
from test_request import clip_b64
from test_track import write_eval, write_mfu, write_training

from voxpipe.data.ingest_step import ingest
from voxpipe.params import Params
from voxpipe.steps.ingest import IngestParams
from voxpipe.steps.model import ModelParams
from voxpipe.track.register import register
from voxpipe.train.init_model import init_model

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-test-Zr81-serve"
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"
NAME = "voxpipe-served"
FAST = {"inference_timesteps": 1, "max_len": 6}  # a few patches: the tiny model's audio, quickly
THREE = "The first sentence is here. A second one follows it. And the third ends the text."


@pytest.fixture(scope="module")
def voxpipe_server(tmp_path_factory):
    """`voxpipe serve` on a free port of 127.0.0.1, serving @champion of a registry holding one tiny model
    registered with the sample's ingest (its voices), with an API key; yields (url, root)."""
    root = tmp_path_factory.mktemp("serve")
    ingest(IngestParams(input=[str(ROOT / "data" / "sample")], out=str(root / "ingest"), workers=1,
                        score_quality=False, locale={"spk_f": "en-GB"}))  # spk_m: en-US, the default
    init_model(ModelParams(preset="tiny", out=str(root / "export")))
    files = {"model": str(root / "export"), "ingest": str(root / "ingest"), "out": str(root / "register"),
             "train": str(write_training(root / "train", 1e-4, [2.0, 1.9, 1.8])),
             "eval": str(write_eval(root / "eval", 1.9, 2.0)), "mfu": str(write_mfu(root / "mfu", 0.01))}
    (root / "work").mkdir()
    uri = f"sqlite:///{root / 'work' / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("MLFLOW_")]:
            mp.delenv(k)
        reg = register(Params.model_validate({
            "register": {**files, "model_name": NAME},
            "tracking": {"uri": uri, "work": str(root / "work")}, "launch": {"secret_env": {}}})).registered
    assert "champion" in reg["aliases"], reg
    with voxpipe_serve(root, "--synthesize-deadline-s", "30") as url:
        yield url, root


@contextmanager
def voxpipe_serve(root: Path, *flags: str, log: str = "serve.log") -> Iterator[str]:
    """`voxpipe serve` of the registry under root/work, with the API key; yields its URL once /ready."""
    uri = f"sqlite:///{root / 'work' / 'mlflow.db'}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(Path(sys.executable).with_name("voxpipe")), "serve", "--port", str(port),
            "--voices", str(root / "voices"), "--device", "cpu", "--concurrency", "1", "--queue", "4", *flags,
            "--set", f"register.model_name={NAME}", "--set", f"tracking.uri={uri}",
            "--set", f"tracking.work={root / 'work'}",
            "--set", f"ingest.input=[{SAMPLE}]"]  # its voices.yaml: the consent records cloning checks
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update({"VOXPIPE_API_KEY": KEY, "OMP_NUM_THREADS": "1"})
    with serving(args, f"{url}/health", root / log, env, cwd=root):
        deadline = time.monotonic() + 240
        while get(url, "/ready")[0] != 200:
            assert time.monotonic() < deadline, (root / log).read_text()[-3000:]
            time.sleep(0.3)
        yield url


def get(url: str, path: str, key: str | None = KEY, method: str = "GET", body: bytes | None = None
        ) -> tuple[int, bytes, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{url}{path}", data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def test_the_openai_client_gets_a_wav_at_the_models_rate(voxpipe_server):
    url, root = voxpipe_server
    raw = client(url).audio.speech.with_raw_response.create(model=NAME, voice="default", input="Hello there.",
                                                            response_format="wav", extra_body=FAST)
    audio, rate = sf.read(io.BytesIO(raw.content))
    assert rate == 48000 and audio.size / rate > 0.3 and np.isfinite(audio).all()
    assert raw.headers["x-sample-rate"] == "48000"
    assert raw.headers["x-voxpipe-model-version"] == f"models:/{NAME}/1"
    assert raw.headers["x-voxpipe-adapter"] == "none" and raw.headers["x-voxpipe-voice"] == "default"
    flac = client(url).audio.speech.create(model=NAME, voice="default", input="Hello there.",
                                           response_format="flac", extra_body=FAST)
    assert sf.read(io.BytesIO(flac.read()))[1] == 48000
    assert "ready: models:/voxpipe-served/1" in (root / "serve.log").read_text()


def test_pcm_streams_sentence_by_sentence_the_same_audio(voxpipe_server):
    url, _ = voxpipe_server
    arrivals, chunks = [], []
    start = time.perf_counter()
    with client(url).audio.speech.with_streaming_response.create(
            model=NAME, voice="default", input=THREE, response_format="pcm", extra_body=FAST) as response:
        assert response.headers["x-sample-rate"] == "48000"
        for chunk in response.iter_bytes():
            arrivals.append(time.perf_counter() - start)
            chunks.append(chunk)
    end = time.perf_counter() - start
    assert len(chunks) >= 2 and arrivals[0] < end, arrivals
    whole = client(url).audio.speech.create(model=NAME, voice="default", input=THREE, response_format="wav",
                                            extra_body=FAST).read()
    pcm = np.frombuffer(b"".join(chunks), "<i2")
    assert np.array_equal(pcm, sf.read(io.BytesIO(whole), dtype="int16")[0])  # same seed, same audio


def test_voices_are_the_training_speakers_and_added_ones(voxpipe_server):
    url, root = voxpipe_server
    status, body, _ = get(url, "/v1/audio/voices")
    voices = json.loads(body)["voices"]
    trained = [v for v in voices[1:] if v["origin"] == "model"]  # the sample's speakers
    assert status == 200 and voices[0]["id"] == "default" and len(trained) >= 1, voices
    assert all(v["text"] and v["seconds"] > 0 for v in trained)
    # each voice's consent scope, from the sample's voices.yaml
    assert all(v["consent"]["id"].startswith("sample-spk_") and v["consent"]["scope"] ==
               ["tts", "voice_clone"] for v in trained), trained
    one = trained[0]["id"]
    speech = client(url).audio.speech.create(model=NAME, voice=one, input="In that voice.", extra_body=FAST)
    assert sf.read(io.BytesIO(speech.read()))[1] == 48000
    added = {"name": "My Voice", "audio": clip_b64(2.0), "text": "a sine tone for two seconds"}
    status, body, _ = get(url, "/v1/audio/voices", method="POST", body=json.dumps(added).encode())
    error = json.loads(body)["error"]  # an uploaded voice needs a consent record too
    assert status == 400 and error["param"] == "consent_attestation", error
    added["consent_attestation"] = "sample-spk_f"
    status, body, _ = get(url, "/v1/audio/voices", method="POST", body=json.dumps(added).encode())
    assert status == 201 and json.loads(body)["id"] == "my-voice", body
    assert json.loads(body)["consent"] == {"id": "sample-spk_f", "scope": ["tts", "voice_clone"]}
    assert (root / "voices" / "voices.json").is_file()  # persisted in the named folder
    status, body, _ = get(url, "/v1/audio/voices", method="POST", body=json.dumps(added).encode())
    assert status == 400 and "exists" in json.loads(body)["error"]["message"]
    assert client(url).audio.speech.create(model=NAME, voice="my-voice", input="Mine now.", extra_body=FAST)
    assert get(url, "/v1/audio/voices/my-voice", method="DELETE")[0] == 200
    assert get(url, "/v1/audio/voices/my-voice", method="DELETE")[0] == 404
    assert get(url, f"/v1/audio/voices/{one}", method="DELETE")[0] == 400  # the version's own stay


def test_voice_by_id_and_cloning_by_consent(voxpipe_server):
    """`voice` as OpenAI's {"id": ...}; reference_audio is cloned only with a consent_attestation naming a
    record with scope voice_clone (serve.cloning: attested, the default), else a 400 naming the field."""
    url, _ = voxpipe_server
    one = json.loads(get(url, "/v1/audio/voices")[1])["voices"][1]["id"]
    by_id = client(url).audio.speech.create(model=NAME, voice={"id": one}, input="By id.", extra_body=FAST)
    by_name = client(url).audio.speech.create(model=NAME, voice=one, input="By id.", extra_body=FAST)
    assert by_id.read() == by_name.read()
    clip = {"reference_audio": clip_b64(1.0), **FAST}
    for attestation, message in ((None, r"^consent_attestation: reference_audio clones a person's voice"),
                                 ("nobody", r"'nobody': no consent record of that id")):
        extra = {**clip, **({"consent_attestation": attestation} if attestation else {})}
        with pytest.raises(openai.BadRequestError) as e:
            client(url).audio.speech.create(model=NAME, voice="default", input="Hi.", extra_body=extra)
        assert e.value.body["param"] == "consent_attestation" and re.search(message, e.value.body["message"])
    cloned = client(url).audio.speech.create(model=NAME, voice="default", input="Hi.",
                                             extra_body={**clip, "consent_attestation": "sample-spk_m"})
    assert sf.read(io.BytesIO(cloned.read()))[1] == 48000


BAD = {  # what: (create() kwargs, the param named, the message)
    "empty input": ({"input": ""}, "input", r"input: empty"),
    "10,000 characters": ({"input": "a" * 10_000}, "input", r"10000 characters; at most 2000"),
    "unknown voice": ({"voice": "nobody"}, "voice", r"voice 'nobody': no such voice"),
    "unknown response_format": ({"response_format": "aiff"}, "response_format", r"not offered"),
    "speed": ({"speed": 2.0}, "speed", r"only 1.0"),
    "cfg 0": ({"extra_body": {"cfg_value": 0}}, "cfg_value", r"greater than 0"),
    "unknown field": ({"extra_body": {"temperature": 0.5}}, "temperature", r"Extra inputs"),
    "number as reference": ({"extra_body": {"reference_audio": 12345}}, "reference_audio", r"not a string"),
    "reference_text alone": ({"extra_body": {"reference_text": "hi"}}, "reference_text",
                             r"without a reference"),
    "unknown locale": ({"extra_body": {"locale": "fr-FR"}}, "locale",
                       r"^params.locale='fr-FR': unknown; one of en-US, en-GB, zh-CN"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_requests_get_a_400_in_openais_shape(voxpipe_server, what):
    url, _ = voxpipe_server
    given, param, message = BAD[what]
    kwargs = {"model": NAME, "voice": "default", "input": "Hello.", **given}
    with pytest.raises(openai.BadRequestError) as e:
        client(url).audio.speech.create(**kwargs)
    error = e.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert re.search(message, error["message"]) and "\n" not in error["message"], error
    assert "Traceback" not in e.value.response.text


def test_each_voice_reads_its_text_in_its_own_locale_and_a_request_may_name_another(voxpipe_server):
    """ingest.locale made spk_f en-GB and spk_m en-US; register recorded both voices' locales and the model's
    (its version's tag, registered.json); the answer names the locale the input was read in."""
    url, root = voxpipe_server

    def read_in(voice: str, **extra: str) -> str:
        raw = client(url).audio.speech.with_raw_response.create(
            model=NAME, voice=voice, input="Due 12/05/2026.", extra_body={**FAST, **extra})
        return raw.headers["x-voxpipe-locale"]

    assert read_in("spk_f") == "en-GB" and read_in("spk_m") == "en-US"
    listed = {v["id"]: v["locale"] for v in json.loads(get(url, "/v1/audio/voices")[1])["voices"]}
    assert listed["spk_f"] == "en-GB" and listed["spk_m"] == "en-US"
    assert read_in("spk_m", locale="en-GB") == "en-GB" and read_in("spk_f", locale="zh-CN") == "zh-CN"
    registered = json.loads((root / "register" / "registered.json").read_text())
    assert registered["locale"] in ("en-GB", "en-US") and read_in("default") == registered["locale"]
    assert f"text read in {registered['locale']}" in (root / "serve.log").read_text()


def test_the_registered_pyfunc_reads_in_its_recorded_locale_and_takes_a_locale_param(voxpipe_server):
    """MLflow's own loader and params check: the version's model_config holds the locale, the signature a
    `locale` param; an unknown one is a 400 naming it."""
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException
    from mlflow.models.utils import _enforce_params_schema

    _, root = voxpipe_server
    registered = json.loads((root / "register" / "registered.json").read_text())
    mlflow.set_tracking_uri(f"sqlite:///{root / 'work' / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(f"models:/{NAME}/1")
    assert model.model_config["locale"] == registered["locale"]
    version = mlflow.MlflowClient().get_model_version(NAME, "1")
    assert version.tags["voxpipe.locale"] == registered["locale"]
    frame = pd.DataFrame({"text": ["Due 12/05/2026."]})

    def said(**params) -> str:
        return model.predict(frame, params={**FAST, **params})["spoken_text"][0]

    gb, us = "Due the twelfth of May twenty twenty six.", "Due December fifth twenty twenty six."
    assert said() == (gb if registered["locale"] == "en-GB" else us)
    assert said(locale="en-GB") == gb and said(locale="en-US") == us
    checked = _enforce_params_schema({"locale": "en-AU"}, model.metadata.signature.params)
    with pytest.raises(MlflowException) as e:
        model.unwrap_python_model().predict(None, frame, params=checked)
    assert e.value.get_http_status_code() == 400
    assert e.value.message.startswith("params.locale='en-AU': unknown")


def test_a_wrong_key_gets_401_on_every_route_but_health(voxpipe_server):
    url, _ = voxpipe_server
    with pytest.raises(openai.AuthenticationError):
        client(url, key="sk-wrong").audio.speech.create(model=NAME, voice="default", input="Hi.")
    for path in ("/v1/models", "/v1/audio/voices", "/ready", "/metrics"):
        status, body, _ = get(url, path, key=None)
        assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error", path
    assert get(url, "/health", key=None)[0] == 200
    assert client(url).models.list().data[0].id == f"models:/{NAME}/1"


def test_four_concurrent_requests_all_answer(voxpipe_server):
    url, _ = voxpipe_server

    def one(i: int) -> int:
        audio = client(url).audio.speech.create(model=NAME, voice="default", input=f"Request number {i}.",
                                                response_format="wav", extra_body=FAST).read()
        return sf.read(io.BytesIO(audio))[1]

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, range(4))) == [48000] * 4


def rss_mb(url: str) -> float:
    page = get(url, "/metrics")[1].decode()
    return float(re.search(r"^process_resident_memory_bytes (\S+)$", page, re.M).group(1)) / 2**20


def test_memory_stays_flat_over_100_bad_requests(voxpipe_server):
    """Issue 34: every bad kind, 100 requests in all (bounded in time), then RSS within 64 MB of where it
    was, and a good request still answers."""
    url, _ = voxpipe_server
    big = b'{"input": "' + b"a" * (300 << 20 >> 4) + b'"}'  # 19 MB of JSON
    kinds = [
        json.dumps({"input": "", "voice": "default"}).encode(),
        json.dumps({"input": "a" * 10_000}).encode(),
        json.dumps({"input": "hi", "cfg_value": 1e9}).encode(),
        json.dumps({"input": "hi", "max_lenn": 4}).encode(),
        json.dumps({"input": "hi", "voice": "nobody"}).encode(),
        json.dumps({"input": "hi", "reference_audio": "AAAA"}).encode(),
        json.dumps({"input": "hi", "reference_audio": clip_b64(40)}).encode(),  # over the 30 s limit
        b"{not json",
        big,
        json.dumps(["a list"]).encode(),
    ]
    for body in kinds:  # warm up every path once
        status = get(url, "/v1/audio/speech", method="POST", body=body)[0]
        assert 400 <= status < 500, (status, body[:80])
    before = rss_mb(url)
    start = time.monotonic()
    for i in range(100):
        status, answer, _ = get(url, "/v1/audio/speech", method="POST", body=kinds[i % len(kinds)])
        assert 400 <= status < 500 and b"Traceback" not in answer, (status, answer[:200])
    assert time.monotonic() - start < 240
    assert get(url, "/v1/audio/speech", method="POST", body=big)[0] == 413
    after = rss_mb(url)
    assert after - before < 64, (before, after)
    assert client(url).audio.speech.create(model=NAME, voice="default", input="Still here.", extra_body=FAST)


def test_a_request_past_its_deadline_is_stopped_with_a_503_and_memory_stays_flat(voxpipe_server):
    """The same registry served with a deadline shorter than any generation: each request is stopped at its
    first patch with a 503 naming the limit, the slot is given back (the next ones are not refused as busy),
    and 30 of them leave RSS where it was."""
    _, root = voxpipe_server
    with voxpipe_serve(root, "--synthesize-deadline-s", "0.001", log="deadline.log") as url:
        body = json.dumps({"input": "A text that will not be finished.", **FAST}).encode()
        for _ in range(3):
            status, answer, _ = get(url, "/v1/audio/speech", method="POST", body=body)
            error = json.loads(answer)["error"]
            assert status == 503 and "0.001 s deadline (synthesize.deadline_s)" in error["message"], answer
        before = rss_mb(url)
        for _ in range(30):
            assert get(url, "/v1/audio/speech", method="POST", body=body)[0] == 503
        assert rss_mb(url) - before < 64
        page = get(url, "/metrics")[1].decode()
        assert re.search(r'voxpipe_requests_total\{route="/v1/audio/speech",status="503"\} 33.0', page), page
        assert "voxpipe_speech_in_flight 0.0" in page and "voxpipe_real_time_factor" in page
        assert f'voxpipe_served_model{{adapter="none",version="models:/{NAME}/1"}} 1.0' in page, page


# --- without a server: the deadline, the pyfunc's unknown params and its defaults (issue 34) ---

def test_generation_stops_at_the_deadline_and_the_pyfunc_answers_503(tiny_model):
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from voxpipe.serve.deadline import Deadline, RequestStopped
    from voxpipe.serve.pyfunc import VoxpipeTTS
    from voxpipe.serve.request import Limits

    steps = []

    def check() -> None:
        steps.append(1)
        Deadline(0.0).check()

    with pytest.raises(RequestStopped, match=r"0 s deadline \(synthesize.deadline_s\)"):
        tiny_model.generate(["a long text " * 20], max_len=4096, inference_timesteps=100, check=check)
    assert len(steps) == 1  # stopped before the first patch, not after 4096
    served = VoxpipeTTS()
    served.model, served.limits, served.deadline_s = tiny_model, Limits(), 1e-6
    with pytest.raises(MlflowException) as e:
        served.predict(None, pd.DataFrame({"text": ["Hello there."]}), params={"max_len": 8})
    assert e.value.get_http_status_code() == 503 and "deadline" in e.value.message


def test_the_pyfunc_refuses_a_param_mlflow_dropped_and_sizes_what_was_left_out(tiny_model):
    """MLflow's own params check (what its scoring server runs before predict) drops an unknown param with
    a warning; predict turns that into a 400. Left-out params take the signature's defaults: max_len None,
    sized for the text."""
    import pandas as pd
    from mlflow.exceptions import MlflowException
    from mlflow.models.utils import _enforce_params_schema

    from voxpipe.serve.pyfunc import VoxpipeTTS
    from voxpipe.serve.request import Limits, parse_request, sized_max_len
    from voxpipe.track.registry import signature

    served = VoxpipeTTS()
    served.model, served.limits = tiny_model, Limits()
    params = _enforce_params_schema({"max_lenn": 4}, signature().params)
    assert "max_lenn" not in params and params["max_len"] is None
    with pytest.raises(MlflowException) as e:
        served.predict(None, pd.DataFrame({"text": ["hi"]}), params=params)
    assert e.value.get_http_status_code() == 400 and "params ['max_lenn']: unknown" in e.value.message
    out = served.predict(None, pd.DataFrame({"text": ["hi"]}),
                         params=_enforce_params_schema({"inference_timesteps": 1}, signature().params))
    assert len(out["audio"][0]) > 0  # the next request is not refused for the last one's param
    sized = parse_request(["hi"], [None], {}, Limits()).generation["max_len"]
    assert sized == sized_max_len(["hi"], None) == 29
    assert sized_max_len(["a" * 2000], None) == 4025 and sized_max_len(["hi"], 7) == 7


def test_reference_text_continues_the_clip(tiny_model):
    """With the clip's transcript the speech continues the clip (upstream's prompt-text mode): the text
    (transcript first) then the clip's patches as the audio so far; without it the clip is a voice
    reference before the text."""
    wav = 0.1 * np.sin(np.arange(16000) * 2 * np.pi * 220 / 16000).astype(np.float32)
    ids = [5, 6, 7]
    continued, alone = tiny_model._prompt(ids, wav, continued=True), tiny_model._prompt(ids, wav)
    r = int(alone.audio_mask.sum())
    assert r > 0 and continued.tokens.numel() == len(ids) + 1 + r
    assert continued.audio_mask[-r:].all() and not continued.audio_mask[:-r].any()
    assert continued.text_mask[:-r].all() and not alone.audio_mask[-len(ids) - 1:].any()
    out = tiny_model.generate(["Hello."], [wav], max_len=6, inference_timesteps=1, seed=0,
                              reference_text="a tone")
    assert out.audio[0].numel() > 0


def test_a_wrong_model_or_a_taken_port_is_one_paragraph_before_anything_listens(tmp_path, capsys):
    import socket

    from voxpipe.cli import main

    work = ["--set", f"tracking.work={tmp_path / 'work'}"]  # a registry --model: check_registered's errors
    assert main(["serve", "--model", str(tmp_path / "nothing"), "--port", str(free_port()), *work]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("voxpipe serve: error: serve.model") and "no config.json" in err and "\n" not in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", "--port", str(taken.getsockname()[1]), *work]) == 1
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err


def test_sentences_keep_every_word_in_order():
    from voxpipe.serve.formats import sentences

    assert sentences(THREE) == ["The first sentence is here.", "A second one follows it.",
                                "And the third ends the text."]
    assert sentences("Hi. Yes. A longer sentence here.") == ["Hi. Yes. A longer sentence here."]
    assert " ".join(sentences("One two three. Four")) == "One two three. Four"
    chinese = "你好世界。今天天气很好，我们出去走走吧。"
    assert sentences(chinese) == [chinese]
