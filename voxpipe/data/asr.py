"""Which recogniser hears each clip, per language (`ingest.asr` / `evaluate.asr`, the first that fits).

The recognisers below are registered by name, with the asr.* fields they take, in voxpipe/backends.py's
`ASR`; `Recognisers` loads the configured names from there. ingest transcribes rows without text with
them, evaluate scores generated clips: this module sits in the data layer, below both.

- `pocketsphinx`: bundled (its US-English model ships inside the wheel), English only. A small,
  old-style recogniser: on synthetic or accented voices it misses many words, so its rate is always
  reported next to its rate on the real recordings of the same texts (`*_real`).
- `whisper`: transformers `WhisperForConditionalGeneration` from a local folder
  (`asr.whisper_model`, e.g. a download of openai/whisper-large-v3, what Seed-TTS-eval uses for
  English); the language is forced per row; any language its generation config lists.
- `paraformer-zh`: sherpa-onnx's offline Paraformer from a local folder (`asr.paraformer_model`:
  `model.onnx` or `model.int8.onnx` and `tokens.txt`, a sherpa-onnx export of FunASR's paraformer-zh,
  what Seed-TTS-eval uses for Chinese); Chinese only.
- `sensevoice`: SenseVoice-Small through sherpa-onnx (`asr.sensevoice_model`, the same two files);
  zh, en, ja, ko, yue.

`hear` gives the transcript with the recogniser's confidence (`Heard`: an average natural-log
probability per word or token, or null with the reason), which ingest keeps for each row it transcribes;
`transcribe` gives the transcript alone. A transcript is returned as the recogniser wrote it: scoring
converts every Chinese hypothesis to simplified characters, whichever backend made it
(voxpipe/evaluate/scoring.py). No PyPI package ships Whisper or Chinese ASR weights (funasr, whisper and
sherpa-onnx models all download at run time), so the last two need a folder the user provides. A
language no configured backend covers gets no rate (null, with the reason), never a number.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from voxpipe.backends import ASR
from voxpipe.data import pocketsphinx_worker as worker
from voxpipe.errors import StepError, quoted_path
from voxpipe.voxcpm2_format import SAMPLE_RATE

WHISPER_MAX_NEW_TOKENS = 200  # a sentence; whisper's decoder holds max_target_positions (448) in all
WHISPER_PROMPT = 4  # <|startoftranscript|> <|lang|> <|transcribe|> <|notimestamps|>


@dataclass(frozen=True)
class Heard:
    """A transcript and how sure its recogniser was: the average natural-log probability of its words or
    tokens (pocketsphinx: the hypothesis' log posterior per word; Whisper: its tokens' mean log-probability,
    its own avg_logprob), or None with `reason`."""

    text: str
    confidence: float | None
    reason: str | None = None


class Recogniser(Protocol):
    backend: str
    model: str  # what names the weights in eval.json

    def covers(self, language: str) -> bool: ...

    def hear(self, wav: np.ndarray, language: str) -> Heard: ...

    def transcribe(self, wav: np.ndarray, language: str) -> str: ...


def _nothing_heard() -> Heard:
    return Heard("", None, "nothing was heard")


class PocketSphinx:
    """pocketsphinx's decoder, in a child process of its own (pocketsphinx_worker.py).

    The decoder holds the GIL for a whole utterance (7 s of the demo's evaluate), so in evaluate's process
    it stalled generation and every scorer beside it (scoring_threads.py); in a child it runs on a core of
    its own. Same decoder, same settings, same samples: the same transcript. The child starts (and loads
    the model) while the caller goes on, and ends with this object or the process. `cpu_seconds`: what
    its decoding cost, which the caller's own CPU time does not show.
    """

    backend, model = "pocketsphinx", "pocketsphinx 5.1.1 en-us (bundled)"

    def __init__(self) -> None:
        try:
            import pocketsphinx  # noqa: F401 (here: the error names the fix; the child decodes)
        except ImportError as e:
            raise StepError(f"asr backend pocketsphinx needs pocketsphinx ({e}): `pip install -e '.[eval]'` "
                            "(or leave it out of ingest.asr and evaluate.asr)") from e
        self._errors = tempfile.TemporaryFile()  # a file, not a pipe: a chatty child can never block on it
        self._child = subprocess.Popen([sys.executable, "-m", worker.__name__], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=self._errors)
        self._lock = threading.Lock()  # one utterance at a time through the pipes
        self.cpu_seconds = 0.0
        weakref.finalize(self, _stop, self._child)

    def covers(self, language: str) -> bool:
        return language == "en"

    def transcribe(self, wav: np.ndarray, language: str) -> str:
        return self.hear(wav, language).text

    def hear(self, wav: np.ndarray, language: str) -> Heard:
        pcm = (np.clip(np.asarray(wav, dtype=np.float32), -1.0, 1.0) * 32767).astype(np.int16).tobytes()
        with self._lock:
            try:
                worker.write_message(self._child.stdin, pcm)
                reply = worker.read_message(self._child.stdout)
            except OSError:
                reply = None
            if reply is not None:
                self.cpu_seconds += worker.CPU.unpack_from(reply)[0]
        if reply is None:
            _stop(self._child)
            self._errors.seek(0)
            why = self._errors.read().decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise StepError(f"the pocketsphinx process ended (exit code {self._child.returncode}: {why[0]}); "
                            "nothing was written. Check the memory limit of this pod or machine, or leave "
                            "pocketsphinx out of ingest.asr and evaluate.asr")
        (score,) = worker.CONFIDENCE.unpack_from(reply, worker.CPU.size)
        text = reply[worker.CPU.size + worker.CONFIDENCE.size:].decode()
        if math.isnan(score):
            return _nothing_heard() if not text else Heard(text, None, "no word in the hypothesis")
        return Heard(text, round(score, 4))


def _stop(child: subprocess.Popen[bytes]) -> None:
    """End the decoder's process: its input closes, it exits (killed if it has not within seconds)."""
    if child.stdin and not child.stdin.closed:
        try:
            child.stdin.close()
        except OSError:
            pass
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _folder(key: str, value: str | None, needs: tuple[str, ...]) -> Path:
    """The model folder `asr.<key>` names, with the files the backend needs; else one paragraph why not."""
    way_out = "or leave the backend out of ingest.asr and evaluate.asr"
    if not value:
        raise StepError(f"asr.{key} is not set: name the local folder of the model (nothing downloads at run "
                        f"time), {way_out}")
    folder = Path(value)
    if not folder.is_dir():
        raise StepError(f"asr.{key} {quoted_path(folder)}: no such folder; name the local folder of the "
                        f"model (nothing downloads at run time), {way_out}")
    missing = [n for n in needs if not (folder / n).is_file()]
    if missing:
        raise StepError(f"asr.{key} {quoted_path(folder)}: not a model folder (no {', '.join(missing)}), "
                        f"{way_out}")
    return folder


class Whisper:
    backend = "whisper"

    def __init__(self, whisper_model: str | None, device: str = "cpu") -> None:
        import torch
        from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration

        path = _folder("whisper_model", whisper_model, ("config.json", "preprocessor_config.json"))
        self.model = str(path)
        self._features = WhisperFeatureExtractor.from_pretrained(path)
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        self._net = WhisperForConditionalGeneration.from_pretrained(path).to(device).eval()
        self._device, self._torch = device, torch
        self._max_new = min(WHISPER_MAX_NEW_TOKENS, self._net.config.max_target_positions - WHISPER_PROMPT)
        self._languages = {k.strip("<|>") for k in (getattr(self._net.generation_config, "lang_to_id", None)
                                                    or {})}

    def covers(self, language: str) -> bool:
        return language in self._languages

    def transcribe(self, wav: np.ndarray, language: str) -> str:
        return self.hear(wav, language).text

    def hear(self, wav: np.ndarray, language: str) -> Heard:
        """The transcript and its avg_logprob: the mean log-probability of the generated tokens (the end
        token included, as Whisper's own transcribe counts it), from generate's scores."""
        features = self._features(np.asarray(wav, dtype=np.float32), sampling_rate=SAMPLE_RATE,
                                  return_tensors="pt").input_features.to(self._device)
        with self._torch.no_grad():
            out = self._net.generate(features, language=language, task="transcribe",
                                     max_new_tokens=self._max_new, return_dict_in_generate=True,
                                     output_scores=True)
            steps = self._net.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0]
        text = self._tokenizer.batch_decode(out.sequences, skip_special_tokens=True)[0].strip()
        finite = steps[self._torch.isfinite(steps)]
        if not text:
            return _nothing_heard()
        return Heard(text, round(float(finite.mean()), 4) if finite.numel() else None,
                     None if finite.numel() else "no scored token")


