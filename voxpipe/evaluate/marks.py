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
# the mark is written in the magnitude and kept with the clip's own phase: on some audio (the demo model's
# output, a DC offset of 0.33 over near-silence) one pass does not survive the inverse STFT (the spectrum is
# not consistent), a second, on the marked clip, does; speech and white noise keep the first
MAX_PASSES = 3
# the decoder's confidence in bfloat16 was within 0.006 of float32's (the reading `detect` makes) on 135
# readings of marked, half-marked and unmarked speech and noise: a check in bfloat16 asks this much more
BF16_MARGIN = 0.05
NAME = "perth"
FRAME_MULTIPLE = 16  # the marking networks' frames are run padded to this (`_channels_last`)
SHORT_FRAMES = 240  # up to this many frames a convolution runs its weights packed for short inputs (`_Conv`)


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
    answer to float rounding.

    The frames are run padded to a multiple of FRAME_MULTIPLE: oneDNN's kernels for other lengths took 2-3x
    as long a frame here (the encoder at 673 frames: 12.1 us a frame, at 672: 4.2; at 399: 18.3, at 400:
    5.2). The padding is zeroed after every layer, so each layer sees at the clip's end the zeros its own
    padding would give: the frames kept are the unpadded stack's."""
    import torch
    import torch.nn.functional as F

    class ChannelsLast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = [_Conv(layer.conv, layer.act) for layer in layers]

        def forward(self, x: Any) -> Any:  # [B, C, T] -> [B, C', T]
            frames = x.size(2)
            x = F.pad(x, (0, -frames % FRAME_MULTIPLE)).unsqueeze(2)
            x = x.contiguous(memory_format=torch.channels_last)
            for i, conv in enumerate(self.convs):
                x = conv(x)
                if i + 1 < len(self.convs) and x.size(3) > frames:
                    x[..., frames:] = 0
            return x[..., :frames].squeeze(2)

    return ChannelsLast().requires_grad_(False)


class _Conv:
    """One Conv1d (+ LeakyReLU) of perth's as a 2-D convolution of a channels-last [B, C, 1, T] tensor.

    Where torch has oneDNN, its weights are reordered once, here, into oneDNN's blocked layout, and the
    activation runs inside the convolution (torch.ops.mkldnn's pointwise convolution, what torch.compile
    emits for a convolution on the CPU): F.conv2d reorders the weights on every call, which was most of a
    layer's time on a short clip (a 256-channel, 7-tap layer in bfloat16: 213 us at 128 frames, 80 us
    packed; 357 us at 400 frames, 207 us packed). oneDNN picks the layout by the input's size, so there are
    two: for at most SHORT_FRAMES frames (packed for 256 or more, 224 frames took 186 us, not 114), and for
    more (packed for 64, 256 frames took 215 us, not 150)."""

    def __init__(self, conv: Any, act: Any) -> None:
        import torch

        self.weight = conv.weight.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)
        self.bias, self.padding = conv.bias.detach(), [0, conv.padding[0]]
        self.slope = act.negative_slope if act else None
        self.packed: tuple[Any, Any] | None = None
        if torch.backends.mkldnn.is_available():
            try:  # a torch whose oneDNN lacks these ops (some aarch64 builds) runs F.conv2d
                self.packed = tuple(torch._C._nn.mkldnn_reorder_conv2d_weight(
                    conv.weight.detach().unsqueeze(2).to_mkldnn(), self.padding, [1, 1], [1, 1], 1,
                    [1, conv.in_channels, 1, frames]) for frames in (4 * FRAME_MULTIPLE, 2 * SHORT_FRAMES))
                self(torch.zeros(1, conv.in_channels, 1, FRAME_MULTIPLE, dtype=self.weight.dtype))
            except (RuntimeError, NotImplementedError):
                self.packed = None

    def __call__(self, x: Any) -> Any:
        import torch
        import torch.nn.functional as F

        if self.packed is None:
            x = F.conv2d(x, self.weight, self.bias, padding=self.padding)
            return x if self.slope is None else F.leaky_relu(x, self.slope)
        weight = self.packed[x.size(3) > SHORT_FRAMES]
        act, scalars = ("none", []) if self.slope is None else ("leaky_relu", [self.slope])
        return torch.ops.mkldnn._convolution_pointwise(x, weight, self.bias, self.padding, [1, 1], [1, 1], 1,
                                                       act, scalars, None)


def _spectrum(net: _Net, signal: Any) -> Any:
    """The STFT PerTh's network was trained on (torchaudio's Spectrogram: centred, reflect-padded, Hann)."""
    import torch

    hp = net.hp
    return torch.stft(signal, hp.n_fft, hp.hop_size, hp.window_size, net.window, center=True,
                      pad_mode="reflect", normalized=False, onesided=True, return_complex=True)


