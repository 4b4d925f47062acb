"""`evaluate.speaker: wavlm-ecapa`: Seed-TTS-eval's SIM model, WavLM-Large with an ECAPA-TDNN head.

Seed-TTS-eval (and VoxCPM2's published SIM) embeds each clip with UniSpeech's speaker-verification model,
`wavlm_large_finetune.pth`, and scores the cosine between a generated clip and its prompt clip. That
model is seed-tts-eval's `ECAPA_TDNN_SMALL(feat_dim=1024, feat_type="wavlm_large")`: the WavLM-Large
trunk (s3prl's hub copy of UniSpeech's WavLM), a learned softmax mix of its 25 hidden states (the input
of each of the 24 layers and the final layer-normed output), instance norm, then ECAPA-TDNN (three
SE-Res2 blocks, attentive statistics pooling, a 256-d projection).

The trunk here is transformers' `WavLMModel` (its stable-layer-norm variant is WavLM-Large, and its
hidden states are exactly those 25); the checkpoint's trunk weights are renamed onto it (`_trunk_key`).
What transformers lacks, the head, is `EcapaHead`: our own code, with the checkpoint's parameter names
so its state dict loads as it is. The trunk's shape is read from the checkpoint's tensors (layers,
widths, heads, position-conv kernel); WavLM-Large's fixed choices (conv strides, layer-norm feature
extractor, bucket distance 800, input normalisation) are constants. tests/test_ecapa.py checks the
cosines against seed-tts-eval's own ECAPA_TDNN on the same random-init checkpoint.

Loading is `torch.load(weights_only=True)`: tensors, dicts and plain values only, no code runs. The
`model` entry of the file (seed-tts-eval loads `state_dict["model"]`) or a flat state dict is used;
a `.safetensors` file with the same keys also loads. A .pth that pickles other objects is refused
with the way out (convert it once, where the file is trusted, to safetensors).

Known differences from seed-tts-eval's verification.py, both before the model: clips are resampled to
16 kHz with soxr (voxpipe's resampler), not torchaudio's sinc `Resample`, and a stereo file is mixed
to mono where verification.py takes one channel. Clips at 16 kHz mono are scored identically.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from voxpipe.data.audio import to_mono_resampled
from voxpipe.errors import StepError
from voxpipe.voxcpm2_format import SAMPLE_RATE

MIN_SECONDS = 0.3  # as the other encoders: below this there is no voice to embed
SILENCE_RMS = 1e-4
TRUNK = "feature_extract.model."  # the checkpoint's prefix of the WavLM trunk (s3prl's expert.model)
# WavLM-Large's conv feature extractor: (kernel, stride) per layer, the wav2vec 2.0 layout
CONV_LAYOUT = ((10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2))
MAX_BUCKET_DISTANCE = 800  # WavLM-Large's relative-position max distance (not visible in the tensors)
HEAD_CHANNELS, POOL_CHANNELS, RES2_SCALE, SE_BOTTLENECK, ATTENTION_CHANNELS = 512, 1536, 8, 128, 128


def voiced_16k(wav: np.ndarray, sample_rate: int) -> np.ndarray | None:
    """The clip as every speaker encoder takes it, mono float32 at 16 kHz; None when there is no voice to
    embed (shorter than MIN_SECONDS, or silent)."""
    wav = np.asarray(wav, dtype=np.float32)
    if sample_rate != SAMPLE_RATE:
        wav = to_mono_resampled(wav, sample_rate, SAMPLE_RATE)
    if wav.size < MIN_SECONDS * SAMPLE_RATE or float(np.sqrt(np.mean(wav**2))) < SILENCE_RMS:
        return None
    return wav


class ConvReluBn(nn.Module):
    """Conv1d, ReLU, then BatchNorm (this order is the checkpoint's)."""

    def __init__(self, cin: int, cout: int, kernel: int = 1, padding: int = 0, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, padding=padding, dilation=dilation)
        self.bn = nn.BatchNorm1d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(F.relu(self.conv(x)))


class Res2(nn.Module):
    """Res2Net's hierarchical conv: channel groups, each convolved after adding the previous group's output;
    the last group passes through."""

    def __init__(self, channels: int, kernel: int, padding: int, dilation: int, scale: int) -> None:
        super().__init__()
        self.width = channels // scale
        n = scale - 1
        self.convs = nn.ModuleList(
            nn.Conv1d(self.width, self.width, kernel, padding=padding, dilation=dilation) for _ in range(n)
        )
        self.bns = nn.ModuleList(nn.BatchNorm1d(self.width) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.split(x, self.width, dim=1)
        out, previous = [], None
        for group, conv, bn in zip(groups, self.convs, self.bns, strict=False):
            previous = bn(F.relu(conv(group if previous is None else previous + group)))
            out.append(previous)
        return torch.cat([*out, groups[-1]], dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(channels, bottleneck)
        self.linear2 = nn.Linear(bottleneck, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(dim=2)))))
        return x * gate.unsqueeze(2)


