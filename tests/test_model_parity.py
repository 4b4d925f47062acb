"""The assembled VoxCPM2 against upstream voxcpm 2.0.3: checkpoints, losses, hidden states, generation.

Every case runs for several tiny configurations that differ in depth, heads, KV heads, head dim,
patch size, latent width, RoPE (on, off, residual-only), muP and long-context RoPE factors.
Checkpoints cross in both directions through the on-disk layout; training batches come from
upstream's own packer on real (synthetic) waveforms encoded by the VAE.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file, save_file
from upstream import import_upstream, upstream_packer_class

from voxpipe.errors import StepError
from voxpipe.model.audiovae import AudioVAE, AudioVAEConfig
from voxpipe.model.config import (
    CfmConfig,
    LocalDiTConfig,
    LocalTransformerConfig,
    MiniCPM4Config,
    RopeScalingConfig,
    VoxCPM2Config,
)
from voxpipe.model.io import from_pretrained, save_pretrained
from voxpipe.model.rolling import Prompt, RollingBatch, Row
from voxpipe.model.rows import plan_rows
from voxpipe.model.tokenizer import train_tokenizer
from voxpipe.model.voxcpm2 import VoxCPM2

RTOL = 1e-5


def model_config(
    *,
    lm_layers: int,
    residual_layers: int,
    enc_layers: int,
    dit_layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    patch_size: int,
    feat_dim: int = 64,
    lm_rope: bool = True,
    residual_rope: bool = False,
    mup: bool = False,
    long_rope: bool = False,
    explicit_head_dim: bool = True,
) -> VoxCPM2Config:
    hidden = heads * head_dim
    g = torch.Generator().manual_seed(head_dim * 31 + heads)
    long_f, short_f = (1 + 20 * torch.rand(2, head_dim // 2, generator=g)).tolist()
    kv_channels = head_dim if explicit_head_dim else None
    local = {"hidden_dim": 2 * head_dim * kv_heads, "ffn_dim": 3 * head_dim, "num_heads": 2 * kv_heads,
             "kv_channels": kv_channels}
    return VoxCPM2Config(
        architecture="voxcpm2",
        lm_config=MiniCPM4Config(
            bos_token_id=1, eos_token_id=2, hidden_size=hidden, intermediate_size=2 * hidden + 8,
            max_position_embeddings=4096 if long_rope else 1024, num_attention_heads=heads,
            num_hidden_layers=lm_layers, num_key_value_heads=kv_heads, rms_norm_eps=1e-5,
            rope_scaling=RopeScalingConfig(type="longrope", long_factor=long_f, short_factor=short_f,
                                           original_max_position_embeddings=1024),
            vocab_size=2048, use_mup=mup, scale_emb=12, dim_model_base=256, scale_depth=1.4,
            rope_theta=10000.0, kv_channels=kv_channels, no_rope=not lm_rope,
        ),
        patch_size=patch_size,
        feat_dim=feat_dim,
        residual_lm_num_layers=residual_layers,
        residual_lm_no_rope=not residual_rope,
        scalar_quantization_latent_dim=16,
        scalar_quantization_scale=9,
        encoder_config=LocalTransformerConfig(num_layers=enc_layers, **local),
        dit_config=LocalDiTConfig(num_layers=dit_layers, cfm_config=CfmConfig(inference_cfg_rate=2.0),
                                  **local),
        audio_vae_config=AudioVAEConfig(encoder_dim=8, latent_dim=feat_dim, decoder_dim=64, cond_dim=16),
        max_length=256,
        dtype="float32",
    )


CONFIGS = {
    "gqa-p4-residual-norope": model_config(
        lm_layers=2, residual_layers=1, enc_layers=1, dit_layers=1, heads=4, kv_heads=2, head_dim=16,
        patch_size=4, explicit_head_dim=False,
    ),
    "mqa-p2-rope-everywhere-mup-long": model_config(
        lm_layers=1, residual_layers=2, enc_layers=1, dit_layers=2, heads=2, kv_heads=1, head_dim=32,
        patch_size=2, feat_dim=32, residual_rope=True, mup=True, long_rope=True,
    ),
    "mha-p3-no-rope": model_config(
        lm_layers=3, residual_layers=1, enc_layers=2, dit_layers=1, heads=2, kv_heads=2, head_dim=8,
        patch_size=3, lm_rope=False,
    ),
}


@pytest.fixture(scope="module")
def upstream_model_cls():
    import_upstream()
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    return VoxCPM2Model


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(vocab_size=2048)


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory, tokenizer, upstream_model_cls):
    """(our model, upstream model, checkpoint dir): ours random-init and saved, upstream loaded from it."""
    config = CONFIGS[request.param]
    torch.manual_seed(len(request.param))
    ours = VoxCPM2(config)
    vae = AudioVAE(config.audio_vae_config)
    directory = tmp_path_factory.mktemp(request.param)
    save_pretrained(ours, vae, tokenizer, directory, dtype=torch.float32)
    up = upstream_model_cls.from_local(str(directory), training=True, device="cpu")
    return from_pretrained(directory), up, directory


@pytest.fixture(scope="module")
def batches(pair):
    """Upstream-packed training batches for this configuration, without and with a reference prompt."""
    _, up, _ = pair
    return {with_ref: packed_batch(up, with_ref) for with_ref in (False, True)}


def tone(seconds: float, freq: float, seed: int) -> torch.Tensor:
    """A harmonic tone with a little noise: a real waveform for the VAE to encode."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(16000 * seconds)) / 16000
    wav = 0.3 * torch.sin(2 * torch.pi * freq * t) + 0.1 * torch.sin(2 * torch.pi * 2.7 * freq * t)
    return wav + 0.01 * torch.randn(t.shape, generator=g)


