"""Signed manifests (voxpipe/integrity.py): every way a folder can differ from what its writer left."""

from __future__ import annotations

import json
import os
import stat

import pytest

from voxpipe.errors import StepError
from voxpipe.integrity import (
    KEY_ENV,
    KEY_FILE,
    MANIFEST,
    IntegrityError,
    check_file,
    file_entry,
    signing_key,
    verify_manifest,
    write_manifest,
)


@pytest.fixture
def signed(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"x" * 1000)
    (folder / "sub" / "b.json").write_text("{}")
    key = signing_key(tmp_path)
    write_manifest(folder, key, extra={"step": 3})
    return folder, key


def test_roundtrip_and_key_file_mode(signed, tmp_path):
    folder, key = signed
    assert verify_manifest(folder, key)["step"] == 3
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert signing_key(tmp_path) == key  # the same key on the next run


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda f: (f / "a.bin").write_bytes(b"x" * 10), "bad-size"),
        (lambda f: (f / "a.bin").write_bytes(b"y" * 1000), "bad-hash"),
        (lambda f: (f / "sub" / "b.json").unlink(), "missing-file"),
        (lambda f: (f / ".metadata").write_bytes(b"planted"), "unlisted-file"),
        (lambda f: (f / MANIFEST).unlink(), "no-manifest"),
        (lambda f: (f / MANIFEST).write_bytes(b"\xff\xfe not json"), "bad-manifest"),
    ],
)
def test_damage_is_named(signed, damage, reason):
    folder, key = signed
    damage(folder)
    with pytest.raises(IntegrityError) as err:
        verify_manifest(folder, key)
    assert err.value.reason == reason


def test_rehashed_manifest_without_the_key_fails(signed):
    """Whoever can write the folder but lacks the key cannot make a planted file pass."""
    folder, key = signed
    (folder / "a.bin").write_bytes(b"evil")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["a.bin"] = file_entry(folder / "a.bin")
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="signature does not match") as err:
        verify_manifest(folder, key)
    assert err.value.reason == "bad-signature"
    with pytest.raises(IntegrityError):  # and another key is another signature
        verify_manifest(folder, b"k" * 32)


def test_env_key_wins_and_empty_env_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "from-a-kubernetes-secret")
    assert signing_key(tmp_path) == b"from-a-kubernetes-secret"
    assert not (tmp_path / KEY_FILE).exists()
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(StepError, match=KEY_ENV):
        signing_key(tmp_path)


def test_readable_key_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    signing_key(tmp_path)
    os.chmod(tmp_path / KEY_FILE, 0o644)
    with pytest.raises(StepError, match="chmod 600"):
        signing_key(tmp_path)


def test_check_file(tmp_path):
    f = tmp_path / "shard.safetensors"
    f.write_bytes(b"abc" * 100)
    entry = file_entry(f)
    check_file(f, entry)
    f.write_bytes(b"abc" * 99)
    with pytest.raises(IntegrityError, match="300"):
        check_file(f, entry)