class SERes2Block(nn.Module):
    """1x1 conv, Res2 conv, 1x1 conv, squeeze-excitation, plus the input (same width in and out)."""

    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.Conv1dReluBn1 = ConvReluBn(channels, channels)
        self.Res2Conv1dReluBn = Res2(channels, 3, dilation, dilation, RES2_SCALE)
        self.Conv1dReluBn2 = ConvReluBn(channels, channels)
        self.SE_Connect = SqueezeExcite(channels, SE_BOTTLENECK)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.SE_Connect(self.Conv1dReluBn2(self.Res2Conv1dReluBn(self.Conv1dReluBn1(x))))


class AttentiveStats(nn.Module):
    """Attention-weighted mean and standard deviation over time, per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.linear1 = nn.Conv1d(channels, ATTENTION_CHANNELS, 1)
        self.linear2 = nn.Conv1d(ATTENTION_CHANNELS, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = torch.softmax(self.linear2(torch.tanh(self.linear1(x))), dim=2)
        mean = (alpha * x).sum(dim=2)
        var = (alpha * x * x).sum(dim=2) - mean * mean
        return torch.cat([mean, var.clamp(min=1e-9).sqrt()], dim=1)


class EcapaHead(nn.Module):
    """The speaker head on the trunk's hidden states: their softmax-weighted mix, instance norm, ECAPA."""

    def __init__(self, feat_dim: int, hidden_states: int, emb_dim: int) -> None:
        super().__init__()
        self.feature_weight = nn.Parameter(torch.zeros(hidden_states))
        self.instance_norm = nn.InstanceNorm1d(feat_dim)
        self.layer1 = ConvReluBn(feat_dim, HEAD_CHANNELS, kernel=5, padding=2)
        self.layer2 = SERes2Block(HEAD_CHANNELS, dilation=2)
        self.layer3 = SERes2Block(HEAD_CHANNELS, dilation=3)
        self.layer4 = SERes2Block(HEAD_CHANNELS, dilation=4)
        self.conv = nn.Conv1d(3 * HEAD_CHANNELS, POOL_CHANNELS, 1)
        self.pooling = AttentiveStats(POOL_CHANNELS)
        self.bn = nn.BatchNorm1d(2 * POOL_CHANNELS)
        self.linear = nn.Linear(2 * POOL_CHANNELS, emb_dim)

    def forward(self, hidden: tuple[torch.Tensor, ...]) -> torch.Tensor:
        weights = F.softmax(self.feature_weight, dim=-1).view(-1, 1, 1, 1)
        x = (weights * torch.stack(hidden)).sum(dim=0).transpose(1, 2) + 1e-6  # [B, feat_dim, frames]
        out1 = self.layer1(self.instance_norm(x))
        out2 = self.layer2(out1)
        out3 = self.layer3(out2)
        out4 = self.layer4(out3)
        out = F.relu(self.conv(torch.cat([out2, out3, out4], dim=1)))
        return self.linear(self.bn(self.pooling(out)))