class ParaformerZh:
    backend = "paraformer-zh"

    def __init__(self, paraformer_model: str | None, threads: int = 1) -> None:
        sherpa_onnx, self.model, tokens = _sherpa_export(self.backend, "paraformer_model", paraformer_model)
        self._recognizer = sherpa_onnx.OfflineRecognizer.from_paraformer(
            paraformer=self.model, tokens=tokens, num_threads=threads,
            sample_rate=SAMPLE_RATE, feature_dim=80, decoding_method="greedy_search",
        )

    def covers(self, language: str) -> bool:
        return language == "zh"

    def transcribe(self, wav: np.ndarray, language: str) -> str:
        return self.hear(wav, language).text

    def hear(self, wav: np.ndarray, language: str) -> Heard:
        return _sherpa_heard(self._recognizer, wav)


def _sherpa_export(backend: str, key: str, folder: str | None) -> tuple[Any, str, str]:
    """sherpa-onnx, and the model and tokens files of a sherpa-onnx export in `folder` (asr.`key`):
    `model.int8.onnx` where there is one, else `model.onnx`, beside `tokens.txt`."""
    path = Path(folder) if folder else None
    weights = next((n for n in ("model.int8.onnx", "model.onnx") if path and (path / n).is_file()),
                   "model.onnx")
    path = _folder(key, folder, (weights, "tokens.txt"))
    try:
        import sherpa_onnx
    except ImportError as e:
        raise StepError(f"asr backend {backend} needs sherpa-onnx ({e}): `pip install -e '.[eval]'`") from e
    return sherpa_onnx, str(path / weights), str(path / "tokens.txt")


