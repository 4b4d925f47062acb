"""`voxpipe synthesize`: say a text with a registered model (or a checkpoint folder) into a WAV file.

    voxpipe synthesize --model models:/voxpipe-sample@champion --text "Hi." --reference me.wav --out hi.wav
    voxpipe synthesize --model @candidate ...   (or a version number, or a checkpoint folder: models.py)

A `models:/` URI is loaded through MLflow exactly as a serving endpoint loads it (the pyfunc model
and its `predict`, with the reference as the `reference_audio` column), so what this writes is what
the served model answers; a checkpoint folder is loaded directly and runs the same code
(speech.py). The same seed and inputs give the same audio, bit for bit. The request is checked
once up front by the schema the served model uses (request.py): the reference file's bytes go in
base64, as a serving client sends them. The text is normalized as ingest normalized the training
transcripts (numbers, dates, money spelled out; `--no-normalize`: as written) in the locale the model
recorded at register (`--locale` overrides it; en-US, said so, for a model that recorded none), and the
summary shows what was said and in which locale.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voxpipe.errors import StepError, quoted
from voxpipe.evaluate.marks import marker
from voxpipe.evaluate.provenance import UNSIGNED, credentials, sign
from voxpipe.files import atomic_write
from voxpipe.params import Params
from voxpipe.serve.formats import encode
from voxpipe.serve.models import check_registered, model_uri
from voxpipe.serve.request import (
    GENERATION_KEYS,
    Limits,
    RequestError,
    encode_file,
    model_locale,
    parse_request,
)
from voxpipe.serve.request import reference as check_reference
from voxpipe.steps.synthesize import SynthesizeParams
from voxpipe.track.tracking import resolve_tracking_uri, session
from voxpipe.voxcpm2_format import is_checkpoint


@dataclass
class SynthesizeResult:
    out: Path
    seconds: float  # audio length
    sample_rate: int
    hit_length_limit: bool
    source: str
    spoken: str  # the text the model was given
    how: str  # how that text came from --text: "normalized", "as written"
    watermark: str  # "perth", or "off (REASON)"
    c2pa: str  # "signed", or why not

    def summary(self) -> str:
        stop = "; no stop predicted within max_len (raise --max-len)" if self.hit_length_limit else ""
        return (f"synthesize: {self.seconds:.2f} s of audio at {self.sample_rate} Hz from {self.source}"
                f"{stop} -> {self.out}; said ({self.how}): {self.spoken!r}; watermark {self.watermark}, "
                f"C2PA {self.c2pa}")


def _request_params(p: SynthesizeParams) -> dict[str, int | float | bool | str]:
    """The request's params; `locale` only when --locale names one (a version registered before locales
    has no such param, and reads its own)."""
    return {**{k: getattr(p, k) for k in GENERATION_KEYS}, "normalize": p.normalize,
            **({"locale": p.locale} if p.locale else {})}


def _locale(p: SynthesizeParams, model: tuple[str, str]) -> str:
    """How the summary names the locale the text was read in: --locale's, or the model's (`model_locale`:
    the locale and whence)."""
    return f"{p.locale}: --locale" if p.locale else ": ".join(model)


def _from_registry(params: Params, uri: str, reference: str | None
                   ) -> tuple[np.ndarray, int, bool, str | None, str, str]:
    """The served model's answer, the version spoken with (`models:/NAME/N`) and the locale its text was
    read in; the spoken text is None from a version registered before serving normalized text (its
    signature drops `normalize` and it says the text as written)."""
    import mlflow
    import pandas as pd

    p, tracking = params.synthesize, params.tracking
    with session(resolve_tracking_uri(tracking.uri, Path(tracking.work))) as client:
        pinned = check_registered(client, uri)
        model = mlflow.pyfunc.load_model(pinned, model_config={
            "device": p.device, "max_reference_seconds": p.max_reference_seconds})
    frame = pd.DataFrame({"text": [p.text], "reference_audio": [reference]})
    out = model.predict(frame, params=_request_params(p))
    spoken = str(out["spoken_text"][0]) if "spoken_text" in out else None
    tts = model.unwrap_python_model()  # a version registered before locales reads en-US and says nothing
    recorded = (tts.locale, tts.locale_how) if getattr(tts, "locale_how", "") else model_locale(None)
    locale = _locale(p, recorded)
    hit = bool(out["hit_length_limit"][0])
    return out["audio"][0], int(out["sample_rate"][0]), hit, spoken, pinned, locale


def _from_folder(p: SynthesizeParams, reference: str | None) -> tuple[np.ndarray, int, bool, str]:
    from voxpipe.device import resolve_device_type
    from voxpipe.model.io import from_pretrained
    from voxpipe.serve.speech import speak

    folder = Path(p.model)
    if not is_checkpoint(folder):
        raise StepError(f"synthesize.model {quoted(p.model)}: neither a registered model "
                        "(models:/NAME@ALIAS, "
                        "@candidate, a version number) nor a checkpoint folder (no config.json)")
    model = from_pretrained(folder, device=resolve_device_type(p.device)).eval()
    spoken, speech = speak(model, [p.text], [reference], _request_params(p), Limits(p.max_reference_seconds),
                           locale=model_locale(None)[0])
    audio = speech.audio[0].numpy().astype(np.float32)
    return audio, speech.sample_rate, bool(speech.hit_length_limit[0]), spoken[0]


def synthesize(params: Params) -> SynthesizeResult:
    p = params.synthesize
    if not p.text.strip():
        raise StepError("synthesize.text is empty: give --text 'what to say'")
    reference = None
    if p.reference:
        reference = _reference_file(p)  # its bytes, as a serving client sends them
    try:  # refused here as the served model refuses it, before any model loads
        limits = Limits(p.max_reference_seconds)
        if reference is not None:  # the served model's checks, naming the file rather than a request row
            check_reference(reference, f"synthesize.reference {p.reference}", limits)
        parse_request([p.text], [None], _request_params(p), limits)
    except RequestError as e:
        raise StepError(f"synthesize: {e}") from None
    creds = credentials(p.c2pa_key, p.c2pa_cert)  # a bad reference fails before any model loads
    uri = model_uri(p.model, params.registered_model_name())
    with _sized_threads():
        if uri is not None:
            audio, rate, hit, spoken, pinned, locale = _from_registry(params, uri, reference)
            source = pinned if pinned == uri else f"{pinned} ({uri})"
        else:
            audio, rate, hit, spoken = _from_folder(p, reference)
            source, locale = p.model, _locale(p, model_locale(None))  # a checkpoint folder records no locale
    how = f"normalized in {locale}" if p.normalize else "as written"
    if spoken is None:
        spoken, how = p.text, "as written: this model version predates text normalization"
    out = Path(p.out)
    audio = marker(p.watermark)(audio, rate)
    fmt = "mp3" if out.suffix.lower() == ".mp3" else "wav"
    data, signed = encode(audio, rate, fmt), UNSIGNED
    if creds is not None:
        version = pinned if uri is not None else p.model
        data, signed = sign(data, fmt, creds, out.name, version, None, p.watermark), "signed"
    atomic_write(out, lambda tmp: Path(tmp).write_bytes(data), out.suffix or ".wav")
    source += f" in the voice of {p.reference}" if reference is not None else " in the model's own voice"
    watermark = p.watermark if p.watermark != "off" else f"off ({p.watermark_off_reason[:80]})"
    return SynthesizeResult(out, audio.size / rate, rate, hit, source, spoken, how, watermark, signed)


def _sized_threads() -> AbstractContextManager[None]:
    """torch's CPU threads sized by the cores this process may use (cores.py), not the node's."""
    import torch

    from voxpipe.cores import torch_threads, usable_cores
    from voxpipe.device import cpu_threads

    return cpu_threads(torch.device("cpu"), torch_threads(usable_cores(), event_loop=False)[0])


def _reference_file(p: SynthesizeParams) -> str:
    """--reference's bytes in base64; an empty file is an error, never "no reference"."""
    path = Path(p.reference)
    if not path.is_file():
        raise StepError(f"synthesize.reference {p.reference}: no such audio file")
    if path.stat().st_size == 0:
        raise StepError(f"synthesize.reference {p.reference}: the file is empty (0 bytes), so there is no "
                        "voice to clone; give a WAV or FLAC clip of a few seconds of the voice, or leave "
                        "--reference out to speak in the model's own voice")
    return encode_file(path)