def _read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of `path` (.pth through weights_only, or .safetensors), tensors only."""
    if not path.is_file():
        raise StepError(f"evaluate.ecapa_model {str(path)!r} is not a file; download UniSpeech's "
                        "wavlm_large_finetune.pth (docs/evaluation.md, 'Seed-TTS-eval SIM') and name its "
                        "path")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StepError(
            f"{path}: torch.load(weights_only=True) refused it ({first}). voxpipe loads no pickled code; "
            "where you trust the file, convert its `model` state dict once to safetensors "
            "(docs/evaluation.md, 'Seed-TTS-eval SIM') and set evaluate.ecapa_model to the .safetensors file"
        ) from e
    state = loaded.get("model", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise StepError(f"{path}: not a state dict (expected tensors, or a dict whose `model` entry holds "
                        "them, as wavlm_large_finetune.pth has)")
    return state


_LAYER_RENAMES = {
    "self_attn.relative_attention_bias.": "attention.rel_attn_embed.",
    "self_attn.grep_linear.": "attention.gru_rel_pos_linear.",
    "self_attn.grep_a": "attention.gru_rel_pos_const",
    "self_attn.": "attention.",
    "self_attn_layer_norm.": "layer_norm.",
    "fc1.": "feed_forward.intermediate_dense.",
    "fc2.": "feed_forward.output_dense.",
    "final_layer_norm.": "final_layer_norm.",
}


def _trunk_key(key: str) -> str:
    """UniSpeech/s3prl's WavLM parameter name (prefix removed) -> transformers' WavLMModel's."""
    if key == "mask_emb":  # the pre-training mask embedding: loaded, never used at inference
        return "masked_spec_embed"
    if m := re.fullmatch(r"feature_extractor\.conv_layers\.(\d+)\.(0|2\.1)\.(weight|bias)", key):
        part = "conv" if m[2] == "0" else "layer_norm"
        return f"feature_extractor.conv_layers.{m[1]}.{part}.{m[3]}"
    if key.startswith("layer_norm."):
        return "feature_projection." + key
    if key.startswith("post_extract_proj."):
        return "feature_projection.projection." + key.removeprefix("post_extract_proj.")
    if m := re.fullmatch(r"encoder\.pos_conv\.0\.(weight_g|weight_v|bias)", key):
        return f"encoder.pos_conv_embed.conv.{m[1]}"
    if m := re.fullmatch(r"encoder\.layers\.(\d+)\.(.+)", key):
        for old, new in _LAYER_RENAMES.items():
            if m[2].startswith(old):
                return f"encoder.layers.{m[1]}.{new}{m[2].removeprefix(old)}"
    return key  # encoder.layer_norm.* has the same name


