"""AudioVAE v2 parity with upstream voxcpm 2.0.3 on real speech, and checkpoint I/O both ways."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file
from upstream import import_upstream

from voxpipe.data.audio import decode as decode_audio
from voxpipe.model.audiovae import (
    TAPS_MAX_CHANNELS,
    AudioVAE,
    AudioVAEConfig,
    CausalConv,
    Snake1d,
    audiovae_state_dict_for_save,
    load_audiovae_state_dict,
    load_audiovae_weights,
)

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "sample"

# Small shapes (fast on CPU) that still cover every structural switch of upstream's VAE.
CONFIGS = {
    "depthwise-scale_bias": dict(encoder_dim=8, latent_dim=16, decoder_dim=64),
    "dense-noise-unconditioned": dict(
        encoder_dim=4,
        latent_dim=8,
        decoder_dim=64,
        depthwise=False,
        use_noise_block=True,
        sr_bin_boundaries=None,
    ),
    "concat-out_layer": dict(
        encoder_dim=6,
        latent_dim=12,
        decoder_dim=64,
        cond_type="concat",
        cond_dim=8,
        cond_out_layer=True,
        sr_bin_boundaries=[12000, 20000, 30000, 40000],
    ),
}
# the first configuration in the fast loop, the others with the slow tests (make test runs them all)
FAST_FIRST = [n if i == 0 else pytest.param(n, marks=pytest.mark.slow) for i, n in enumerate(CONFIGS)]


@pytest.fixture(scope="module")
def speech() -> list[torch.Tensor]:
    """Three real utterances of different lengths from the shipped sample set, decoded to 16 kHz."""
    files = sorted(SAMPLE_DIR.glob("*.parquet"))
    assert files, f"no sample parquet in {SAMPLE_DIR}"
    rows = pq.read_table(files[0], columns=["audio"]).slice(0, 3).to_pylist()
    # cropped to <= 2.4 s to keep the suite fast; still real speech of three different lengths
    clips = [torch.from_numpy(decode_audio(r["audio"]["bytes"], 16000))[:38400] for r in rows]
    assert len({c.numel() for c in clips}) == 3 and all(c.abs().max() > 0.05 for c in clips)
    return clips


def _upstream_vae(cfg: dict, seed: int):
    audiovae = import_upstream().modules.audiovae
    torch.manual_seed(seed)
    vae = audiovae.AudioVAEV2(audiovae.AudioVAEConfigV2(**cfg)).eval()
    _randomize(vae)
    return vae


def _randomize(vae: torch.nn.Module) -> None:
    """Perturb every float tensor so identity-initialised embeddings and snake alphas are exercised."""
    with torch.no_grad():
        for p in vae.parameters():
            p.mul_(1 + 0.2 * torch.randn_like(p)).add_(0.05 * torch.randn_like(p))


def _save(state: dict[str, torch.Tensor], path: Path, nested: bool = False) -> Path:
    if path.suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save({"state_dict": state} if nested else state, path)
    return path


def _upstream_decode(up, z: torch.Tensor, cfg: dict) -> torch.Tensor:
    """Upstream's default rate is a 1-element tensor that its "concat" conditioning cannot broadcast
    over a batch, so that config gets the default rate per item; the others use upstream's default."""
    if cfg.get("cond_type") == "concat":
        return up.decode(z, torch.full((z.shape[0],), up.out_sample_rate, dtype=torch.int32))
    return up.decode(z)


def _batch(clips: list[torch.Tensor]) -> torch.Tensor:
    n = max(c.numel() for c in clips)
    return torch.stack([torch.nn.functional.pad(c, (0, n - c.numel())) for c in clips]).unsqueeze(1)


