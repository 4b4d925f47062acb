"""Every clip voxpipe makes is marked as synthetic in its audio: Resemble's PerTh neural watermark
(`resemble-perth`, the watermark Chatterbox applies), applied by `mark` and read back by `watermark_score`.

PerTh hides a mark in the magnitude spectrum below 2 kHz at 32 kHz, shaped to stay under the
ear's masking threshold; its decoder answers one confidence per clip (about 1 marked, about 0 not).
The network comes from the wheel, but not through the wheel's own loader: that one imports
`pkg_resources` and `torchaudio` (neither installed here) and unpickles the checkpoint with a plain
`torch.load`. Here the weight file's sha256 is checked against the pinned value first, its tensors are
loaded with `weights_only=True`, and the STFT the network was trained on (torchaudio's
Spectrogram: centred, reflect-padded, Hann, unnormalized) is torch's own `stft`. Where the CPU runs
bfloat16 natively, `mark` runs the networks in it (`_marking_net`); `watermark_score` reads in float32.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voxpipe.errors import StepError

WEIGHTS = "perth_net/pretrained/implicit/perth_net_250000.pth.tar"
# resemble-perth 1.0.1's checkpoint: any other file is refused before a byte of it is unpickled
WEIGHTS_SHA256 = "a15bce457ebc53ce5e6c9c3f11df78cf7ee2bf9cdab0a798902135b4c4027670"
THRESHOLD = 0.5  # the decoder's confidence above which a clip counts as marked
# the mark is written in the magnitude and kept with the clip's own phase: on noise-like audio one pass
# does not survive the inverse STFT (the spectrum is not consistent), a second, on the marked clip, does
MAX_PASSES = 3
# the decoder's confidence in bfloat16 was within 0.006 of float32's (the reading `detect` makes) on 135
# readings of marked, half-marked and unmarked speech and noise: a check in bfloat16 asks this much more
BF16_MARGIN = 0.05
NAME = "perth"


@dataclass(frozen=True)
class _Net:
    encoder: Any  # perth's Encoder; its layers and subband are what `_embedded` uses
    decoder: Any
    hp: Any  # perth's PerthConfig (sample_rate 32000, n_fft 2048, hop 320, ...)
    window: Any
    magmask: Any  # perth's: the frames loud enough to carry a mark
    dtype: Any  # the networks' weights: float32, or bfloat16 in `_marking_net`


def _perth_root() -> Path:
    spec = importlib.util.find_spec("perth")
    if spec is None or spec.origin is None:
        raise StepError("synthesize.watermark 'perth' needs the resemble-perth package: install it "
                        "(.venv/bin/pip install resemble-perth, in voxpipe's `marks` extra), or set "
                        "synthesize.watermark off with synthesize.watermark_off_reason")
    return Path(spec.origin).parent


def _network_modules(root: Path) -> tuple[Any, Any, Any]:
    """perth's Encoder, Decoder and config modules, imported without perth.perth_net's __init__ (it needs
    pkg_resources, gone from setuptools >= 81): that package is given as a bare namespace."""
    package = "perth.perth_net"
    if package not in sys.modules or not hasattr(sys.modules[package], "__path__"):
        bare = types.ModuleType(package)
        bare.__path__ = [str(root / "perth_net")]
        sys.modules[package] = bare
    base = f"{package}.perth_net_implicit"
    return tuple(importlib.import_module(f"{base}.{m}") for m in ("model.encoder", "model.decoder", "config"))


def _checked_weights(path: Path) -> dict[str, Any]:
    import torch

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != WEIGHTS_SHA256:
        raise StepError(f"the PerTh weight file {path} has sha256 {digest[:16]}..., not the pinned "
                        f"{WEIGHTS_SHA256[:16]}... of resemble-perth 1.0.1: it is not loaded. Reinstall "
                        "it (.venv/bin/pip install --force-reinstall resemble-perth==1.0.1)")
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def _native_bf16() -> bool:
    import torch

    return any(getattr(torch.cpu, f"_is_{isa}_supported", lambda: False)()
               for isa in ("amx_tile", "avx512_bf16"))


@functools.cache
def _net() -> _Net:
    import torch
    import yaml

    root = _perth_root()
    encoder_mod, decoder_mod, config_mod = _network_modules(root)
    hparams = yaml.safe_load((root / WEIGHTS).with_name("hparams.yaml").read_text())
    hp = config_mod.PerthConfig(**hparams)
    subband = int(round((hp.n_fft // 2 + 1) * hp.max_wmark_freq / (hp.sample_rate / 2)))
    state = _checked_weights(root / WEIGHTS)
    encoder = encoder_mod.Encoder(hp.hidden_size, subband)
    decoder = decoder_mod.Decoder(hp.hidden_size, subband)
    encoder.load_state_dict({k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")})
    decoder.load_state_dict({k[len("decoder."):]: v for k, v in state.items() if k.startswith("decoder.")})
    return _Net(encoder.eval(), decoder.eval(), hp, torch.hann_window(hp.window_size), encoder_mod.magmask,
                torch.float32)


@functools.cache
def _marking_net() -> _Net:
    """The networks `mark` runs: each convolution stack run as 2-D convolutions on channels-last tensors
    (`_channels_last`), and in bfloat16 where the CPU runs it natively (AMX or AVX512-BF16), about 2.4x
    faster than float32 (weights cast once here, not per clip as autocast would)."""
    import torch

    net = _net()
    dtype = torch.bfloat16 if _native_bf16() else torch.float32
    encoder, decoder = copy.deepcopy(net.encoder).to(dtype), copy.deepcopy(net.decoder).to(dtype)
    encoder.layers = _channels_last(encoder.layers)
    for branch in ("slow_layers", "normal_layers", "fast_layers"):
        setattr(decoder, branch, _channels_last(getattr(decoder, branch)))
    return dataclasses.replace(net, encoder=encoder, decoder=decoder, dtype=dtype)


def _channels_last(layers: Any) -> Any:
    """perth's stack of Conv1d (+ LeakyReLU) as one module that runs them as 1-row 2-D convolutions on a
    channels-last tensor: oneDNN's fast layout on the CPU, which perth's [B, C, T] tensors reorder into and
    out of at every layer (0.33 ms a layer in bfloat16 at 240 frames, not 0.51). Same weights, same
    answer to float rounding."""
    import torch
    import torch.nn.functional as F

    class ChannelsLast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.nn.ParameterList(
                layer.conv.weight.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)
                for layer in layers)
            self.biases = torch.nn.ParameterList(layer.conv.bias.detach() for layer in layers)
            self.pads = [layer.conv.padding[0] for layer in layers]
            self.acts = [bool(layer.act) for layer in layers]

        def forward(self, x: Any) -> Any:  # [B, C, T] -> [B, C', T]
            x = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            for weight, bias, pad, act in zip(self.weights, self.biases, self.pads, self.acts, strict=True):
                x = F.conv2d(x, weight, bias, padding=(0, pad))
                if act:
                    x = F.leaky_relu(x)
            return x.squeeze(2)

    return ChannelsLast().requires_grad_(False)


def _spectrum(net: _Net, signal: Any) -> Any:
    """The STFT PerTh's network was trained on (torchaudio's Spectrogram: centred, reflect-padded, Hann)."""
    import torch

    hp = net.hp
    return torch.stft(signal, hp.n_fft, hp.hop_size, hp.window_size, net.window, center=True,
                      pad_mode="reflect", normalized=False, onesided=True, return_complex=True)


def _normalized_db(net: _Net, spec: Any) -> Any:
    """perth's AudioProcessor.signal_to_magphase's magnitude: dB, floored and scaled to about [0, 1]."""
    import torch

    min_db = 20 * np.log10(net.hp.stft_magnitude_min)
    return (20 * torch.log10(spec.abs().clip(net.hp.stft_magnitude_min)) - min_db) / (-min_db + 15)


def _magnitude(net: _Net, normalized: Any) -> Any:
    """The inverse of `_normalized_db` (perth's magphase_to_signal's magnitude)."""
    min_db = 20 * np.log10(net.hp.stft_magnitude_min)
    return 10.0 ** ((normalized * (-min_db + 15) + min_db) / 20).clip(max=10)


def _embedded(net: _Net, spec: Any) -> Any:
    """The spectrum with the encoder's mark in its magnitude, each bin keeping its phase: perth's
    Encoder.forward (its layers' residual on the bins below hp.max_wmark_freq, in the frames magmask keeps),
    with the residual added in float32 whatever the layers ran in.

    Only those bins are rebuilt from the marked magnitude: the bins above keep the spectrum as it was,
    where perth's round trip through dB returns them to float rounding."""
    import torch

    magnitude = _normalized_db(net, spec)
    band = net.encoder.subband
    residual = net.encoder.layers(magnitude[None, :band].to(net.dtype))[0].float()
    marked = magnitude[:band] + residual * net.magmask(magnitude[None])
    spec = spec.clone()
    spec[:band] = torch.polar(_magnitude(net, marked), spec[:band].angle())
    return spec


def _confidence(net: _Net, spec: Any) -> float:
    """PerTh's decoder confidence that the spectrum carries its mark."""
    return float(net.decoder(_normalized_db(net, spec)[None].to(net.dtype))[0])


def _resample(audio: np.ndarray, rate: int, to: int) -> np.ndarray:
    import soxr

    return audio if rate == to else soxr.resample(audio, rate, to, quality="HQ").astype(np.float32)


def mark(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """The clip with PerTh's watermark in it, at its own rate and length (float32, mono): marked again
    (up to MAX_PASSES) until PerTh's decoder reads the mark in it.

    Only what PerTh changes is added back at the clip's own rate: the mark lives below 2 kHz, so the
    48 kHz clip keeps its top octaves bit for bit rather than passing through a 32 kHz round trip."""
    import torch

    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    net = _marking_net()
    rate = net.hp.sample_rate
    low = _resample(audio, sample_rate, rate)
    if low.size < net.hp.n_fft:  # too short for one frame: nothing to hide a mark in
        return audio
    # in bfloat16 (_marking_net) the mark is a residual that loses nothing at its three digits, and the
    # check's reading is within BF16_MARGIN of float32's
    margin = BF16_MARGIN if net.dtype == torch.bfloat16 else 0.0
    with torch.inference_mode():
        signal = torch.from_numpy(np.ascontiguousarray(low))
        spec = _spectrum(net, signal)
        for _ in range(MAX_PASSES):
            signal = torch.istft(_embedded(net, spec), net.hp.n_fft, net.hp.hop_size, net.hp.window_size,
                                 net.window, center=True, normalized=False, onesided=True,
                                 length=low.size)
            spec = _spectrum(net, signal)  # what a reader sees; also the next pass's input
            if _confidence(net, spec) > THRESHOLD + margin:
                break
        marked = signal.numpy()
    delta = _resample((marked - low).astype(np.float32), rate, sample_rate)
    delta = np.pad(delta, (0, max(0, audio.size - delta.size)))[: audio.size]
    return (audio + delta).astype(np.float32)


def watermark_score(audio: np.ndarray, sample_rate: int) -> float:
    """PerTh's decoder confidence that the clip carries its mark, in [0, 1] (THRESHOLD decides)."""
    import torch

    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim > 1:
        audio = audio.mean(axis=1)
    net = _net()
    low = _resample(audio, sample_rate, net.hp.sample_rate)
    if low.size < net.hp.n_fft:
        return 0.0
    with torch.inference_mode():
        score = _confidence(net, _spectrum(net, torch.from_numpy(np.ascontiguousarray(low))))
    return min(max(score, 0.0), 1.0)


def marker(watermark: str) -> Any:
    """The function every clip passes through: `mark` for "perth", the clip unchanged for "off"."""
    return mark if watermark == NAME else (lambda audio, sample_rate: audio)
