"""The voices `voxpipe serve` speaks in: the registered version's (one clip and transcript per speaker of
its training data, track/voices.py) and those clients add with POST /v1/audio/voices, kept in a named
folder (`serve.voices`) across restarts and bounded in count and bytes. `default` is no reference: the voice
the model learned. An added clip is checked by the request schema's reference rules and kept as 16 kHz FLAC,
what the model is given anyway."""

from __future__ import annotations

import base64
import io
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from voxpipe.data.text_rules import LOCALES
from voxpipe.errors import StepError, quoted
from voxpipe.files import atomic_write, atomic_write_text
from voxpipe.serve.request import (
    Limits,
    RequestError,
    check_text,
    check_unicode,
    reference_waveform,
)
from voxpipe.track.voices import CLIPS, DEFAULT_VOICE, VOICES_FILE, voice_id
from voxpipe.voxcpm2_format import SAMPLE_RATE

log = logging.getLogger("voxpipe.serve")
SHAPE = "list of {id, speaker, text, file, seconds}"
WAY_OUT = "Repair it, or move it away to start without these voices"


@dataclass(frozen=True)
class Voice:
    id: str
    speaker: str
    text: str  # the clip's transcript
    file: str  # relative to its folder
    seconds: float
    origin: str = "model"  # "model": the training data's; "added": a client's
    locale: str | None = None  # how the speaker's training text was read (track/voices.py); None: the model's
    consent: dict[str, Any] | None = None  # {id, scope} of the voice's consent record; None: none known

    def clip_base64(self, folder: Path) -> str:
        return base64.b64encode((folder / self.file).read_bytes()).decode()


def _read(folder: Path | None, origin: str, max_seconds: float) -> dict[str, Voice]:
    """The folder's voices. A file that is not a JSON list of voices is one paragraph (the server does not
    start); a voice that is not whole (a field missing or of the wrong type, its clip missing or not audio,
    an id taken) is set aside with its reason in the log, and the others are served."""
    if folder is None or not (folder / VOICES_FILE).is_file():
        return {}
    path = folder / VOICES_FILE
    try:
        rows = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:  # a UnicodeDecodeError is a ValueError
        raise StepError(f"{path}: not a voices file ({type(e).__name__}: {str(e)[:80]}); it holds a JSON "
                        f"{SHAPE}. {WAY_OUT}") from None
    if not isinstance(rows, list):
        raise StepError(f"{path}: not a voices file (a JSON {type(rows).__name__}, not a list); it holds "
                        f"a JSON {SHAPE}. {WAY_OUT}")
    voices: dict[str, Voice] = {}
    for i, row in enumerate(rows):
        try:
            voice = _voice(row, folder, origin, max_seconds)
            if voice.id in voices or voice.id == DEFAULT_VOICE:
                raise ValueError(f"the id {voice.id!r} is taken")
        except ValueError as e:
            log.warning("voxpipe serve: %s: voice %d set aside: %s", path, i, str(e)[:200])
            continue
        voices[voice.id] = voice
    return voices


