"""A per-clip speech quality score (DNSMOS P.835: SIG, BAK, OVRL), shared by ingest and evaluate.

The network is Microsoft's non-personalized P.835 DNSMOS model, the `sig_bak_ovr.onnx` that ships
inside the `speechmos` wheel, so nothing downloads. We run it with onnxruntime ourselves and do not
call speechmos' own path, which also runs the P.808 model on a mel spectrogram for every window
(twice the cost, for a score nobody here reads).

Behaviour (learnt from the DNSMOS reference, re-implemented): the model scores 16 kHz windows of
9.01 s. A clip shorter than a window is tiled (repeated end to end) up to one window; a longer clip
is scored in windows that start every second (as many as whole seconds past the first nine, as
the reference counts them), and the raw scores of each window are mapped through
the model's published polynomial calibration, then averaged. Unlike the reference, a short clip
is tiled to exactly one window rather than doubled until it is at least one window long: the same
content is scored, once instead of up to twice. And the reference cuts its windows at float
offsets (`int((i + 9.01) * 16000)`), which come out one sample short from the eighth window on and
are then skipped: a long clip there is scored on its first seven seconds and its tail only. We score
every window; for clips up to 16 s the two agree exactly (tests/test_quality.py).

One onnxruntime session per process with a fixed intra-op thread count: the result must not depend
on how many cores the machine has (a sharded ingest gives the same bytes as one pod).
"""

from __future__ import annotations

import importlib.resources

import numpy as np

SAMPLE_RATE = 16_000
WINDOW = int(9.01 * SAMPLE_RATE)  # samples per scored window
HOP = SAMPLE_RATE  # a new window every second

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


def windows(wav: np.ndarray) -> np.ndarray:
    """The (N, WINDOW) float32 windows DNSMOS scores for a 16 kHz mono clip."""
    wav = np.asarray(wav, dtype=np.float32).reshape(-1)
    if wav.size == 0:
        raise ValueError("DNSMOS cannot score an empty clip")
    if wav.size < WINDOW:
        wav = np.resize(wav, WINDOW)  # tiles the clip end to end
    count = max(1, wav.size // SAMPLE_RATE - 9)  # the reference's count: whole seconds past nine
    return np.stack([wav[i * HOP: i * HOP + WINDOW] for i in range(count)])


class Dnsmos:
    """DNSMOS P.835 scorer; build one per process (the session loads once) and call `score`."""

    def __init__(self, threads: int = 1):
        import onnxruntime as ort

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
        batch = windows(np.clip(wav, -1.0, 1.0))
        # one window per run: a batch would change onnxruntime's kernels and so the last bits
        raw = np.concatenate([self._session.run(None, {self._input: w[None, :]})[0] for w in batch])
        return {
            name: float(np.mean(np.polyval(_CALIBRATION[name], raw[:, col].astype(np.float64))))
            for col, name in enumerate(_OUTPUTS)
        }
