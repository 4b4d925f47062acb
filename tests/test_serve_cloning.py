"""serve.cloning's three modes on the request parser serve uses (openai_speech.parse_body): which reference
clip may be cloned, and the 400 that names the field otherwise. The real server's answers (the openai client,
the default `attested`, uploaded voices) are tests/test_serve.py's test_voice_by_id_and_cloning_by_consent."""

from __future__ import annotations

import pytest
import yaml
from test_request import clip_b64

from voxpipe.serve.cloning import Cloning
from voxpipe.serve.openai_speech import ApiError, parse_body
from voxpipe.serve.request import Limits
from voxpipe.serve.voices import VoiceStore

RECORD = {"id": "anna-1", "speaker": "anna", "subject": "Anna", "kind": "synthetic",
          "scope": ["tts", "voice_clone"], "granted": "2026-01-01", "licence": "CC0-1.0"}


def cloning(tmp_path, mode: str = "attested", **change) -> Cloning:
    (tmp_path / "voices.yaml").write_text(yaml.safe_dump({"voices": [{**RECORD, **change}]}))
    return Cloning.read(mode, [str(tmp_path)])


def parse(tmp_path, policy: Cloning, **body):
    voices = VoiceStore(None, tmp_path / "added", 4, 1 << 20)
    return parse_body({"input": "Hi.", "reference_audio": clip_b64(1.0), **body}, voices, Limits(),
                      cloning=policy)


def refused(tmp_path, policy: Cloning, **body) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(tmp_path, policy, **body)
    assert e.value.status == 400 and "\n" not in e.value.message
    return e.value


def test_attested_clones_with_a_record_of_scope_voice_clone(tmp_path):
    assert parse(tmp_path, cloning(tmp_path), consent_attestation="anna-1").voice == "reference"
    assert refused(tmp_path, cloning(tmp_path)).param == "consent_attestation"


@pytest.mark.parametrize("change, why", [
    ({"scope": ["tts"]}, "does not include voice_clone"),
    ({"revoked": True, "revoked_reason": "withdrawn"}, "was revoked (withdrawn)"),
    ({"expires": "2020-01-01"}, "expired on 2020-01-01"),
])
def test_attested_refuses_a_record_that_does_not_allow_cloning(tmp_path, change, why):
    error = refused(tmp_path, cloning(tmp_path, **change), consent_attestation="anna-1")
    assert error.param == "consent_attestation" and why in error.message


def test_off_refuses_every_clip_and_open_takes_any(tmp_path):
    error = refused(tmp_path, cloning(tmp_path, "off"), consent_attestation="anna-1")
    assert error.param == "reference_audio" and "serve.cloning" in error.message
    assert parse(tmp_path, cloning(tmp_path, "open")).voice == "reference"


def test_a_malformed_clip_is_named_before_its_consent(tmp_path):
    """A broken clip is the client's first problem to fix, whatever the attestation."""
    assert refused(tmp_path, cloning(tmp_path), reference_audio="AAAA").param == "reference_audio"
