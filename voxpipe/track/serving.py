"""The registered model's code: MLflow runs this file (models from code) to turn texts into 48 kHz audio.

`register` logs it with the checkpoint as the artifact "checkpoint" and the voxpipe package as
code, so a serving environment needs only the pinned pip requirements:

    model = mlflow.pyfunc.load_model("models:/voxpipe-voxcpm2@champion")
    out = model.predict(["Hello there."], params={"seed": 0, "cfg_value": 2.0})
    out["audio"][0]  # float32 waveform at out["sample_rate"][0] (48000)

Load-time options (`model_config`): device ("auto" = cuda when available, else cpu; or "npu", ...)
and dtype of the model parameters ("float32" or "bfloat16"; the VAE stays float32).
"""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

GENERATION_DEFAULTS = {"seed": 0, "cfg_value": 2.0, "inference_timesteps": 10, "max_len": 2000}


class VoxpipeTTS(PythonModel):
    def load_context(self, context) -> None:
        import torch

        from voxpipe.model.io import from_pretrained

        config = context.model_config or {}
        device = config.get("device", "auto")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = getattr(torch, config.get("dtype", "float32"))
        self.model = from_pretrained(context.artifacts["checkpoint"], device=device, dtype=dtype).eval()

    # the pandas type hint makes MLflow keep the logged signature (texts + generation params)
    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        """One row per text (the first column): audio (float32 array), sample_rate, hit_length_limit."""
        column = model_input.iloc[:, 0] if isinstance(model_input, pd.DataFrame) else model_input
        texts = [str(t) for t in column]
        args = {**GENERATION_DEFAULTS, **(params or {})}
        speech = self.model.generate(
            texts, seed=int(args["seed"]), cfg_value=float(args["cfg_value"]),
            inference_timesteps=int(args["inference_timesteps"]), max_len=int(args["max_len"]),
        )
        return pd.DataFrame({
            "audio": [a.numpy().astype(np.float32) for a in speech.audio],
            "sample_rate": [speech.sample_rate] * len(texts),
            "hit_length_limit": speech.hit_length_limit,
        })


mlflow.models.set_model(VoxpipeTTS())
