"""Our model blocks against upstream voxcpm 2.0.3's modules: same random weights, fp32, CPU.

Each block is loaded strictly in both directions (upstream weights into ours, ours into
upstream) and must compute the same numbers; the flow-matching loss and the Euler sampler must
also consume the global RNG exactly like upstream so equal seeds give equal results.
"""

from __future__ import annotations

import json

import pytest
import torch
from upstream import import_upstream

from voxpipe.errors import StepError
from voxpipe.model.cfm import ConditionalFlowMatching
from voxpipe.model.config import CfmConfig, MiniCPM4Config, RopeScalingConfig, VoxCPM2Config, preset
from voxpipe.model.fsq import ScalarQuantizer
from voxpipe.model.locdit import LocalDiT
from voxpipe.model.locenc import LocalEncoder
from voxpipe.model.minicpm import MiniCPMModel, rope_cos_sin

ATOL = 1e-5


@pytest.fixture(scope="module")
def up():
    import_upstream()
    from voxcpm.modules import layers, locdit, locenc, minicpm4

    return {"minicpm4": minicpm4, "locdit": locdit, "locenc": locenc, "layers": layers}


def stack_config(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int | None,
    rope: bool = True,
    mup: bool = False,
    long: bool = False,
    vocab: int = 0,
    seed: int = 0,
) -> MiniCPM4Config:
    dim = head_dim or hidden // heads
    g = torch.Generator().manual_seed(seed)
    factors = (1 + 20 * torch.rand(2, dim // 2, generator=g)).tolist()
    return MiniCPM4Config(
        bos_token_id=1,
        eos_token_id=2,
        hidden_size=hidden,
        intermediate_size=2 * hidden + 8,
        max_position_embeddings=4096 if long else 512,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5,
        rope_scaling=RopeScalingConfig(
            type="longrope",
            long_factor=factors[0],
            short_factor=factors[1],
            original_max_position_embeddings=512,
        ),
        vocab_size=vocab,
        use_mup=mup,
        scale_emb=12,
        dim_model_base=256,
        scale_depth=1.4,
        rope_theta=10000.0,
        kv_channels=head_dim,
        no_rope=not rope,
    )


STACKS = {
    "1L-gqa2-rope": stack_config(1, 32, 2, 1, 16),
    "2L-gqa2-mup-longrope": stack_config(2, 48, 4, 2, 8, mup=True, long=True, seed=1),
    "3L-mha-norope-mup": stack_config(3, 40, 4, 4, 10, rope=False, mup=True, seed=2),
    "2L-gqa3-headdim-from-hidden": stack_config(2, 48, 6, 2, None, seed=3),
}


def upstream_config(up, config: MiniCPM4Config):
    return up["minicpm4"].MiniCPM4Config.model_validate(config.to_dict())


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)
    return module


def twin(
    ours: torch.nn.Module, theirs: torch.nn.Module, seed: int = 0
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Random upstream weights loaded strictly into ours, then ours strictly back into upstream."""
    randomize(theirs, seed)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    return ours, theirs


def stacks(up, config: MiniCPM4Config):
    return twin(MiniCPMModel(config), up["minicpm4"].MiniCPMModel(upstream_config(up, config)))


# -- MiniCPM stack ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", STACKS)
@pytest.mark.parametrize("causal", [True, False])
def test_stack_forward_matches_upstream(up, name, causal):
    ours, theirs = stacks(up, STACKS[name])
    x = torch.randn(3, 7, STACKS[name].hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(
            ours(x, is_causal=causal), theirs(x, is_causal=causal)[0], atol=ATOL, rtol=0
        )


@pytest.mark.parametrize("name", ["2L-gqa2-mup-longrope", "3L-mha-norope-mup"])
@pytest.mark.parametrize("causal", [True, False])
def test_padding_mask_equals_unpadded_rows(up, name, causal):
    """A right-padded batch with a [B, T] mask gives each row what upstream gives the row alone."""
    ours, theirs = stacks(up, STACKS[name])
    lengths = [6, 3]
    x = torch.randn(2, 6, STACKS[name].hidden_size)
    mask = torch.arange(6) < torch.tensor(lengths).unsqueeze(1)
    with torch.no_grad():
        got = ours(x, is_causal=causal, attention_mask=mask)
        for row, n in enumerate(lengths):
            want = theirs(x[row : row + 1, :n], is_causal=causal)[0][0]
            torch.testing.assert_close(got[row, :n], want, atol=ATOL, rtol=0)
        assert torch.isfinite(got).all()


def test_left_padding_counts_positions_from_the_first_real_token(up):
    """Left padding: padded queries have no real key to see; they must not turn into NaN, and real
    tokens get positions 0.. as if unpadded."""
    ours, theirs = stacks(up, STACKS["2L-gqa2-mup-longrope"])
    x = torch.randn(2, 6, 48)
    mask = torch.tensor([[True] * 6, [False] * 2 + [True] * 4])
    with torch.no_grad():
        got = ours(x, attention_mask=mask)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got[1, 2:], theirs(x[1:, 2:], True)[0][0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["1L-gqa2-rope", "2L-gqa2-mup-longrope", "3L-mha-norope-mup"])
def test_kv_cache_decode_matches_full_forward(up, name):
    """Prefill a padded batch of two prompts, decode three tokens: each step's hidden state equals
    the last position of a full forward over that row's real tokens."""
    config = STACKS[name]
    ours, theirs = stacks(up, config)
    prompt_lengths, steps = [5, 2], 3
    prompt = torch.randn(2, 5, config.hidden_size)
    new = torch.randn(2, steps, config.hidden_size)
    mask = torch.arange(5) < torch.tensor(prompt_lengths).unsqueeze(1)
    cache = ours.new_cache(capacity=16)
    with torch.no_grad():
        prefill = ours(prompt, attention_mask=mask, cache=cache)
        for row, n in enumerate(prompt_lengths):
            torch.testing.assert_close(prefill[row, n - 1], theirs(prompt[row : row + 1, :n], True)[0][0, -1])
        for step in range(steps):
            got = ours(new[:, step : step + 1], cache=cache)[:, 0]
            for row, n in enumerate(prompt_lengths):
                seq = torch.cat((prompt[row, :n], new[row, : step + 1])).unsqueeze(0)
                torch.testing.assert_close(got[row], theirs(seq, True)[0][0, -1], atol=ATOL, rtol=0)
    assert cache.length == 5 + steps


def test_kv_cache_decode_matches_upstream_forward_step(up):
    config = STACKS["2L-gqa2-mup-longrope"]
    ours, theirs = stacks(up, config)
    prompt, new = torch.randn(2, 4, config.hidden_size), torch.randn(2, 3, config.hidden_size)
    cache = ours.new_cache(capacity=8)
    theirs.setup_cache(2, 8, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        ours(prompt, cache=cache)
        theirs.kv_cache.fill_caches(theirs(prompt, True)[1])
        for step in range(new.size(1)):
            got = ours(new[:, step : step + 1], cache=cache)[:, 0]
            want = theirs.forward_step(new[:, step], torch.tensor([theirs.kv_cache.step()]))
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_kv_cache_overflow_is_an_error():
    ours = MiniCPMModel(STACKS["1L-gqa2-rope"])
    cache = ours.new_cache(capacity=3)
    with pytest.raises(ValueError, match="capacity of 3"), torch.no_grad():
        ours(torch.randn(1, 4, 32), cache=cache)


def test_rope_tables_match_upstream(up):
    for config in (STACKS["1L-gqa2-rope"], STACKS["2L-gqa2-mup-longrope"]):
        rope = up["minicpm4"].model.MiniCPMLongRoPE(upstream_config(up, config))
        positions = torch.tensor([0, 1, 7, 300, 511])
        cos, sin = rope_cos_sin(config, positions)
        torch.testing.assert_close(cos, rope(positions)[0], atol=0, rtol=0)
        torch.testing.assert_close(sin, rope(positions)[1], atol=0, rtol=0)


# -- local encoder, local DiT, FSQ ------------------------------------------------------------------
LOCAL = stack_config(2, 32, 4, 2, 8, seed=4)


def test_local_encoder_matches_upstream(up):
    ours, theirs = twin(
        LocalEncoder(LOCAL, input_dim=12), up["locenc"].VoxCPMLocEnc(upstream_config(up, LOCAL), 12)
    )
    patches = torch.randn(2, 5, 4, 12)
    with torch.no_grad():
        torch.testing.assert_close(ours(patches), theirs(patches), atol=ATOL, rtol=0)


def dit_pair(up, config: MiniCPM4Config = LOCAL, channels: int = 12, seed: int = 0):
    return twin(
        LocalDiT(config, in_channels=channels),
        up["locdit"].VoxCPMLocDiTV2(upstream_config(up, config), in_channels=channels),
        seed,
    )


def test_local_dit_matches_upstream(up):
    ours, theirs = dit_pair(up)
    n = 5
    args = (
        torch.randn(n, 12, 4),
        torch.randn(n, 2 * 32),
        torch.rand(n),
        torch.randn(n, 12, 4),
        torch.rand(n),
    )
    with torch.no_grad():
        torch.testing.assert_close(ours(*args), theirs(*args), atol=ATOL, rtol=0)


@pytest.mark.parametrize("training", [True, False])
def test_fsq_matches_upstream(up, training):
    ours, theirs = twin(ScalarQuantizer(16, 24, 8, 9), up["layers"].ScalarQuantizationLayer(16, 24, 8, 9))
    ours.train(training), theirs.train(training)
    x = torch.randn(3, 5, 16, requires_grad=True)
    got, want = ours(x), theirs(x)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    if training:  # straight-through: gradients flow through the rounding in both
        (g_ours,) = torch.autograd.grad(got.square().sum(), x)
        (g_theirs,) = torch.autograd.grad(want.square().sum(), x)
        torch.testing.assert_close(g_ours, g_theirs, atol=ATOL, rtol=0)
        assert g_ours.abs().sum() > 0


# -- flow matching --------------------------------------------------------------------------------
CFM_VARIANTS = {
    "default": ({}, False, 0.0),
    "heavy-dropout": ({"training_cfg_rate": 0.5}, False, 0.0),
    "noisy-cond": ({"noise_cond_prob_range": (0.2, 0.9), "noise_cond_scale": 0.3}, False, 0.6),
    "uniform-t": ({"t_scheduler": "uniform", "training_cfg_rate": 0.0}, False, 0.0),
    "mean-mode": ({}, True, 0.5),
}


def cfm_pair(up, overrides: dict | None = None, mean_mode: bool = False, seed: int = 0):
    config = CfmConfig(**(overrides or {}))
    dit, up_dit = dit_pair(up, seed=seed)
    up_cfm = up["locdit"].CfmConfig.model_validate(config.to_dict())
    return (
        ConditionalFlowMatching(12, config, dit, mean_mode=mean_mode),
        up["locdit"].UnifiedCFM(12, up_cfm, up_dit, mean_mode=mean_mode),
    )


def cfm_batch(n: int = 8, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    x1, mu, cond = (
        torch.randn(n, 12, 4, generator=g),
        torch.randn(n, 64, generator=g),
        torch.randn(n, 12, 4, generator=g),
    )
    tgt_mask = torch.ones(n, 1, 4)
    tgt_mask[-3:] = 0  # padded rows, as a padded batch flattens to
    return x1, mu, cond, tgt_mask


@pytest.mark.parametrize("variant", CFM_VARIANTS)
def test_cfm_loss_matches_upstream_under_same_seed(up, variant):
    overrides, mean_mode, progress = CFM_VARIANTS[variant]
    ours, theirs = cfm_pair(up, overrides, mean_mode)
    x1, mu, cond, tgt_mask = cfm_batch()
    for mask, use_cond in ((tgt_mask, True), (None, False)):
        c = cond if use_cond else None
        torch.manual_seed(123)
        got = ours(x1, mu, c, mask, progress)
        after_ours = torch.rand(1)
        torch.manual_seed(123)
        want = theirs.compute_loss(x1, mu, c, mask, progress)
        assert torch.equal(torch.rand(1), after_ours), "RNG consumption differs from upstream"
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)
    grads_ours = torch.autograd.grad(got, ours.estimator.in_proj.weight)[0]
    grads_theirs = torch.autograd.grad(want, theirs.estimator.in_proj.weight)[0]
    torch.testing.assert_close(grads_ours, grads_theirs, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("mean_mode", [False, True])
def test_cfm_runs_the_dit_only_on_rows_with_loss_weight(up, mean_mode):
    """Padded/text rows are skipped; a batch with no weighted row still runs one (FSDP collectives)."""
    ours, _ = cfm_pair(up, mean_mode=mean_mode)
    seen = []
    ours.estimator.register_forward_hook(lambda _m, args, _out: seen.append(args[0].size(0)))
    x1, mu, cond, tgt_mask = cfm_batch()
    ours(x1, mu, cond, tgt_mask, 0.5)
    none = torch.zeros_like(tgt_mask)
    loss = ours(x1, mu.requires_grad_(), cond, none, 0.5)
    assert seen == [5, 1]
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(mu.grad, torch.zeros_like(mu))


def test_cfm_generator_leaves_global_rng_alone_and_repeats(up):
    ours, _ = cfm_pair(up, {"training_cfg_rate": 0.5})
    batch = cfm_batch()
    torch.manual_seed(5)
    from_global = ours(*batch)
    state = torch.get_rng_state()
    first = ours(*batch, generator=torch.Generator().manual_seed(5))
    second = ours(*batch, generator=torch.Generator().manual_seed(5))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(first, second) and torch.equal(first, from_global)
    assert not torch.equal(first, ours(*batch, generator=torch.Generator().manual_seed(6)))


def test_cfm_condition_dropout_switch(up):
    """Off = the same t and z as on, just no row dropped (so a fixed-seed eval only loses dropout)."""
    dropping, _ = cfm_pair(up, {"training_cfg_rate": 0.5})
    never, _ = cfm_pair(up, {"training_cfg_rate": 1e-12})  # draws the mask, keeps every row
    batch = cfm_batch()
    off = dropping(*batch, generator=torch.Generator().manual_seed(3), cond_dropout=False)
    on = dropping(*batch, generator=torch.Generator().manual_seed(3))
    assert torch.equal(off, never(*batch, generator=torch.Generator().manual_seed(3)))
    assert not torch.equal(off, on)


@pytest.mark.parametrize(
    ("steps", "zero_star", "cfg", "mean_mode"),
    [(10, True, 2.0, False), (10, False, 2.0, False), (50, True, 1.5, False), (6, True, 2.0, True)],
)
def test_euler_sampler_matches_upstream(up, steps, zero_star, cfg, mean_mode):
    ours, theirs = cfm_pair(up, mean_mode=mean_mode)
    mu, cond = torch.randn(3, 64), torch.randn(3, 12, 4)
    kwargs = dict(n_timesteps=steps, patch_size=4, cond=cond, temperature=0.9, cfg_value=cfg,
                  use_cfg_zero_star=zero_star)  # fmt: skip
    torch.manual_seed(11)
    got = ours.sample(mu, **kwargs)
    torch.manual_seed(11)
    want = theirs(mu, **kwargs)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)
    again = ours.sample(mu, **kwargs, generator=torch.Generator().manual_seed(11))
    assert torch.equal(again, got)


# -- dtypes ---------------------------------------------------------------------------------------
def test_bf16_parameters_with_fp32_inputs_and_loss(up):
    lm = randomize(MiniCPMModel(STACKS["2L-gqa2-mup-longrope"]), 0).to(torch.bfloat16)
    enc = randomize(LocalEncoder(LOCAL, input_dim=12), 1).to(torch.bfloat16)
    cfm, _ = cfm_pair(up)
    cfm = cfm.to(torch.bfloat16)
    x1, _, cond, tgt_mask = cfm_batch()
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    hidden = lm(torch.randn(2, 5, 48), attention_mask=mask)
    assert hidden.dtype == torch.bfloat16
    mu = torch.cat((enc(x1.transpose(1, 2).unsqueeze(0))[0], enc(cond.transpose(1, 2).unsqueeze(0))[0]), -1)
    loss = cfm(x1, mu.float(), cond, tgt_mask) + hidden.float().square().mean()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    for module in (lm, enc, cfm):
        for p in module.parameters():
            assert p.grad is not None and p.grad.dtype == torch.bfloat16 and torch.isfinite(p.grad).all()
    cache = lm.new_cache(capacity=8)
    with torch.no_grad():
        lm(torch.randn(2, 5, 48), attention_mask=mask, cache=cache)
        assert lm(torch.randn(2, 1, 48), cache=cache).dtype == torch.bfloat16
        assert cfm.sample(mu.detach()[:2], 4, 4, cond[:2]).dtype == torch.float32


def test_fp32_parameters_under_bf16_autocast(up):
    lm = randomize(MiniCPMModel(STACKS["2L-gqa2-mup-longrope"]), 0)
    enc = randomize(LocalEncoder(LOCAL, input_dim=12), 1)
    fsq = ScalarQuantizer(48, 48, 8, 9)
    cfm, _ = cfm_pair(up)
    x1, _, cond, tgt_mask = cfm_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = fsq(lm(torch.randn(2, 5, 48), attention_mask=torch.ones(2, 5, dtype=torch.bool)))
        mu = torch.cat(
            (enc(x1.transpose(1, 2).unsqueeze(0))[0], enc(cond.transpose(1, 2).unsqueeze(0))[0]), -1
        )
        loss = cfm(x1, mu, cond, tgt_mask) + hidden.float().square().mean()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    for module in (lm, enc, cfm):
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in module.parameters())
    cache = lm.new_cache(capacity=8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        lm(
            torch.randn(2, 5, 48),
            attention_mask=torch.tensor([[True] * 5, [True] * 2 + [False] * 3]),
            cache=cache,
        )
        assert torch.isfinite(lm(torch.randn(2, 1, 48), cache=cache)).all()
    assert cache.keys[0].dtype == torch.bfloat16


# -- the real shape (NPU switches: test_model_accel.py) ------------------------------------------
def test_real_shape_blocks_have_upstreams_keys_and_shapes(up):
    config = preset("voxcpm2")
    with torch.device("meta"):
        pairs = [
            (
                MiniCPMModel(config.lm_config),
                up["minicpm4"].MiniCPMModel(upstream_config(up, config.lm_config)),
            ),
            (
                MiniCPMModel(config.residual_lm_config()),
                up["minicpm4"].MiniCPMModel(upstream_config(up, config.residual_lm_config())),
            ),
            (
                LocalEncoder(config.encoder_lm_config(), config.feat_dim),
                up["locenc"].VoxCPMLocEnc(upstream_config(up, config.encoder_lm_config()), config.feat_dim),
            ),
            (
                LocalDiT(config.dit_lm_config(), config.feat_dim),
                up["locdit"].VoxCPMLocDiTV2(upstream_config(up, config.dit_lm_config()), config.feat_dim),
            ),
        ]
    for ours, theirs in pairs:
        assert {k: v.shape for k, v in ours.state_dict().items()} == {
            k: v.shape for k, v in theirs.state_dict().items()
        }
    assert sum(p.numel() for p in pairs[0][0].parameters()) == 1_471_744_000


# -- config.json ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def upstream_config_cls(up):
    from voxcpm.model.voxcpm2 import VoxCPMConfig

    return VoxCPMConfig


@pytest.mark.parametrize("name", ["tiny", "small", "voxcpm2"])
def test_config_round_trips_through_upstream(upstream_config_cls, name):
    ours = preset(name)
    theirs = upstream_config_cls.model_validate_json(ours.to_json())
    back = VoxCPM2Config.from_dict({**json.loads(theirs.model_dump_json()), "architecture": "voxcpm2"})
    assert back == ours
    assert upstream_config_cls.model_validate_json(back.to_json()) == theirs


def test_config_reads_a_sparse_upstream_file(upstream_config_cls, tmp_path):
    """Keys left out take upstream's defaults (e.g. use_mup True, kv_channels unset, 4 local layers)."""
    data = preset("tiny").to_dict()
    for key in ("use_mup", "kv_channels"):
        del data["lm_config"][key]
    del data["encoder_config"]["num_layers"], data["residual_lm_no_rope"], data["audio_vae_config"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    ours = VoxCPM2Config.from_file(path)
    assert (
        ours.lm_config.use_mup and ours.lm_config.kv_channels is None and ours.encoder_config.num_layers == 4
    )
    theirs = upstream_config_cls.model_validate_json(path.read_text())
    assert upstream_config_cls.model_validate_json(ours.to_json()) == theirs


def test_config_errors_name_the_problem(tmp_path):
    data = preset("tiny").to_dict()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, "architecture": "voxcpm"}))
    with pytest.raises(StepError, match=r"(?s)config\.json: not a valid.*architecture is 'voxcpm'"):
        VoxCPM2Config.from_file(path)
    del data["architecture"]
    with pytest.raises(StepError, match="default when the key is missing"):
        VoxCPM2Config.from_dict(data)
    broken = preset("tiny").to_dict()
    del broken["lm_config"]["hidden_size"]
    with pytest.raises(StepError, match=r"lm_config\.hidden_size\s+Field required"):
        VoxCPM2Config.from_dict(broken)
    short = preset("tiny").to_dict()
    short["lm_config"]["rope_scaling"]["long_factor"] = [1.0, 2.0]
    with pytest.raises(StepError, match="long_factor has 2 entries, head dim 32 needs 16"):
        VoxCPM2Config.from_dict(short)
    path.write_text("{not json")
    with pytest.raises(StepError, match="cannot read model config"):
        VoxCPM2Config.from_file(path)


def test_config_keeps_unknown_keys_but_warns():
    data = preset("tiny").to_dict()
    data["lm_config"]["torch_dtype"] = "bfloat16"
    with pytest.warns(UserWarning, match=r"lm_config\.torch_dtype"):
        config = VoxCPM2Config.from_dict(data)
    assert config.to_dict()["lm_config"]["torch_dtype"] == "bfloat16"