def packed_batch(up, with_ref: bool) -> dict[str, torch.Tensor]:
    """A padded batch of 2 built by upstream's own packer (VAE-encoded audio, -100 padding)."""
    packer = upstream_packer_class()(1, 4096, up.patch_size, up.feat_dim, up.audio_vae)
    texts = [[5, 17, 300, 44, 9], [61, 62]]
    wavs = [tone(0.9, 180.0, 1), tone(0.45, 240.0, 2)]
    refs = [tone(0.5, 200.0, 3), torch.empty(0)] if with_ref else None

    def pad(rows: list[torch.Tensor]) -> torch.Tensor:
        width = max(r.numel() for r in rows)
        fill = [torch.full((width - r.numel(),), -100, dtype=r.dtype) for r in rows]
        return torch.stack([torch.cat(pair) for pair in zip(rows, fill, strict=True)])

    with torch.no_grad():
        batch = packer(
            pad(wavs),
            pad([torch.tensor(t, dtype=torch.int32) for t in texts]),
            torch.ones(2, dtype=torch.long),
            torch.zeros(2, dtype=torch.long),
            [False, False],
            ref_audio_tokens=pad(refs) if refs else None,
        )
    keys = ("text_tokens", "text_mask", "audio_feats", "audio_mask", "loss_mask", "position_ids", "labels")
    out = {k: batch[k] for k in keys}
    lengths = out["text_mask"].bool() | out["audio_mask"].bool()
    assert lengths.sum(1).unique().numel() == 2, "the batch must contain padding"
    return out


# -- 1. checkpoints cross both ways -----------------------------------------------------------------
def test_our_checkpoint_loads_in_upstream_with_every_key(pair):
    ours, up, directory = pair
    files = load_file(str(directory / "model.safetensors"))
    files |= {f"audio_vae.{k}": v for k, v in load_file(str(directory / "audiovae.safetensors")).items()}
    up_state = up.state_dict()
    assert sorted(up_state) == sorted(files), "upstream's loadable keys differ from the saved ones"
    for key, value in files.items():
        assert torch.equal(up_state[key], value), key
    assert sorted(ours.state_dict()) == sorted(k for k in files if not k.startswith("audio_vae."))


def test_upstream_checkpoint_loads_strictly_in_ours(pair, tmp_path, upstream_model_cls):
    _, up, src = pair
    torch.manual_seed(99)  # fresh random upstream weights, unrelated to ours
    fresh = upstream_model_cls(copy.deepcopy(up.config), up.text_tokenizer.tokenizer,
                               type(up.audio_vae)(up.config.audio_vae_config), device="cpu")
    state = fresh.state_dict()
    vae_state = {k.removeprefix("audio_vae."): v for k, v in state.items() if k.startswith("audio_vae.")}
    model_state = {k: v for k, v in state.items() if not k.startswith("audio_vae.")}
    save_file({k: v.contiguous() for k, v in model_state.items()}, str(tmp_path / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in vae_state.items()}, str(tmp_path / "audiovae.safetensors"))
    config = json.loads(fresh.config.model_dump_json())
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "voxcpm2", **config}))
    fresh.text_tokenizer.tokenizer.save_pretrained(str(tmp_path))

    loaded = from_pretrained(tmp_path)
    ours_state = loaded.state_dict()
    assert sorted(ours_state) == sorted(model_state)
    assert all(torch.equal(ours_state[k], v) for k, v in model_state.items())
    assert all(torch.equal(loaded.audio_vae.state_dict()[k], v) for k, v in vae_state.items())
    assert loaded.tokenizer.encode("hello 你好") == fresh.text_tokenizer("hello 你好")