def _voice(row: Any, folder: Path, origin: str, max_seconds: float) -> Voice:
    """One row of voices.json, checked: the fields' types (valid Unicode), and a clip inside the folder
    that is audio no longer than a reference may be."""
    if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, not an object")
    for key in ("id", "speaker", "file"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise ValueError(f"{key}: missing, empty or not a string")
    if not isinstance(row.get("text"), str):
        raise ValueError("text: missing or not a string")
    for key in ("id", "speaker", "text", "file"):
        try:
            check_unicode(row[key], key)
        except RequestError as e:
            raise ValueError(str(e)) from None
    seconds = row.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < 3600:
        raise ValueError(f"seconds: {str(seconds)[:40]} is not a clip's length")
    clip = (folder / row["file"]).resolve()
    if not clip.is_relative_to(folder.resolve()) or not clip.is_file():
        raise ValueError(f"file: no clip {row['file'][:80]!r} in {folder}")
    try:
        info = sf.info(clip)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise ValueError(f"file: {row['file'][:80]!r} is not audio ({str(e)[:80]})") from None
    if info.duration > max_seconds:
        raise ValueError(f"file: {row['file'][:80]!r} is {info.duration:.1f} s long; a reference is at most "
                         f"{max_seconds:g} s (synthesize.max_reference_seconds)")
    locale = row.get("locale")
    if locale is not None and locale not in LOCALES:
        raise ValueError(f"locale: {str(locale)[:40]!r} is not one of {', '.join(LOCALES)}")
    consent = row.get("consent")
    if consent is not None and not (isinstance(consent, dict) and isinstance(consent.get("id"), str)
                                    and isinstance(consent.get("scope"), list)):
        raise ValueError("consent: not a consent record's {id, scope}")
    return Voice(row["id"], row["speaker"], row["text"], row["file"], float(seconds), origin, locale, consent)


class VoiceStore:
    def __init__(self, trained: Path | None, added: Path, max_count: int, max_bytes: int,
                 max_seconds: float = Limits.max_reference_seconds) -> None:
        self.trained, self.added = trained, added
        self.max_count, self.max_bytes = max_count, max_bytes
        self._lock = threading.Lock()
        self._model = _read(trained, "model", max_seconds)
        self._added = _read(added, "added", max_seconds)

    def all(self) -> list[Voice]:
        with self._lock:
            return [*self._model.values(), *self._added.values()]

    def find(self, vid: str) -> tuple[Voice, Path] | None:
        """The voice and the folder its clip is in; None for an unknown id."""
        with self._lock:
            if vid in self._model:
                return self._model[vid], self.trained
            if vid in self._added:
                return self._added[vid], self.added
        return None

    def _bytes(self) -> int:
        return sum((self.added / v.file).stat().st_size for v in self._added.values())

    def add(self, name: Any, audio: Any, text: Any, limits: Limits,
            consent: Callable[[], dict[str, Any] | None] = lambda: None) -> Voice:
        """Add a client's voice; `consent` (serve.cloning's check), asked once the clip is known to be
        well-formed, gives the consent record's {id, scope} kept with it or refuses (RequestError)."""
        if not isinstance(name, str) or not name.strip() or len(name) > 64:
            raise RequestError("name: give the voice a name of 1-64 characters")
        check_unicode(name, "name")
        vid = voice_id(name)
        text = check_text(text, "text")
        if not isinstance(audio, str) or not audio.strip():
            raise RequestError("audio: send the clip's bytes in base64")
        wav = reference_waveform(audio, "audio", limits)
        consent_id = consent()
        buf = io.BytesIO()
        sf.write(buf, np.clip(wav, -1.0, 1.0), SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        data = buf.getvalue()
        with self._lock:
            if vid == DEFAULT_VOICE or vid in self._model or vid in self._added:
                raise RequestError(f"name: a voice {quoted(vid)} exists; choose another name (or "
                                   "DELETE it first)")
            if len(self._added) >= self.max_count:
                raise RequestError(f"voices: {len(self._added)} added already, at most {self.max_count} "
                                   "(serve.max_voices); delete one first")
            if self._bytes() + len(data) > self.max_bytes:
                raise RequestError(f"voices: this clip's {len(data)} bytes would pass the {self.max_bytes} "
                                   "bytes kept for added voices (serve.max_voice_bytes); delete one or send "
                                   "a shorter clip")
            voice = Voice(vid, name.strip(), text, f"{CLIPS}/{vid}.flac", round(wav.size / SAMPLE_RATE, 3),
                          "added", consent=consent_id)
            (self.added / CLIPS).mkdir(parents=True, exist_ok=True)
            atomic_write(self.added / voice.file, lambda tmp: Path(tmp).write_bytes(data), ".flac")
            self._added[vid] = voice
            self._save()
        return voice

    def delete(self, vid: str) -> bool:
        """True when an added voice went; the model's own voices are part of the version and stay."""
        with self._lock:
            if vid in self._model:
                raise RequestError(f"voice {quoted(vid)} is one of the registered model's own; only added "
                                   "voices can be deleted")
            voice = self._added.pop(vid, None)
            if voice is None:
                return False
            self._save()
            (self.added / voice.file).unlink(missing_ok=True)
        return True

    def _save(self) -> None:
        rows = [{k: v for k, v in asdict(voice).items() if k != "origin"} for voice in self._added.values()]
        self.added.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.added / VOICES_FILE, json.dumps(rows, ensure_ascii=False, indent=1) + "\n")
