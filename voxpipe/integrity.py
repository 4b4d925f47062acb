"""Signed file manifests: prove a folder holds exactly the bytes its writer left there.

Why: a checkpoint is read back by code that unpickles (torch DCP's `.metadata`), and a shard
index is trusted by the next step. A manifest lists every file's size and sha256 and is written
last and atomically, so it doubles as the "complete" marker. An HMAC over the manifest, keyed
by a secret the workspace volume does not hold (env `VOXPIPE_CHECKPOINT_KEY`, from a Kubernetes
Secret on a cluster), stops whoever can write to the volume from planting files and re-hashing
them. Local runs without the env var use the user's own key file, outside every output folder
(`$XDG_STATE_HOME/voxpipe/checkpoint.key`, else `~/.local/state/voxpipe/`, mode 0600 in a 0700
folder): write access to the checkpoints is then not enough to forge a signature. The key file and its
folder must be the user's own and writable by nobody else (group or world), else another user could
have swapped the key and signed what they planted. A key file inside
a checkpoints folder (`.voxpipe-key`, what older voxpipe wrote) is never used: whoever could write
the folder could have replaced it; the run stops with the way out.

Verify before use: call `verify_manifest` before anything in the folder is opened or unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from voxpipe.errors import StepError
from voxpipe.files import atomic_write_text, file_digest

MANIFEST = "voxpipe-manifest.json"
KEY_ENV = "VOXPIPE_CHECKPOINT_KEY"
KEY_FILE = ".voxpipe-key"  # the old in-folder key: refused, see signing_key
USER_KEY = "checkpoint.key"
_VERSION = 1


class IntegrityError(StepError):
    """A folder failed verification. `reason` is a short slug fit for a file name (bad-hash, ...)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def user_key_path() -> Path:
    """The local signing key: the user's state folder, never an output folder."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "voxpipe" / USER_KEY


def signing_key(key_dir: Path) -> bytes:
    """The HMAC key: env VOXPIPE_CHECKPOINT_KEY, else the user's key file (created 0600 if absent).

    `key_dir` is the checkpoints folder: a key file left inside it by an older voxpipe stops the run."""
    env = os.environ.get(KEY_ENV)
    if env is not None:
        if not env:
            raise StepError(f"{KEY_ENV} is set but empty; set it to the secret key (or unset it locally)")
        return env.encode()
    path = user_key_path()
    legacy = Path(key_dir) / KEY_FILE
    if legacy.exists():
        raise StepError(
            f"{legacy}: a checkpoint signing key inside the checkpoints folder is no longer used, since "
            "anyone who can write the folder could have replaced it and signed a planted checkpoint. The "
            f"local key now lives in {path}. If you made this folder and nobody else writes to it, move the "
            f"key there (`mkdir -p -m 700 {path.parent} && mv {legacy} {path}`; only if {path} does not "
            f"exist yet); otherwise delete it and train with --no-resume, or set {KEY_ENV}")
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _create_key_file(path)
    _check_owner(path.parent, "folder of the checkpoint signing key", 0o022, f"chmod go-w {path.parent}")
    _check_owner(path, "checkpoint signing key", 0o077, f"chmod 600 {path}")
    mode = path.stat().st_mode
    if mode & 0o077:
        raise StepError(
            f"{path}: the checkpoint signing key is readable by others (mode {stat.filemode(mode)}); "
            f"run `chmod 600 {path}` or set {KEY_ENV}"
        )
    key = path.read_bytes()
    if len(key) < 16:
        raise StepError(f"{path}: the signing key is empty or too short; delete the file to make a new one")
    return key


def _check_owner(path: Path, what: str, forbidden: int, fix: str) -> None:
    """Refuse `path` unless the current user owns it and it has none of the `forbidden` mode bits."""
    st = path.stat()
    if st.st_uid != os.getuid():
        raise StepError(
            f"{path}: the {what} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}), so its owner "
            f"could have replaced the key and signed files they planted. Delete it (or `chown` it back to "
            f"yourself if you know it is yours) and rerun, or set {KEY_ENV}")
    if st.st_mode & forbidden:
        raise StepError(
            f"{path}: the {what} is writable or readable by others (mode {stat.filemode(st.st_mode)}), so "
            f"another user could have replaced the key; run `{fix}` (and delete the key if you do not "
            f"trust it) or set {KEY_ENV}")


def _create_key_file(path: Path) -> None:
    """Write to a private temp file, then link it into place: concurrent creators agree on one key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process won the race; use its key
    finally:
        tmp.unlink(missing_ok=True)


def file_entry(path: Path) -> dict[str, Any]:
    """{"size", "sha256"} of one file."""
    return {"size": Path(path).stat().st_size, "sha256": file_digest(path)}