def test_pytorch_model_bin_loads_like_safetensors(pair, tmp_path):
    ours, _, src = pair
    for name in ("config.json", "audiovae.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    torch.save({"state_dict": ours.state_dict()}, tmp_path / "pytorch_model.bin")
    loaded = from_pretrained(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), ours.state_dict().values(),
                                                 strict=True))


def test_strict_loading_lists_missing_and_unexpected_keys(pair, tmp_path):
    _, _, src = pair
    for name in ("config.json", "audiovae.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    state = load_file(str(src / "model.safetensors"))
    del state["stop_head.weight"]
    state["base_lm.layers.0.self_attn.q_proj.weight"] = torch.zeros(3, 3)
    state["bogus.weight"] = torch.zeros(1)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(StepError) as err:
        from_pretrained(tmp_path)
    message = str(err.value)
    assert "missing (1): stop_head.weight" in message
    assert "unexpected (1): bogus.weight" in message
    assert "base_lm.layers.0.self_attn.q_proj.weight: checkpoint (3, 3)" in message


# -- 3./4. training losses, gradients and LM hidden states ------------------------------------------
@pytest.mark.parametrize("with_ref", [False, True], ids=["plain", "ref"])
def test_training_losses_and_grads_match_upstream(pair, batches, with_ref):
    ours, up, _ = pair
    ours.train()
    up.train()
    batch = batches[with_ref]
    torch.manual_seed(1234)
    expected = up(**batch)
    expected_rng = torch.random.get_rng_state()
    torch.manual_seed(1234)
    got = ours(**batch)
    assert torch.equal(torch.random.get_rng_state(), expected_rng), "global RNG consumed differently"
    for key in ("loss/diff", "loss/stop"):
        assert got[key].dtype == torch.float32
        torch.testing.assert_close(got[key], expected[key], rtol=RTOL, atol=0)

    (expected["loss/diff"] + expected["loss/stop"]).backward()
    (got["loss/diff"] + got["loss/stop"]).backward()
    up_params = dict(up.named_parameters())
    for name, param in ours.named_parameters():
        ref = up_params[name].grad
        assert (param.grad is None) == (ref is None), name
        if ref is not None:
            torch.testing.assert_close(param.grad, ref, rtol=1e-4, atol=1e-6, msg=name)
    ours.zero_grad(set_to_none=True)
    up.zero_grad(set_to_none=True)


def test_base_and_residual_lm_hidden_states_match(pair, batches):
    ours, up, _ = pair
    batch = batches[True]
    seen: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(_module, _inputs, output):
            seen[name] = (output[0] if isinstance(output, tuple) else output).detach()

        return hook

    handles = [m.register_forward_hook(keep(f"{who}.{lm}"))
               for who, model in (("ours", ours), ("up", up)) for lm in ("base_lm", "residual_lm")
               for m in [getattr(model, lm)]]
    try:
        torch.manual_seed(0)
        up(**batch)
        torch.manual_seed(0)
        ours(**batch)
    finally:
        for h in handles:
            h.remove()
    # ours computes only the positions its losses read (voxpipe/model/rows.py): those are compared
    plan = plan_rows(batch["audio_mask"], batch["loss_mask"])
    read = {"base_lm": plan.lm_rows, "residual_lm": plan.lm_rows[plan.loss_prev.clamp(min=0)]}
    for lm, rows in read.items():
        theirs = seen[f"up.{lm}"].reshape(-1, seen[f"up.{lm}"].size(-1))[rows]
        torch.testing.assert_close(seen[f"ours.{lm}"], theirs, rtol=RTOL, atol=1e-6)
    assert plan.lm_rows.numel() < batch["audio_mask"].numel()  # the test batch has positions left out


# -- 6. generation -----------------------------------------------------------------------------------
@pytest.mark.parametrize("with_ref", [False, True], ids=["zero-shot", "ref"])
def test_generation_latents_match_upstream_first_steps(pair, with_ref):
    ours, up, _ = pair
    up.eval()
    text = torch.tensor([5, 17, 300, 44, 101], dtype=torch.int32)
    n = text.numel()
    feat = torch.zeros(n, up.patch_size, up.feat_dim)
    text_mask, audio_mask = torch.ones(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32)
    if with_ref:
        ref = torch.randn(3, up.patch_size, up.feat_dim, generator=torch.Generator().manual_seed(5))
        tokens, feats, t_mask, a_mask = up._make_ref_prefix(ref, "cpu")
        text, feat = torch.cat((tokens, text)), torch.cat((feats, feat))
        text_mask, audio_mask = torch.cat((t_mask, text_mask)), torch.cat((a_mask, audio_mask))
    prompt = (text[None].long(), text_mask[None], feat[None], audio_mask[None])
    steps = 4
    torch.manual_seed(11)
    expected, _ = up.inference(*prompt, min_len=steps, max_len=steps, inference_timesteps=4, cfg_value=2.0)
    row = Row(Prompt(text.long(), feat, text_mask, audio_mask), max_len=steps, min_len=steps, cfg_value=2.0,
              inference_timesteps=4, generator=torch.Generator().manual_seed(11))
    [done] = RollingBatch(ours).run([row])
    got = done.patches.permute(2, 0, 1).reshape(1, ours.feat_dim, -1)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert done.patches.size(0) == steps and done.hit_limit


@pytest.mark.parametrize("pair", ["mqa-p2-rope-everywhere-mup-long"], indirect=True)
def test_generate_end_to_end_matches_upstream_audio(pair, tmp_path):
    """Tokenizer, reference encoding, prompt layout, sampling and VAE decode together (one config:
    upstream reads the reference through librosa, slow to import)."""
    ours, up, _ = pair
    up.eval()
    wav = tone(0.6, 210.0, 7)
    sf.write(tmp_path / "ref.wav", wav.numpy(), 16000, subtype="FLOAT")
    text = "hello world 你好"
    steps = 3
    torch.manual_seed(21)
    expected = up.generate(text, reference_wav_path=str(tmp_path / "ref.wav"), min_len=steps, max_len=steps,
                           inference_timesteps=3, cfg_value=2.0)
    got = ours.generate(text, reference=wav.numpy(), max_len=steps, min_len=steps, inference_timesteps=3,
                        seed=21)
    assert got.sample_rate == 48000 and got.hit_length_limit == [True]
    torch.testing.assert_close(got.audio[0], expected[0], rtol=1e-4, atol=1e-5)


# -- ours only: dtypes, determinism, batched generation, init-model -----------------------------------
def test_training_step_runs_in_fp32_bf16_params_and_autocast(pair, batches):
    ours, _, _ = pair
    batch = batches[True]
    losses = {}
    for mode in ("fp32", "bf16", "autocast"):
        model = copy.deepcopy(ours).train()
        if mode == "bf16":
            model.to(torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            out = model(**batch, generator=torch.Generator().manual_seed(3))
        total = out["loss/diff"] + out["loss/stop"]
        total.backward()
        assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in out.values()), mode
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), mode
        losses[mode] = total.item()
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05)
    assert losses["autocast"] == pytest.approx(losses["fp32"], rel=0.05)


