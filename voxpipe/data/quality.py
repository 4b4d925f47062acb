"""A per-clip speech quality score (DNSMOS P.835: SIG, BAK, OVRL), shared by ingest and evaluate.

The network is Microsoft's non-personalized P.835 DNSMOS model, the `sig_bak_ovr.onnx` that ships
inside the `speechmos` wheel (byte for byte the one in microsoft/DNS-Challenge), so nothing
downloads. We run it with onnxruntime ourselves and do not call speechmos' own path, which also
runs the P.808 model on a mel spectrogram for every window (twice the cost, for a score nobody here
reads).

Which windows are scored, learnt from the reference (DNS-Challenge `DNSMOS/dnsmos_local.py`) and
re-implemented here so that evaluate's figure is the one papers publish: the model takes 16 kHz
windows of 9.01 s. A shorter clip is doubled (appended to itself) until it is at least one window
long. The result is cut into windows a second apart, `int(floor(seconds) - 9.01) + 1` of them. Each
window's raw scores go through the model's polynomial calibration, and the calibrated scores are
averaged. The reference computes each window's end as the float `int((i + 9.01) * 16000)`. For
windows 7 to 23 and 119 to 122 (of the first 2000) that comes out one sample short, and the
reference skips such windows. So does voxpipe: a 40 s clip is scored on its windows 0-6 and 24-30
only. Following the rounding keeps the
figure equal to the reference's: within 2e-7 from 1 to 40 s (tests/test_quality.py).

Doubling multiplies the cost of a short clip: up to seven windows instead of one (a 2 s clip
becomes 16 s). Ingest only screens clips against `min_quality`, which was set on one window per
clip (docs/data-quality.md), and DNSMOS already dominates its cost. So ingest asks for
`short="tile"`: a short clip is repeated end to end to exactly one window and scored once. That
figure is not the reference's (0.1 or more off at 2 s); evaluate's is.

One onnxruntime session per process with a fixed intra-op thread count: the result must not depend
on how many cores the machine has (a sharded ingest gives the same bytes as one pod).
"""

from __future__ import annotations

import importlib.resources

import numpy as np

from voxpipe.voxcpm2_format import SAMPLE_RATE

SECONDS = 9.01  # the model's input length
WINDOW = int(SECONDS * SAMPLE_RATE)  # samples per scored window
HOP = SAMPLE_RATE  # a new window every second
SHORT_RULES = ("double", "tile")  # how a clip shorter than a window is filled: the reference's, ingest's

# The P.835 model's calibration (non-personalized): raw network output -> MOS, per dimension,
# polynomial coefficients highest power first.
_CALIBRATION = {
    "sig": (-0.08397278, 1.22083953, 0.0052439),
    "bak": (-0.13166888, 1.60915514, -0.39604546),
    "ovrl": (-0.06766283, 1.11546468, 0.04602535),
}
_OUTPUTS = ("sig", "bak", "ovrl")  # the network's output columns, in order


def model_path() -> str:
    """The P.835 ONNX file inside the installed `speechmos` wheel."""
    return str(importlib.resources.files("speechmos") / "dnsmos_models" / "sig_bak_ovr.onnx")


def windows(wav: np.ndarray, short: str = "double") -> np.ndarray:
    """The (N, WINDOW) float32 windows DNSMOS scores for a 16 kHz mono clip; `short` is one of
    SHORT_RULES (the module docstring says what each does and who uses it)."""
    if short not in SHORT_RULES:
        raise ValueError(f"DNSMOS short-clip rule {short!r} is not one of {', '.join(SHORT_RULES)}")
    wav = np.asarray(wav, dtype=np.float32).reshape(-1)
    if wav.size == 0:
        raise ValueError("DNSMOS cannot score an empty clip")
    if short == "tile" and wav.size < WINDOW:
        wav = np.resize(wav, WINDOW)  # repeats the clip end to end, cut at one window
    while wav.size < WINDOW:
        wav = np.concatenate([wav, wav])
    count = int(np.floor(wav.size / SAMPLE_RATE) - SECONDS) + 1
    # the reference's window ends, float rounding included: a window that comes out short is skipped
    starts = [i * HOP for i in range(count) if int((i + SECONDS) * HOP) - i * HOP == WINDOW]
    return np.stack([wav[s:s + WINDOW] for s in starts])


class Dnsmos:
    """DNSMOS P.835 scorer; build one per process (the session loads once) and call `score`."""

    def __init__(self, threads: int = 1, short: str = "double"):
        import onnxruntime as ort

        self.short = short
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self._session = ort.InferenceSession(model_path(), options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name

    def score(self, wav: np.ndarray, sr: int) -> dict[str, float]:
        """{"sig", "bak", "ovrl"} MOS (1..5) of a mono clip at 16 kHz (DNSMOS' only rate)."""
        if sr != SAMPLE_RATE:
            raise ValueError(f"DNSMOS scores {SAMPLE_RATE} Hz audio, got {sr} Hz: resample first")
        batch = windows(np.clip(wav, -1.0, 1.0), self.short)
        # one window per run: a batch would change onnxruntime's kernels and so the last bits
        raw = np.concatenate([self._session.run(None, {self._input: w[None, :]})[0] for w in batch])
        return {
            name: float(np.mean(np.polyval(_CALIBRATION[name], raw[:, col].astype(np.float64))))
            for col, name in enumerate(_OUTPUTS)
        }