def _db_range(net: _Net) -> tuple[float, float]:
    """perth's normalization of a dB magnitude: (its floor, its span up to 15 dB of headroom)."""
    min_db = 20 * np.log10(net.hp.stft_magnitude_min)
    return min_db, -min_db + 15


def _normalized_db(net: _Net, spec: Any) -> Any:
    """perth's AudioProcessor.signal_to_magphase's magnitude: dB, floored and scaled to about [0, 1]. Taken
    from the power (10 log10 |z|^2, not 20 log10 |z|): complex abs's careful hypot was 17 % of a mark."""
    min_db, scale = _db_range(net)
    power = spec.real.square().add_(spec.imag.square()).clip_(min=net.hp.stft_magnitude_min**2)
    return power.log10_().mul_(10 / scale).sub_(min_db / scale)


def _magnitude(net: _Net, normalized: Any) -> Any:
    """The inverse of `_normalized_db` (perth's magphase_to_signal's magnitude: 10 ** min(dB / 20, 10)), as
    one exp (torch's pow with a tensor exponent took 5x as long)."""
    import torch

    min_db, scale = _db_range(net)
    ln10 = np.log(10)
    return torch.exp((normalized * (scale / 20 * ln10) + min_db / 20 * ln10).clip_(max=10 * ln10))


def _overlap_added(frames: Any, hop: int) -> Any:
    """[T, n] windowed frames -> their overlap-add, n + hop (T - 1) samples: each frame cut into hop-long
    pieces, piece j of every frame added in one shifted sum (torch.istft's own overlap-add was 40 % of it)."""
    import torch
    import torch.nn.functional as F

    count, n = frames.shape
    pieces = -(-n // hop)
    cut = F.pad(frames, (0, pieces * hop - n)).view(count, pieces, hop)
    out = torch.zeros(count + pieces - 1, hop, dtype=frames.dtype)
    for j in range(pieces):
        out[j:j + count] += cut[:, j]
    return out.view(-1)[: n + hop * (count - 1)]


@functools.lru_cache(maxsize=64)
def _envelope(count: int) -> Any:
    """The squared window's overlap-add over `count` frames: what `_inverse_spectrum` divides by."""
    net = _net()
    return _overlap_added(net.window.square().expand(count, -1), net.hp.hop_size)


def _inverse_spectrum(net: _Net, spec: Any, length: int) -> Any:
    """torch.istft of a `_spectrum` (centred, Hann, unnormalized): `length` samples, to float rounding."""
    import torch

    hp = net.hp
    frames = torch.fft.irfft(spec.T, n=hp.n_fft, dim=1) * net.window
    start = hp.n_fft // 2
    return (_overlap_added(frames, hp.hop_size)[start:start + length]
            / _envelope(spec.size(1))[start:start + length])


def _embedded(net: _Net, spec: Any, level: Any) -> Any:
    """The spectrum with the encoder's mark in its magnitude, each bin keeping its phase: perth's
    Encoder.forward (its layers' residual on the bins below hp.max_wmark_freq, in the frames magmask keeps),
    with the residual added in float32 whatever the layers ran in. level: the spectrum's `_normalized_db`.

    Only those bins are rebuilt from the marked magnitude: the bins above keep the spectrum as it was,
    where perth's round trip through dB returns them to float rounding. A bin keeps its phase by being
    scaled to its new magnitude (a bin of exactly 0 has phase 0, as torch's angle gives it)."""
    import torch

    band = net.encoder.subband
    residual = net.encoder.layers(level[None, :band].to(net.dtype))[0].float()
    magnitude = _magnitude(net, level[:band] + residual * net.magmask(level[None]))
    spec = spec.clone()
    old = spec[:band]
    size = old.abs()
    spec[:band] = torch.where(size > 0, old * (magnitude / size.clip(min=np.finfo(np.float32).tiny)),
                              magnitude.to(old.dtype))
    return spec


def _confidence(net: _Net, level: Any) -> float:
    """PerTh's decoder confidence that a spectrum carries its mark. level: the spectrum's `_normalized_db`."""
    return float(net.decoder(level[None].to(net.dtype))[0])


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
        level = _normalized_db(net, spec)
        for _ in range(MAX_PASSES):
            signal = _inverse_spectrum(net, _embedded(net, spec, level), low.size)
            spec = _spectrum(net, signal)  # what a reader sees; also the next pass's input
            level = _normalized_db(net, spec)
            if _confidence(net, level) > THRESHOLD + margin:
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
        spec = _spectrum(net, torch.from_numpy(np.ascontiguousarray(low)))
        score = _confidence(net, _normalized_db(net, spec))
    return min(max(score, 0.0), 1.0)


def marker(watermark: str) -> Any:
    """The function every clip passes through: `mark` for "perth", the clip unchanged for "off"."""
    return mark if watermark == NAME else (lambda audio, sample_rate: audio)
