"""The registered model's code: MLflow runs this file (models from code) to turn texts into 48 kHz audio.

`register` logs it with the checkpoint as the artifact "checkpoint" and the voxpipe package as
code, so a serving environment needs only the pinned pip requirements:

    model = mlflow.pyfunc.load_model("models:/voxpipe-voxcpm2@champion")
    out = model.predict(pd.DataFrame({"text": ["Hello there."]}), params={"seed": 0, "cfg_value": 2.0})
    out["audio"][0]  # float32 waveform at out["sample_rate"][0] (48000)

Voice cloning: an optional `reference_audio` column holds, per row, a clip of the voice to speak
in: a path readable where the model runs, or the audio file's bytes in base64 (what a remote
client sends); empty = the voice the model learned. The same seed gives the same audio.

Load-time options (`model_config`): device ("auto" = cuda when available, else cpu; or "npu", ...),
dtype of the model parameters ("float32" or "bfloat16"; the VAE stays float32) and kernels
(`model.kernels`: "auto" = torch_npu's fused kernels on an NPU, "fused", "eager").
"""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

from voxpipe.params import SynthesizeParams

GENERATION_KEYS = ("seed", "cfg_value", "inference_timesteps", "max_len")
# the pyfunc params' defaults are `voxpipe synthesize`'s: both say the same when nothing is given
GENERATION_DEFAULTS = {k: SynthesizeParams.model_fields[k].default for k in GENERATION_KEYS}


class VoxpipeTTS(PythonModel):
    def load_context(self, context) -> None:
        import torch

        from voxpipe.model.io import from_pretrained

        config = context.model_config or {}
        device = config.get("device", "auto")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = getattr(torch, config.get("dtype", "float32"))
        self.model = from_pretrained(
            context.artifacts["checkpoint"], device=device, dtype=dtype, kernels=config.get("kernels", "auto")
        ).eval()

    # the pandas type hint makes MLflow keep the logged signature (texts + generation params)
    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        """One row per text ("text", else the first column; optional "reference_audio"): audio (float32
        array), sample_rate, hit_length_limit."""
        from voxpipe.serve.speech import speak

        frame = model_input
        if not isinstance(frame, pd.DataFrame):
            frame = pd.DataFrame({"text": list(model_input)})
        texts = [str(t) for t in (frame["text"] if "text" in frame else frame.iloc[:, 0])]
        references = list(frame["reference_audio"]) if "reference_audio" in frame else [None] * len(texts)
        args = {**GENERATION_DEFAULTS, **(params or {})}
        speech = speak(
            self.model, texts, references, seed=int(args["seed"]), cfg_value=float(args["cfg_value"]),
            inference_timesteps=int(args["inference_timesteps"]), max_len=int(args["max_len"]),
        )
        return pd.DataFrame({
            "audio": [a.numpy().astype(np.float32) for a in speech.audio],
            "sample_rate": [speech.sample_rate] * len(texts),
            "hit_length_limit": speech.hit_length_limit,
        })


mlflow.models.set_model(VoxpipeTTS())
