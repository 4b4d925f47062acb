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
    user_key_path,
    verify_manifest,
    write_manifest,
)


@pytest.fixture(autouse=True)
def own_state(tmp_path, monkeypatch):
    """Each test its own user state folder: the local key file is changed here."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


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
    assert stat.S_IMODE(user_key_path().stat().st_mode) == 0o600
    assert user_key_path() == tmp_path / "state" / "voxpipe" / "checkpoint.key"  # not in the output folder
    assert not (tmp_path / KEY_FILE).exists()
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
    assert not user_key_path().exists()
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(StepError, match=KEY_ENV):
        signing_key(tmp_path)


def test_readable_key_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    signing_key(tmp_path)
    os.chmod(user_key_path(), 0o644)
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


def test_a_key_file_inside_the_checkpoints_folder_is_refused_with_the_way_out(tmp_path, monkeypatch):
    """Write access to the checkpoints must not be enough to forge: an in-folder key (what an older voxpipe
    wrote, or what an attacker planted with a re-signed checkpoint) is never used."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / KEY_FILE).write_text("k" * 64)
    with pytest.raises(StepError) as err:
        signing_key(checkpoints)
    message = str(err.value)
    assert "\n" not in message and str(checkpoints / KEY_FILE) in message
    assert f"mv {checkpoints / KEY_FILE} {user_key_path()}" in message and "--no-resume" in message
    assert not user_key_path().exists()  # nothing adopted
    monkeypatch.setenv(KEY_ENV, "from-a-secret-0123")  # a cluster's key: the stray file does not matter
    assert signing_key(checkpoints) == b"from-a-secret-0123"


def test_a_key_file_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    """Issue 34: the mode alone was checked, so a key another uid planted (0600, theirs) was used."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    signing_key(tmp_path)
    me = os.getuid()
    real_stat = type(user_key_path()).stat

    def stat_as_other(path, *args, **kwargs):
        found = real_stat(path, *args, **kwargs)
        if path == user_key_path():
            fields = list(found[:10])
            fields[stat.ST_UID] = me + 1
            return os.stat_result(fields)
        return found

    monkeypatch.setattr(type(user_key_path()), "stat", stat_as_other)
    with pytest.raises(StepError) as err:
        signing_key(tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(user_key_path()) in message
    assert f"belongs to uid {me + 1}, not to you (uid {me})" in message and KEY_ENV in message


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_key_folder_others_can_write_is_refused(tmp_path, monkeypatch, mode):
    monkeypatch.delenv(KEY_ENV, raising=False)
    key = signing_key(tmp_path)
    folder = user_key_path().parent
    os.chmod(folder, mode)
    with pytest.raises(StepError) as err:
        signing_key(tmp_path)
    message = str(err.value)
    assert "\n" not in message and f"{folder}: the folder of the checkpoint signing key" in message
    assert f"chmod go-w {folder}" in message
    os.chmod(folder, 0o755)  # readable by others is fine: the key file itself is 0600
    assert signing_key(tmp_path) == key