def _sherpa_heard(recognizer: Any, wav: np.ndarray) -> Heard:
    """A sherpa-onnx offline recogniser's transcript, with the mean of its token log-probabilities where it
    reports them (`ys_log_probs`; some models leave them empty: then None, with that reason)."""
    stream = recognizer.create_stream()
    stream.accept_waveform(SAMPLE_RATE, np.asarray(wav, dtype=np.float32))
    recognizer.decode_stream(stream)
    result = stream.result
    scores = list(getattr(result, "ys_log_probs", None) or ())
    if not result.text:
        return _nothing_heard()
    if not scores:
        return Heard(result.text, None, "sherpa-onnx reports no token log-probabilities for this model")
    return Heard(result.text, round(float(np.mean(scores)), 4))


class SenseVoice:
    """FunAudioLLM's SenseVoice-Small through sherpa-onnx's offline recogniser, from a local folder
    (`asr.sensevoice_model`: `model.onnx` or `model.int8.onnx` and `tokens.txt`, a sherpa-onnx export);
    Chinese, English, Japanese, Korean and Cantonese, the language found by the model itself. The
    installed sherpa-onnx wheel builds it from those two files: nothing downloads."""

    backend = "sensevoice"
    LANGUAGES = ("zh", "en", "ja", "ko", "yue")

    def __init__(self, sensevoice_model: str | None, threads: int = 1) -> None:
        sherpa_onnx, self.model, tokens = _sherpa_export(self.backend, "sensevoice_model", sensevoice_model)
        self._recognizer = sherpa_onnx.OfflineRecognizer.from_sense_voice(
            model=self.model, tokens=tokens, num_threads=threads,
            sample_rate=SAMPLE_RATE, language="", use_itn=False)  # "": the model tells the language

    def covers(self, language: str) -> bool:
        return language in self.LANGUAGES

    def transcribe(self, wav: np.ndarray, language: str) -> str:
        return self.hear(wav, language).text

    def hear(self, wav: np.ndarray, language: str) -> Heard:
        return _sherpa_heard(self._recognizer, wav)


@dataclass(frozen=True)
class Choice:
    """The recogniser of one language, or why there is none."""

    recogniser: Recogniser | None
    reason: str | None


class Recognisers:
    """The configured backends, loaded once; `for_language` picks the first that covers a language.

    `config`: the asr params as a mapping (`model_dump()`); each backend takes its own fields. `key`: the
    list that names them (ingest.asr or evaluate.asr), as the reasons say it.
    """

    def __init__(self, names: list[str], config: Mapping[str, Any] | None = None,
                 key: str = "evaluate.asr") -> None:
        self.names, self.key = list(names), key
        self.loaded: list[Recogniser] = [ASR[n].load(config or {}) for n in names]

    def child_cpu_seconds(self) -> float:
        """CPU seconds the recognisers spent in processes of their own (pocketsphinx's)."""
        return sum(getattr(r, "cpu_seconds", 0.0) for r in self.loaded)

    def for_language(self, language: str) -> Choice:
        for r in self.loaded:
            if r.covers(language):
                return Choice(r, None)
        if not self.loaded:
            return Choice(None, f"{self.key} is empty: no recogniser configured")
        return Choice(None, f"no configured recogniser covers language {language!r} ({self.key}: "
                            f"{', '.join(self.names)}; pocketsphinx is English only: add whisper with "
                            "asr.whisper_model, or paraformer-zh for Chinese)")
