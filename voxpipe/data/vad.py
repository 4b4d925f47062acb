"""Silero VAD, run from the ONNX file its wheel ships: speech probability per 32 ms frame of 16 kHz audio.

The `silero-vad` wheel holds its weights (silero_vad/data/silero_vad.onnx, beside a TorchScript and a
safetensors copy); nothing is downloaded. The file is found without importing the package (its
`__init__` imports torch, which a decode worker does not need) and run here with onnxruntime on one
thread, the way the package's own OnnxWrapper feeds it: 512 new samples per call, preceded by the last
64 of the previous chunk, with the recurrent state carried from call to call.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

import numpy as np

from voxpipe.errors import StepError
from voxpipe.voxcpm2_format import SAMPLE_RATE

RATE = SAMPLE_RATE  # Silero's rate (it takes 8 or 16 kHz) is voxpipe's one: clips are decoded to it
FRAME = 512  # samples per probability: 32 ms
CONTEXT = 64  # samples of the previous chunk each call sees first
MODEL = "silero_vad.onnx"


def model_file() -> Path:
    """The ONNX model inside the installed silero-vad wheel."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise StepError("cutting long recordings needs the silero-vad wheel (its VAD weights ship in it): "
                        "run `make install`, or `pip install silero-vad==6.2.3`")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / MODEL
    if not path.is_file():
        raise StepError(f"the silero-vad wheel has no {path}: reinstall it (`pip install --force-reinstall "
                        "silero-vad==6.2.3`)")
    return path


@cache
def _session():
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.inter_op_num_threads = opts.intra_op_num_threads = 1  # the decode pool is the parallelism
    return onnxruntime.InferenceSession(str(model_file()), sess_options=opts,
                                        providers=["CPUExecutionProvider"])


def speech_probabilities(x: np.ndarray) -> np.ndarray:
    """One speech probability per FRAME samples of `x` (16 kHz mono float); the last partial frame is
    padded with silence."""
    session = _session()
    frames = -(-x.size // FRAME)
    padded = np.zeros(frames * FRAME + CONTEXT, dtype=np.float32)
    padded[CONTEXT:CONTEXT + x.size] = x
    state = np.zeros((2, 1, 128), dtype=np.float32)
    rate = np.array(RATE, dtype=np.int64)
    probs = np.empty(frames, dtype=np.float32)
    for i in range(frames):
        chunk = padded[i * FRAME:(i + 1) * FRAME + CONTEXT][None, :]
        out, state = session.run(None, {"input": chunk, "state": state, "sr": rate})
        probs[i] = out.item()
    return probs
