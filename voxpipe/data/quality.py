"""Perceptual quality: DNSMOS P.835 (signal, background, overall MOS, 1-5) from the ONNX model inside the
`speechmos` wheel, run with onnxruntime: offline, the same on a laptop and a cluster.

DNSMOS scores 9.01 s windows of 16 kHz audio, one per second (a shorter clip is repeated up to the
window), maps the raw outputs through its published calibration polynomials and averages the windows.
The session is loaded once per `Dnsmos`.
"""

from __future__ import annotations

from importlib.resources import files

import numpy as np

from voxpipe.data.audio import to_mono_resampled
from voxpipe.errors import StepError

SAMPLE_RATE = 16000
WINDOW_SECONDS = 9.01
# DNSMOS P.835's calibration of the raw network outputs (non-personalized model), highest power first
CALIBRATION = {
    "sig": (-0.08397278, 1.22083953, 0.0052439),
    "bak": (-0.13166888, 1.60915514, -0.39604546),
    "ovrl": (-0.06766283, 1.11546468, 0.04602535),
}


class Dnsmos:
    def __init__(self, threads: int = 1) -> None:
        try:
            import onnxruntime as ort

            model = files("speechmos") / "dnsmos_models" / "sig_bak_ovr.onnx"
        except ImportError as e:
            raise StepError(f"DNSMOS needs speechmos and onnxruntime ({e}): `pip install -e '.[eval]'`") from e
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = threads
        self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name

    def score(self, wav: np.ndarray, sr: int) -> dict[str, float]:
        """{"sig", "bak", "ovrl"} of one mono clip (any rate); an empty clip raises ValueError."""
        audio = np.asarray(wav, dtype=np.float32)
        if sr != SAMPLE_RATE:
            audio = to_mono_resampled(audio, sr, SAMPLE_RATE)
        if audio.size == 0:
            raise ValueError("DNSMOS of an empty clip")
        audio = np.clip(audio, -1.0, 1.0)
        window = int(WINDOW_SECONDS * SAMPLE_RATE)
        if audio.size < window:
            audio = np.tile(audio, -(-window // audio.size))
        starts = range(0, int(np.floor(audio.size / SAMPLE_RATE - WINDOW_SECONDS)) * SAMPLE_RATE + 1, SAMPLE_RATE)
        raw = np.stack([
            self._session.run(None, {self._input: audio[s: s + window][None, :]})[0][0]
            for s in starts if s + window <= audio.size
        ])  # (windows, 3): sig, bak, ovrl before calibration
        return {
            name: float(np.mean(np.polyval(CALIBRATION[name], raw[:, i])))
            for i, name in enumerate(("sig", "bak", "ovrl"))
        }