def test_generator_fixes_randomness_without_touching_global_rng(pair, batches):
    ours, _, _ = pair
    batch = batches[False]
    state = torch.random.get_rng_state()
    a = ours(**batch, generator=torch.Generator().manual_seed(8), cond_dropout=False)
    b = ours(**batch, generator=torch.Generator().manual_seed(8), cond_dropout=False)
    dropped = ours(**batch, generator=torch.Generator().manual_seed(8), cond_dropout=True)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a["loss/diff"].item() == b["loss/diff"].item()
    assert dropped["loss/diff"].item() != a["loss/diff"].item()  # seed 8 drops some rows' condition


def test_batched_generation_with_reference_is_finite_and_seeded(pair):
    ours, _, _ = pair
    texts = ["a short one", "你好，世界。 a longer second sentence"]
    refs = [tone(0.5, 190.0, 4).numpy(), None]
    first = ours.generate(texts, reference=refs, max_len=4, inference_timesteps=3, seed=4)
    again = ours.generate(texts, reference=refs, max_len=4, inference_timesteps=3, seed=4)
    other = ours.generate(texts, reference=refs, max_len=4, inference_timesteps=3, seed=5)
    hop = ours.audio_vae.decode_hop_length
    assert first.sample_rate == 48000 and len(first.audio) == 2
    for audio, latents in zip(first.audio, first.latents, strict=True):
        assert torch.isfinite(audio).all() and audio.numel() == latents.size(1) * hop
        assert latents.size(1) % ours.patch_size == 0
    assert all(torch.equal(x, y) for x, y in zip(first.audio, again.audio, strict=True))
    assert not torch.equal(first.audio[0][: other.audio[0].numel()], other.audio[0][: first.audio[0].numel()])