def hash_files(folder: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """file_entry for each name under folder, hashed in parallel (hashlib releases the GIL)."""
    names = sorted(names)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
        entries = list(pool.map(lambda n: file_entry(Path(folder) / n), names))
    return dict(zip(names, entries, strict=True))


def _check_size(path: Path, entry: dict[str, Any]) -> None:
    if not path.is_file():
        raise IntegrityError("missing-file", f"{path}: listed in the manifest but missing")
    size = path.stat().st_size
    if size != entry["size"]:
        raise IntegrityError(
            "bad-size", f"{path}: {size} bytes, the manifest says {entry['size']} (truncated or overwritten)"
        )


def _bad_hash(path: Path) -> IntegrityError:
    return IntegrityError("bad-hash", f"{path}: sha256 differs from the manifest (the bytes changed)")


def check_file(path: Path, entry: dict[str, Any]) -> None:
    """Raise IntegrityError unless `path` has the size and sha256 in `entry` (size first: it is free)."""
    path = Path(path)
    _check_size(path, entry)
    if file_entry(path)["sha256"] != entry["sha256"]:
        raise _bad_hash(path)


def listed_files(folder: Path) -> list[str]:
    """Every regular file under folder (relative, POSIX), except the manifest and the key file."""
    folder = Path(folder)
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(KEY_FILE)
    )


def signature(key: bytes, payload: dict[str, Any]) -> str:
    """The HMAC-SHA256 of `payload`'s canonical JSON: what manifests and run identities carry."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def signature_matches(key: bytes, payload: dict[str, Any], claimed: object) -> bool:
    return isinstance(claimed, str) and hmac.compare_digest(claimed, signature(key, payload))


def write_manifest(
    folder: Path,
    key: bytes,
    files: dict[str, dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Sign and atomically write `folder/voxpipe-manifest.json`. Call it last, after every file is closed.

    `files` (name -> file_entry) lets callers hash in parallel elsewhere; by default every file
    under folder is hashed now. `extra` is signed along with the files (e.g. a step number).
    """
    folder = Path(folder)
    if files is None:
        files = hash_files(folder, listed_files(folder))
    payload = {"version": _VERSION, "files": files, **(extra or {})}
    manifest = {**payload, "hmac": signature(key, payload)}
    path = folder / MANIFEST
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path
def read_manifest(folder: Path, key: bytes) -> dict[str, Any]:
    """The manifest's payload once its signature checks; nothing else in the folder is opened."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise IntegrityError("no-manifest", f"{folder}: no {MANIFEST} (incomplete or not written by voxpipe)")
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
        claimed = manifest.pop("hmac")
        files = manifest["files"]
        entries_ok = all(
            isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get("sha256"), str)
            for e in files.values()
        )
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise IntegrityError("bad-manifest", f"{path}: unreadable manifest ({e})") from e
    if not signature_matches(key, manifest, claimed):
        raise IntegrityError(
            "bad-signature",
            f"{path}: the signature does not match: the manifest was changed, or it was signed with "
            f"another key ({KEY_ENV} or {user_key_path()})",
        )
    if not entries_ok:
        raise IntegrityError("bad-manifest", f"{path}: malformed file entries")
    return manifest
def verify_manifest(folder: Path, key: bytes, exact: bool = True) -> dict[str, Any]:
    """Check the signature, then every listed file's size, then every hash; return the payload.

    With `exact`, a file the manifest does not list (a planted `.metadata` next to a real one
    is caught by its hash; a planted extra file by this) also fails.
    """
    folder = Path(folder)
    manifest = read_manifest(folder, key)
    check_files(folder, manifest["files"], exact, where=folder / MANIFEST)
    return manifest
def check_files(folder: Path, files: dict[str, dict[str, Any]], exact: bool = True, *,
                where: Path, ignore: Iterable[str] = ()) -> None:
    """Every listed file's size, then its hash; with `exact`, no unlisted file (but those in `ignore`)."""
    for name in files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise IntegrityError("bad-manifest", f"{where}: entry {name!r} leaves the folder")
    if exact:
        unlisted = sorted(set(listed_files(folder)) - set(files) - set(ignore))
        if unlisted:
            raise IntegrityError("unlisted-file", f"{folder}: not in the manifest: {', '.join(unlisted)}")
    for name, entry in files.items():  # sizes first: a truncated file fails without hashing anything
        _check_size(folder / name, entry)
    actual = hash_files(folder, files)
    for name, entry in files.items():
        if actual[name]["sha256"] != entry["sha256"]:
            raise _bad_hash(folder / name)
