"""The registered model's code: MLflow runs this file (models from code) to turn texts into 48 kHz audio.

`register` logs it with the checkpoint as the artifact "checkpoint" and the voxpipe package as
code, so a serving environment needs only the pinned pip requirements:

    model = mlflow.pyfunc.load_model("models:/voxpipe-sample@champion")
    out = model.predict(pd.DataFrame({"text": ["Hello there."]}), params={"seed": 0, "cfg_value": 2.0})
    out["audio"][0]  # float32 waveform at out["sample_rate"][0] (48000)
    out["spoken_text"][0]  # what it said: "Hello there." with numbers, dates, money spelled out

Each text is normalized as ingest normalized the training transcripts (serve/request.py), unless the
request's params say `"normalize": false`; `spoken_text` is the text the model was given.

Voice cloning: an optional `reference_audio` column holds, per row, a clip of the voice to speak
in: the audio file's bytes in base64; null (or no column) = the voice the model learned. An empty
string, a number or bytes that do not decode are refused (HTTP 400), never taken as "no reference".
A path is accepted only inside the folder the deployment names in $VOXPIPE_REFERENCE_DIR. The same
seed gives the same audio. Every request is checked (serve/request.py); a refused one is an HTTP 400
whose message is one line naming the field.

Load-time options (`model_config`): device ("auto" = cuda when available, else cpu; or "npu", ...),
dtype of the model parameters ("float32" or "bfloat16"; the VAE stays float32), kernels
(`model.kernels`: "auto" = torch_npu's fused kernels on an NPU, "fused", "eager") and
max_reference_seconds (default 30; $VOXPIPE_MAX_REFERENCE_SECONDS overrides it in a deployment) and
deadline_s (`synthesize.deadline_s`; $VOXPIPE_DEADLINE_S overrides it) and locale (the locale the model's
training text was read in, recorded at register: its texts are read in it unless a request's `locale` param
names another; a version registered before locales were recorded has none, and en-US is assumed, said in
the log when it loads).

Every request's work ends with it: generation stops at the deadline (serve/deadline.py) and the answer is a
503 naming it; a param the signature does not know is a 400 (MLflow itself drops it with a warning, so
`predict` reads that warning, `_Dropped`); params left out take bounded defaults sized for the text (the
signature's defaults are the schema's: max_len None = sized), and the served voices (the training data's
speakers, logged at register) are in the "voices" artifact.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.environment_variables import MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE
from mlflow.pyfunc import PythonModel

from voxpipe.serve.deadline import DEADLINE_S, Deadline, RequestStopped
from voxpipe.serve.request import REQUEST_KEYS, Limits, RequestError, model_locale
from voxpipe.track.voices import ASSUMED_LOCALE

REFERENCE_DIR_ENV = "VOXPIPE_REFERENCE_DIR"
MAX_REFERENCE_ENV = "VOXPIPE_MAX_REFERENCE_SECONDS"  # a deployment's override of model_config's
DEADLINE_ENV = "VOXPIPE_DEADLINE_S"
# What MLflow's scoring server does within its own timeout (MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT, 60 s by
# default; it then answers 504 and the worker runs on) besides `predict`: reading and parsing the body before
# it, and after it the JSON of the audio, 7,680 floats a patch. The pyfunc's deadline ends `SCORING_MARGIN_S`
# before that timeout, and generation stops early enough to decode and encode what it made: measured, MLflow's
# JSON of 30 s of audio took 3.3 s on 2 CPU cores (0.018 s a patch), and the VAE decodes a patch in less.
SCORING_MARGIN_S = 5.0
TAIL_S_PER_PATCH = 0.03
# what mlflow.models.utils logs when it drops a param the signature lacks, just before it calls predict
_DROPPED = re.compile(r"Unrecognized params (\[.*?\]) are ignored")


class _Dropped(logging.Filter):
    """Remembers, per thread, the params MLflow dropped for the call about to reach `predict` (the scoring
    server checks the params against the signature and calls predict in the same thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if m := _DROPPED.search(record.getMessage()):
            self.local.names = m.group(1)
        return True

    def take(self) -> str | None:
        names, self.local.names = getattr(self.local, "names", None), None
        return names


_dropped = _Dropped()
logging.getLogger("mlflow.models.utils").addFilter(_dropped)


class RefusedRequest(MlflowException):
    """A 400 whose message stays one line: MLflow's scoring server prefixes an exception's message with
    the whole request ("Failed to predict data '...'"), which for a 10-minute clip is megabytes of
    base64 echoed back; this message ignores that rewrite."""

    def __init__(self, reason: str, error_code: int = INVALID_PARAMETER_VALUE) -> None:  # HTTP 400
        self._reason = reason
        super().__init__(reason, error_code=error_code)

    @property
    def message(self) -> str:
        return self._reason

    @message.setter
    def message(self, value: str) -> None:
        pass


class VoxpipeTTS(PythonModel):
    deadline_s: float = DEADLINE_S  # load_context: model_config's or $VOXPIPE_DEADLINE_S
    voices: str | None = None
    locale: str = ASSUMED_LOCALE  # load_context: model_config's (model_locale)
    locale_how: str = ""  # "recorded at register", or that none was and what is assumed

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
        folder = os.environ.get(REFERENCE_DIR_ENV)
        seconds = os.environ.get(MAX_REFERENCE_ENV) or config.get("max_reference_seconds",
                                                                   Limits.max_reference_seconds)
        self.limits = Limits(float(seconds), Path(folder) if folder else None)
        self.deadline_s = float(os.environ.get(DEADLINE_ENV) or config.get("deadline_s", DEADLINE_S))
        self.checkpoint = context.artifacts["checkpoint"]
        self.voices = context.artifacts.get("voices")  # a folder (voices.json + clips), or None
        self.locale, self.locale_how = model_locale(config.get("locale"))
        if config.get("locale") is None:
            logging.getLogger("voxpipe.serve").warning("voxpipe model: locale %s (%s)", self.locale,
                                                       self.locale_how)

    def deadline(self, rows: int) -> Deadline:
        """The request's deadline: `deadline_s`, or less where MLflow's scoring timeout needs it (read from
        MLflow's own setting), keeping time for the JSON of the audio of `rows` texts."""
        scoring = MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT.get() - SCORING_MARGIN_S
        tail = TAIL_S_PER_PATCH * rows
        if scoring < self.deadline_s:
            return Deadline(max(scoring, 0.0), source=f"{SCORING_MARGIN_S:g} s under MLflow's "
                            f"{MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT.name}", tail_s_per_patch=tail)
        return Deadline(self.deadline_s, tail_s_per_patch=tail)

    # the pandas type hint makes MLflow keep the logged signature (texts + generation params)
    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        """One row per text ("text", else the first column; optional "reference_audio"): audio (float32
        array), sample_rate, hit_length_limit, spoken_text (the text as said)."""
        from voxpipe.serve.speech import speak

        if dropped := _dropped.take():
            raise RefusedRequest(f"params {dropped}: unknown; known: {', '.join(REQUEST_KEYS)}")
        frame = model_input
        if not isinstance(frame, pd.DataFrame):
            frame = pd.DataFrame({"text": list(model_input)})
        texts = list(frame["text"] if "text" in frame else frame.iloc[:, 0])
        references = list(frame["reference_audio"]) if "reference_audio" in frame else [None] * len(texts)
        deadline = self.deadline(len(texts))
        try:
            spoken, speech = speak(self.model, texts, references, params, self.limits, deadline, self.locale)
        except RequestStopped as e:
            raise RefusedRequest(str(e), TEMPORARILY_UNAVAILABLE) from None  # HTTP 503
        except RequestError as e:
            raise RefusedRequest(str(e)) from None
        return pd.DataFrame({
            "audio": [a.numpy().astype(np.float32) for a in speech.audio],  # MLflow writes it as JSON
            "sample_rate": [speech.sample_rate] * len(texts),
            "hit_length_limit": speech.hit_length_limit,
            "spoken_text": spoken,
        })


mlflow.models.set_model(VoxpipeTTS())
