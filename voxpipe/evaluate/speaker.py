"""Speaker embeddings (`evaluate.speaker`): Resemblyzer's GE2E encoder (bundled, the default), WavLM, or
wavlm-ecapa (Seed-TTS-eval's SIM model, voxpipe/evaluate/ecapa.py).

Both are registered by name, with the evaluate.* fields they take, in voxpipe/backends.py's `SPEAKER`;
`speaker_encoder` loads the configured one from there.

`wavlm`: transformers `WavLMForXVector` from a local folder (`evaluate.wavlm_model`, e.g. a download of
microsoft/wavlm-base-plus-sv). Its x-vector of the 16 kHz clip is the embedding. Seed-TTS-eval's own SIM
model (WavLM-Large with an ECAPA-TDNN head, a checkpoint outside transformers) is `wavlm-ecapa`.

Why Resemblyzer by default: its weights ship inside the PyPI wheel (`resemblyzer/pretrained.pt`, 17 MB), so
it runs offline and identically on a laptop, in CI and on a cluster. The usual stronger choices
(SpeechBrain ECAPA-TDNN, pyannote, WeSpeaker) fetch their weights from a model hub at run time.
On the shipped sample (two espeak voices) same-voice clips score 0.83-0.97 against their voice's
mean embedding and the other voice at most 0.62.

Install: `pip install --no-deps resemblyzer==0.1.4` plus the `eval` extra (which brings the
maintained `webrtcvad-wheels` for its silence trimming). Its declared dependencies are not usable
as they are: `webrtcvad` is a source-only package that imports pkg_resources (gone from
setuptools >= 81) and `typing` is a Python 2 backport.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxpipe.backends import SPEAKER
from voxpipe.device import cpu_threads
from voxpipe.errors import StepError
from voxpipe.evaluate.ecapa import MIN_SECONDS, WavLMEcapaEncoder, voiced_16k
from voxpipe.voxcpm2_format import SAMPLE_RATE

_CPU = torch.device("cpu")  # the GE2E encoder's LSTM is a chain of tiny matmuls: one thread, no sync


class SpeakerEncoder:
    """Resemblyzer's GE2E encoder."""

    backend, model = "resemblyzer", "resemblyzer 0.1.4 GE2E (bundled)"

    def __init__(self) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # its scipy.ndimage.morphology import
                from resemblyzer import VoiceEncoder, normalize_volume, preprocess_wav
                from resemblyzer.hparams import audio_norm_target_dBFS
        except ImportError as e:
            raise StepError(
                f"speaker similarity needs Resemblyzer ({e}): run `make install`, or "
                "`pip install -e '.[eval]' && pip install --no-deps resemblyzer==0.1.4`"
            ) from e
        self._preprocess = preprocess_wav
        self._louder = lambda wav: normalize_volume(wav, audio_norm_target_dBFS, increase_only=True)
        with cpu_threads(_CPU, 1):
            self._encoder = VoiceEncoder("cpu", verbose=False)

    def embed(self, wav: np.ndarray, sample_rate: int) -> np.ndarray | None:
        """Unit-norm 256-d voice embedding of one clip; None when it holds no voice to embed.

        Like Resemblyzer's own pipeline: 16 kHz, volume raised to -30 dBFS, long silences cut
        (webrtcvad); when the cut leaves too little, the uncut clip is used.
        """
        wav = voiced_16k(wav, sample_rate)
        if wav is None:
            return None
        trimmed = self._preprocess(wav)
        if trimmed.size < MIN_SECONDS * SAMPLE_RATE:
            trimmed = self._louder(wav)
        with cpu_threads(_CPU, 1), np.errstate(invalid="ignore", divide="ignore"):
            embedding = self._encoder.embed_utterance(trimmed.astype(np.float32))
        return embedding if np.all(np.isfinite(embedding)) else None


class WavLMEncoder:
    """transformers WavLMForXVector from a local folder (config.json, preprocessor_config.json, weights)."""

    backend = "wavlm"

    def __init__(self, wavlm_model: str | None) -> None:
        from transformers import AutoFeatureExtractor, WavLMForXVector

        folder = wavlm_model
        if not folder or not (Path(folder) / "config.json").is_file():
            raise StepError(f"evaluate.speaker wavlm: evaluate.wavlm_model {folder!r} is not a model folder "
                            "(no config.json); name the local folder of a WavLMForXVector model (nothing "
                            "downloads at run time)")
        self.model = str(folder)
        self._features = AutoFeatureExtractor.from_pretrained(folder)
        self._net = WavLMForXVector.from_pretrained(folder).eval()

    def embed(self, wav: np.ndarray, sample_rate: int) -> np.ndarray | None:
        wav = voiced_16k(wav, sample_rate)
        if wav is None:
            return None
        inputs = self._features(wav, sampling_rate=SAMPLE_RATE, return_tensors="pt")
        with torch.no_grad():
            embedding = self._net(**inputs).embeddings[0].numpy()
        norm = float(np.linalg.norm(embedding))
        return embedding / norm if np.isfinite(norm) and norm > 0 else None


Encoder = SpeakerEncoder | WavLMEncoder | WavLMEcapaEncoder  # every SPEAKER backend


def speaker_encoder(name: str, config: Mapping[str, Any] | None = None) -> Encoder:
    """The `evaluate.speaker` encoder `name`, from its fields of `config` (the evaluate params)."""
    encoder: Encoder = SPEAKER[name].load(config or {})
    return encoder


def unit_mean(embeddings: Sequence[np.ndarray]) -> np.ndarray:
    """The voice's centre: the mean embedding, renormalised."""
    mean = np.mean(np.stack(embeddings), axis=0)
    return mean / np.linalg.norm(mean)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