@pytest.mark.parametrize("name", FAST_FIRST)
def test_upstream_checkpoint_loads_in_ours_and_matches(name, speech, tmp_path):
    cfg = CONFIGS[name]
    up = _upstream_vae(cfg, seed=1)
    # upstream ships audiovae.pth (optionally nested under "state_dict") or audiovae.safetensors
    pth = load_audiovae_state_dict(_save(up.state_dict(), tmp_path / "audiovae.pth", nested=True))
    st = load_audiovae_state_dict(_save(up.state_dict(), tmp_path / "audiovae.safetensors"))
    assert pth.keys() == st.keys() and all(torch.equal(pth[k], st[k]) for k in st)
    ours = AudioVAE(AudioVAEConfig(**cfg)).eval()
    load_audiovae_weights(ours, st)

    wav = _batch(speech)
    with torch.no_grad():
        z_up, z_ours = up.encode(wav, 16000), ours.encode(wav, sample_rate=16000)
        assert z_ours.shape == (3, cfg["latent_dim"], -(-wav.shape[-1] // 640))
        torch.testing.assert_close(z_ours, z_up, atol=1e-5, rtol=0)

        torch.manual_seed(7)  # the noise-block config draws from the global RNG while decoding
        y_up = _upstream_decode(up, z_up, cfg)
        torch.manual_seed(7)
        y_ours = ours.decode(z_up)
    assert y_ours.shape == (3, 1, z_up.shape[-1] * 1920)
    assert y_ours.std() > 1e-3  # not a dead / constant output
    torch.testing.assert_close(y_ours, y_up, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", FAST_FIRST)
def test_our_checkpoint_loads_strictly_in_upstream(name, speech, tmp_path):
    from safetensors.torch import load_file

    cfg = CONFIGS[name]
    torch.manual_seed(2)
    ours = AudioVAE(AudioVAEConfig(**cfg)).eval()
    _randomize(ours)
    state = audiovae_state_dict_for_save(ours)
    loaded = {
        ".pth": torch.load(_save(state, tmp_path / "audiovae.pth"), weights_only=True),
        ".safetensors": load_file(str(_save(state, tmp_path / "audiovae.safetensors"))),
    }
    for fmt, sd in loaded.items():
        up = _upstream_vae(cfg, seed=3)
        up.load_state_dict(sd, strict=True)  # raises on any missing or unexpected key
        assert all(torch.equal(up.state_dict()[k], v) for k, v in state.items()), fmt

    wav = _batch(speech[:2])
    with torch.no_grad():
        z = ours.encode(wav)
        torch.testing.assert_close(z, up.encode(wav, 16000), atol=1e-5, rtol=0)
        torch.manual_seed(0)
        y_up = _upstream_decode(up, z, cfg)
        torch.manual_seed(0)
        torch.testing.assert_close(ours.decode(z), y_up, atol=1e-5, rtol=0)


def test_per_item_output_rate_matches_upstream(speech):
    cfg = CONFIGS["concat-out_layer"]
    up = _upstream_vae(cfg, seed=4)
    ours = AudioVAE(AudioVAEConfig(**cfg)).eval()
    load_audiovae_weights(ours, up.state_dict())
    rates = torch.tensor([16000, 24000, 48000], dtype=torch.int32)
    with torch.no_grad():
        z = ours.encode(_batch(speech))
        y = ours.decode(z, out_sample_rate=rates)
        torch.testing.assert_close(y, up.decode(z, rates), atol=1e-5, rtol=0)
        # different buckets really condition differently
        assert (y[0] - ours.decode(z[:1], out_sample_rate=48000)[0]).abs().max() > 1e-4


def test_batched_right_padded_encode_equals_one_at_a_time(speech):
    torch.manual_seed(5)
    vae = AudioVAE(AudioVAEConfig(**CONFIGS["depthwise-scale_bias"])).eval()
    _randomize(vae)
    # lengths that are not multiples of the hop, padded by 2560 (hop * patch) like upstream
    clips = [vae.pad_to_multiple(c[: c.numel() - 123], patch_size=4) for c in speech]
    assert all(c.numel() % 2560 == 0 for c in clips)
    with torch.no_grad():
        batched = vae.encode(_batch(clips))
        for i, clip in enumerate(clips):
            single = vae.encode(clip.view(1, 1, -1))
            frames = single.shape[-1]
            assert frames == clip.numel() // 640
            torch.testing.assert_close(batched[i : i + 1, :, :frames], single, atol=1e-5, rtol=0)
        # and the encoder really is causal: changing the future leaves the past alone
        wav = clips[0].view(1, 1, -1).clone()
        before = vae.encode(wav)
        wav[..., 6400:] = 0.3
        after = vae.encode(wav)
    torch.testing.assert_close(after[..., :10], before[..., :10], atol=1e-6, rtol=0)
    assert (after[..., 11:] - before[..., 11:]).abs().max() > 1e-3


def test_mismatched_checkpoint_lists_missing_unexpected_and_misshaped_keys(tmp_path):
    vae = AudioVAE(AudioVAEConfig(**CONFIGS["depthwise-scale_bias"]))
    state = audiovae_state_dict_for_save(vae)
    del state["encoder.fc_logvar.weight_g"]
    state["encoder.fc_sigma.weight"] = torch.zeros(1)
    state["decoder.model.0.bias"] = torch.zeros(3)
    path = _save(state, tmp_path / "audiovae.safetensors")
    with pytest.raises(ValueError) as err:
        load_audiovae_weights(vae, load_audiovae_state_dict(tmp_path), source=str(path))
    message = str(err.value)
    assert str(path) in message
    assert "missing (1): encoder.fc_logvar.weight_g" in message
    assert "unexpected (1): encoder.fc_sigma.weight" in message
    assert "decoder.model.0.bias: checkpoint (3,) vs model (16,)" in message


def test_parametrization_style_weight_norm_keys_are_accepted(tmp_path):
    """A VAE rebuilt with torch.nn.utils.parametrizations.weight_norm saves original0/original1."""
    vae = AudioVAE(AudioVAEConfig(**CONFIGS["depthwise-scale_bias"]))
    state = audiovae_state_dict_for_save(vae)
    renamed = {
        k.replace(".weight_g", ".parametrizations.weight.original0").replace(
            ".weight_v", ".parametrizations.weight.original1"
        ): v
        for k, v in state.items()
    }
    loaded = load_audiovae_state_dict(_save(renamed, tmp_path / "audiovae.pth"))
    assert loaded.keys() == state.keys()
    load_audiovae_weights(AudioVAE(vae.config), loaded)


def test_default_config_is_the_voxcpm2_shape():
    vae = AudioVAE()
    assert (vae.hop_length, vae.decode_hop_length, vae.sample_rate, vae.out_sample_rate) == (
        640,
        1920,
        16000,
        48000,
    )
    assert vae.latent_dim == 64
    up_cfg = import_upstream().modules.audiovae.AudioVAEConfigV2()
    assert AudioVAEConfig().model_dump() == up_cfg.model_dump()


def test_bad_inputs_are_rejected(tmp_path):
    vae = AudioVAE(AudioVAEConfig(**CONFIGS["depthwise-scale_bias"]))
    with pytest.raises(ValueError, match="encodes 16000 Hz audio, got 48000 Hz"):
        vae.encode(torch.zeros(1, 1, 640), sample_rate=48000)
    with pytest.raises(ValueError, match=r"\[B, 1, N\]"):
        vae.encode(torch.zeros(1, 640))
    with pytest.raises(FileNotFoundError, match="no AudioVAE weights"):
        load_audiovae_state_dict(tmp_path)
    with pytest.raises(ValueError, match="decoder_dim 96 must be divisible"):
        AudioVAE(AudioVAEConfig(decoder_dim=96))


@pytest.mark.parametrize("channels", [1, 2, 8, TAPS_MAX_CHANNELS])
@pytest.mark.parametrize("dilation", [1, 3, 9])
def test_a_few_channels_decoded_as_shifted_taps_equal_the_convolution(channels, dilation):
    """Without a gradient, a depthwise causal conv of a few channels runs as shifted multiply-adds (the
    CPU's conv was 15-30 times slower there); it says what the convolution says, to float rounding, on a
    signal longer and one shorter than its reach."""
    torch.manual_seed(channels * 10 + dilation)
    conv = CausalConv(channels, channels, 7, dilation=dilation, groups=channels, left_pad=6 * dilation)
    for length in (5000, 4 * dilation):
        x = torch.randn(2, channels, length)
        with torch.no_grad():
            taps = conv(x)
        convolved = conv(x).detach()  # with a gradient: torch's conv1d
        assert taps.shape == convolved.shape == x.shape
        torch.testing.assert_close(taps, convolved, atol=1e-5, rtol=0)


def test_snake_in_place_without_a_gradient_is_the_same_bit_for_bit():
    snake = Snake1d(4)
    with torch.no_grad():
        snake.alpha.uniform_(0.5, 2.0)
    x = torch.randn(3, 4, 1000)
    with torch.no_grad():
        fast = snake(x)
    assert torch.equal(fast, snake(x).detach())