def _trunk_config(trunk: dict[str, torch.Tensor], where: Path):  # -> transformers.WavLMConfig
    """The WavLM-Large-layout config whose shapes are those of the checkpoint's trunk."""
    from transformers import WavLMConfig

    try:
        fc1s = [int(m[1]) for k in trunk if (m := re.fullmatch(r"encoder\.layers\.(\d+)\.fc1\.weight", k))]
        layers = 1 + max(fc1s)
        fc1 = trunk["encoder.layers.0.fc1.weight"]
        buckets, heads = trunk["encoder.layers.0.self_attn.relative_attention_bias.weight"].shape
        pos = trunk["encoder.pos_conv.0.weight_v"]
        convs = [trunk[f"feature_extractor.conv_layers.{i}.0.weight"] for i in range(len(CONV_LAYOUT))]
        has_layer_norms = "feature_extractor.conv_layers.0.2.1.weight" in trunk
    except (KeyError, ValueError) as e:
        raise StepError(f"{where}: no WavLM trunk under {TRUNK!r} (missing {e}); evaluate.ecapa_model must "
                        "be UniSpeech's wavlm_large_finetune.pth (WavLM-Large + ECAPA-TDNN)") from e
    kernels = tuple(int(c.shape[2]) for c in convs)
    large = kernels == tuple(k for k, _ in CONV_LAYOUT) and has_layer_norms
    if not large or "encoder.layer_norm.weight" not in trunk:
        raise StepError(f"{where}: its WavLM trunk is not in WavLM-Large's layout (conv kernels {kernels}, "
                        "layer-norm feature extractor); wavlm-ecapa scores with wavlm_large_finetune.pth "
                        "only")
    return WavLMConfig(
        hidden_size=int(fc1.shape[1]), intermediate_size=int(fc1.shape[0]), num_hidden_layers=layers,
        num_attention_heads=int(heads), num_buckets=int(buckets), max_bucket_distance=MAX_BUCKET_DISTANCE,
        conv_dim=[int(c.shape[0]) for c in convs], conv_kernel=list(kernels),
        conv_stride=[s for _, s in CONV_LAYOUT], conv_bias="feature_extractor.conv_layers.0.0.bias" in trunk,
        feat_extract_norm="layer", do_stable_layer_norm=True, num_conv_pos_embeddings=int(pos.shape[2]),
        num_conv_pos_embedding_groups=int(pos.shape[0] // pos.shape[1]), apply_spec_augment=False,
        hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
        layerdrop=0.0,
    )


class WavLMEcapaEncoder:
    """Seed-TTS-eval's speaker-verification embedding from a local wavlm_large_finetune.pth."""

    backend = "wavlm-ecapa"

    def __init__(self, ecapa_model: str | None) -> None:
        from transformers import WavLMModel

        if not ecapa_model:
            raise StepError("evaluate.speaker wavlm-ecapa needs evaluate.ecapa_model: the local path of "
                            "UniSpeech's wavlm_large_finetune.pth (docs/evaluation.md, 'Seed-TTS-eval SIM'; "
                            "nothing downloads at run time)")
        path = Path(ecapa_model)
        state = _read_checkpoint(path)
        trunk = {k.removeprefix(TRUNK): v for k, v in state.items() if k.startswith(TRUNK)}
        config = _trunk_config(trunk, path)
        self._trunk = WavLMModel(config).eval()
        renamed = {_trunk_key(k): v for k, v in trunk.items()}
        self._load(self._trunk, renamed, path, "trunk")
        emb_dim = int(state["linear.weight"].shape[0]) if "linear.weight" in state else 256
        self._head = EcapaHead(config.hidden_size, config.num_hidden_layers + 1, emb_dim).eval()
        head = {k: v for k, v in state.items() if not k.startswith(TRUNK)}
        self._load(self._head, head, path, "ECAPA head")
        self.model = str(path)

    @staticmethod
    def _load(module: nn.Module, weights: dict[str, torch.Tensor], path: Path, part: str) -> None:
        """Every weight of `module` from `weights`, by name and shape, or a StepError naming what is off."""
        wanted = module.state_dict()
        # transformers' weight-normed position conv is a parametrization: original0 is g, original1 is v
        source = {k: k.replace("parametrizations.weight.original0", "weight_g")
                  .replace("parametrizations.weight.original1", "weight_v") for k in wanted}
        counters = {k for k in wanted if k.endswith("num_batches_tracked")}  # unused in eval mode
        missing = sorted(k for k in wanted if source[k] not in weights and k not in counters)
        if missing:
            raise StepError(f"{path}: its {part} lacks {len(missing)} weight(s), e.g. {missing[:3]}; "
                            "evaluate.ecapa_model must be UniSpeech's wavlm_large_finetune.pth")
        shaped = {k: weights.get(source[k], wanted[k]) for k in wanted}
        wrong = [k for k in wanted if shaped[k].shape != wanted[k].shape]
        if wrong:
            raise StepError(f"{path}: its {part} has weights of unexpected shapes, e.g. {wrong[:3]}")
        module.load_state_dict(shaped)

    def _hidden_states(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """s3prl's `hidden_states` of WavLM: the input of every encoder layer, then the encoder's output
        (after its final layer norm). Taken with hooks, not from transformers' `output_hidden_states`,
        whose last entry is the un-normed last layer in some versions and the normed output in others."""
        inputs: list[torch.Tensor] = []

        def keep(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs.append(args[0] if args else kwargs["hidden_states"])

        layers = self._trunk.encoder.layers
        hooks = [layer.register_forward_pre_hook(keep, with_kwargs=True) for layer in layers]
        try:
            last = self._trunk(x).last_hidden_state
        finally:
            for hook in hooks:
                hook.remove()
        return (*inputs, last)

    def embed(self, wav: np.ndarray, sample_rate: int) -> np.ndarray | None:
        """Unit-norm embedding of one clip (seed-tts-eval's cosine is of these); None when no voice."""
        wav = voiced_16k(wav, sample_rate)
        if wav is None:
            return None
        x = torch.from_numpy(wav)[None]
        with torch.no_grad():
            x = F.layer_norm(x, x.shape[-1:])  # WavLM-Large's `normalize`, as s3prl's expert applies it
            embedding = self._head(self._hidden_states(x))[0].numpy()
        norm = float(np.linalg.norm(embedding))
        return embedding / norm if np.isfinite(norm) and norm > 0 else None