def test_layers_to_shard_covers_every_transformer_block(pair):
    ours, _, _ = pair
    c = ours.config
    expected = (c.lm_config.num_hidden_layers + c.residual_lm_num_layers + c.encoder_config.num_layers
                + c.dit_config.num_layers)
    layers = ours.layers_to_shard()
    assert len(layers) == expected and len({id(x) for x in layers}) == expected
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    outside = sum(p.numel() for p in ours.parameters() if id(p) not in in_layers)
    assert outside < sum(p.numel() for p in ours.parameters())


@pytest.mark.slow
def test_init_model_cli_is_deterministic_and_loads_in_both(tmp_path, upstream_model_cls):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        cmd = [sys.executable, "-m", "voxpipe.cli", "init-model", "--out", str(out), "--seed", "3"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        runs.append(out)
    files = ("config.json", "model.safetensors", "audiovae.safetensors", "tokenizer.json",
             "tokenizer_config.json", "special_tokens_map.json")
    for name in files:
        assert (runs[0] / name).read_bytes() == (runs[1] / name).read_bytes(), name
    report = json.loads((runs[0] / "report.json").read_text())
    assert report["preset"] == "tiny" and report["parameters"] < 5_000_000

    model = from_pretrained(runs[0])
    up = upstream_model_cls.from_local(str(runs[0]), training=True, device="cpu")
    up_state = up.state_dict()
    assert all(torch.equal(up_state[k], v) for k, v in model.state_dict().items())
    assert sorted(k for k in up_state if not k.startswith("audio_vae.")) == sorted(model.state_dict())
    for dtype in (torch.float32, torch.bfloat16):
        model = from_pretrained(runs[0], dtype=dtype)
        speech = model.generate("hello", max_len=3, inference_timesteps=2, seed=0)
        assert speech.audio[0].dtype == torch.float32 and np.isfinite(speech.audio[0].numpy()).all()


def test_save_pretrained_bf16_matches_upstream_layout(pair, tmp_path, tokenizer):
    ours, _, _ = pair
    save_pretrained(ours, ours.audio_vae, tokenizer, tmp_path)  # default: bf16 like upstream
    state = load_file(str(tmp_path / "model.safetensors"))
    assert {v.dtype for v in state.values()} == {torch.bfloat16}
    assert {v.dtype for v in load_file(str(tmp_path / "audiovae.safetensors")).values()} <= {
        torch.float32, torch.int32}
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert from_pretrained(tmp_path).state_dict().keys() == ours.state_dict().keys()


def test_missing_checkpoint_files_name_the_directory(tmp_path):
    with pytest.raises(StepError, match="no config.json"):
        from_pretrained(tmp_path)
    Path(tmp_path / "config.json").write_text(json.dumps(CONFIGS["mha-p3-no-rope"].to_dict()))
    with pytest.raises(StepError, match="no model weights"):
        from_pretrained(tmp_path)


def test_meta_build_draws_no_random_numbers_and_imports_no_compiler():
    """memory.on_meta: the model and its VAE as CPU builds them (names, shapes, dtypes), without torch's
    Python meta references for normal_/randn/norm, whose first call imports torch._dynamo and sympy (1-2 s
    of every evaluate, serve and synthesize start); a factory given another device still draws."""
    code = """
import sys, torch
from voxpipe.model.audiovae import AudioVAE
from voxpipe.model.config import preset
from voxpipe.model.memory import on_meta
from voxpipe.model.voxcpm2 import VoxCPM2
config = preset("tiny")
with on_meta():
    model, vae = VoxCPM2(config), AudioVAE(config.audio_vae_config)
    drawn = torch.randn(3, device="cpu")
assert drawn.device.type == "cpu" and drawn.abs().sum() > 0
for built, plain in ((model, VoxCPM2(config)), (vae, AudioVAE(config.audio_vae_config))):
    shapes = {k: (v.shape, v.dtype) for k, v in plain.state_dict().items()}
    assert {k: (v.shape, v.dtype) for k, v in built.state_dict().items()} == shapes
    assert all(v.is_meta for v in built.state_dict().values())
print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
