"""What voxpipe knows of VoxCPM2's formats without building a model: the audio rate and the checkpoint.

SAMPLE_RATE is the rate every clip is read at: the AudioVAE encodes 16 kHz audio (its config's
`sample_rate`), and every scorer evaluate and ingest run was trained at the same rate (DNSMOS,
PocketSphinx, Whisper and paraformer, WavLM-ECAPA, the pyin pitch tracker). The model's output rate is
its own (48 kHz, `audio_vae.out_sample_rate`) and is read from the model, never from here.

A folder is a VoxCPM2 checkpoint when it holds config.json (upstream's layout: voxpipe/model/io.py);
whether its weights match that config is checked when they load.
"""

from __future__ import annotations

from pathlib import Path

from voxpipe.errors import StepError

SAMPLE_RATE = 16000  # Hz
CONFIG = "config.json"


def is_checkpoint(folder: str | Path) -> bool:
    """Whether `folder` is a checkpoint folder, for callers that try another reading when it is not."""
    return (Path(folder) / CONFIG).is_file()


def checkpoint_config(folder: str | Path, *, where: str | None = None, way_out: str = "") -> Path:
    """`folder`'s config.json, or the one-paragraph error that `where` (default: the folder) is not a
    checkpoint, followed by `way_out` when the caller knows one."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        message = f"{where or folder}: not a VoxCPM2 checkpoint (no {CONFIG})"
        raise StepError(f"{message}; {way_out}" if way_out else message)
    return path
