"""What voxpipe knows of VoxCPM2's formats without building a model: the one audio rate.

SAMPLE_RATE is the rate every clip is read at: the AudioVAE encodes 16 kHz audio (its config's
`sample_rate`), and every scorer evaluate and ingest run was trained at the same rate (DNSMOS,
PocketSphinx, Whisper and paraformer, WavLM-ECAPA, the pyin pitch tracker). The model's output rate is
its own (48 kHz, `audio_vae.out_sample_rate`) and is read from the model, never from here.
"""

from __future__ import annotations

SAMPLE_RATE = 16000  # Hz
