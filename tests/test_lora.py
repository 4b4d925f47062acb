"""LoRA on the tiny VoxCPM2: only adapters train, upstream loads the export, merging is exact."""

from __future__ import annotations

import copy
import gc
import json
import weakref

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from upstream import import_upstream

from voxpipe.errors import StepError
from voxpipe.model.config import AUDIO_END_ID, AUDIO_START_ID, preset
from voxpipe.model.io import from_pretrained, save_pretrained
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.params import load_params
from voxpipe.steps.model import ModelParams
from voxpipe.steps.train import LoraParams
from voxpipe.train.init_model import init_model
from voxpipe.train.lora import (
    LORA_CONFIG,
    LORA_WEIGHTS,
    LoraLinear,
    apply_lora,
    export_lora,
    lora_state_dict,
    merge_lora,
    merge_lora_state_dict,
    reset_lora_parameters,
)

# every target group on, so LM, DiT and projection adapters all cross the upstream boundary
PARAMS = LoraParams(enabled=True, r=4, alpha=8, dropout=0.1, target_proj=True)


def make_batch(cfg, seed: int = 0) -> dict[str, torch.Tensor]:
    """Two rows in upstream's packer layout [text, 101, audio patches, 102], right-padded."""
    g = torch.Generator().manual_seed(seed)
    p, d = cfg.patch_size, cfg.feat_dim
    rows = []
    for n_text, n_audio in ((5, 6), (3, 4)):
        text = torch.randint(200, cfg.lm_config.vocab_size, (n_text,), generator=g).tolist()
        tokens = text + [AUDIO_START_ID] + [0] * n_audio + [AUDIO_END_ID]
        n_lead = n_text + 1
        audio = torch.zeros(len(tokens), p, d)
        audio[n_lead : n_lead + n_audio] = torch.randn(n_audio, p, d, generator=g)
        audio_mask = [0] * n_lead + [1] * n_audio + [0]
        labels = [0] * len(tokens)
        labels[n_lead + n_audio - 1] = 1  # stop on the last target patch
        rows.append((tokens, audio, audio_mask, labels))
    t = max(len(r[0]) for r in rows)
    batch = {k: torch.zeros(len(rows), t, dtype=torch.long) for k in ("text_tokens", "audio_mask", "labels")}
    batch["text_mask"] = torch.zeros(len(rows), t, dtype=torch.long)
    batch["audio_feats"] = torch.zeros(len(rows), t, p, d)
    for i, (tokens, audio, audio_mask, labels) in enumerate(rows):
        n = len(tokens)
        batch["text_tokens"][i, :n] = torch.tensor(tokens)
        batch["audio_mask"][i, :n] = torch.tensor(audio_mask)
        batch["text_mask"][i, :n] = 1 - torch.tensor(audio_mask)
        batch["labels"][i, :n] = torch.tensor(labels)
        batch["audio_feats"][i, :n] = audio
    batch["loss_mask"] = batch["audio_mask"].clone()
    batch["position_ids"] = torch.arange(t).expand(len(rows), t).clone()
    return batch


ORDER = ("text_tokens", "text_mask", "audio_feats", "audio_mask", "loss_mask", "position_ids", "labels")


def losses(model, batch, seed: int) -> torch.Tensor:
    """Both losses with the flow-matching draws seeded (upstream and ours draw in the same order)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model(*(batch[k] for k in ORDER))
    return torch.stack([out["loss/diff"].float(), out["loss/stop"].float()])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny base checkpoint, and the same model after LoRA training on a real batch."""
    base_dir = tmp_path_factory.mktemp("base")
    init_model(ModelParams(out=str(base_dir), dtype="float32"))
    model = from_pretrained(base_dir)
    batch = make_batch(model.config)
    model.eval()
    before = losses(model, batch, seed=1)

    names = apply_lora(model, PARAMS)
    model.eval()
    after_apply = losses(model, batch, seed=1)
    base = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    initial = lora_state_dict(model)

    torch.manual_seed(0)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        out = model(*(batch[k] for k in ORDER))
        (out["loss/diff"] + out["loss/stop"]).backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    return {
        "base_dir": base_dir,
        "model": model,
        "batch": batch,
        "names": names,
        "before": before,
        "after_apply": after_apply,
        "base": base,
        "initial": initial,
    }


def test_adapters_are_the_only_trainable_parameters(trained):
    model = trained["model"]
    names = trained["names"]
    assert names == [n for n, p in model.named_parameters() if p.requires_grad]
    cfg = model.config
    layers = cfg.lm_config.num_hidden_layers + cfg.residual_lm_num_layers + cfg.dit_config.num_layers
    assert len(names) == 2 * (4 * layers + 4)  # q/k/v/o per attention layer + 4 projections, A and B each
    assert all(n.endswith((".lora_A", ".lora_B")) for n in names)
    assert not any(n.startswith("feat_encoder.") for n in names)  # upstream leaves the local encoder alone
    # the base keys are untouched: the LoRA model's state dict is the checkpoint's plus the adapters
    ckpt_keys = set(load_file(str(trained["base_dir"] / "model.safetensors")))
    assert set(model.state_dict()) == ckpt_keys | set(names)


def test_fresh_adapters_leave_outputs_unchanged(trained):
    torch.testing.assert_close(trained["after_apply"], trained["before"], rtol=0, atol=0)


def test_training_changes_only_adapters(trained):
    model = trained["model"]
    state = model.state_dict()
    for key, value in trained["base"].items():
        assert torch.equal(state[key], value), f"base weight {key} changed"
    now = lora_state_dict(model)
    unchanged = [k for k, v in trained["initial"].items() if torch.equal(now[k], v)]
    assert not unchanged, f"adapters that did not train: {unchanged}"


def _upstream_model(path, lora_config=None):
    import_upstream()
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    return VoxCPM2Model.from_local(
        str(path), optimize=False, training=False, device="cpu", lora_config=lora_config
    ).eval()


def test_export_loads_into_upstream_with_equal_outputs(trained, tmp_path):
    model, batch = trained["model"], trained["batch"]
    export_lora(model, PARAMS, tmp_path, base_model=str(trained["base_dir"]))
    info = json.loads((tmp_path / LORA_CONFIG).read_text())
    assert info["base_model"] == str(trained["base_dir"])

    import_upstream()
    from voxcpm.model.voxcpm2 import LoRAConfig

    upstream = _upstream_model(trained["base_dir"], LoRAConfig(**info["lora_config"]))
    loaded, skipped = upstream.load_lora_weights(str(tmp_path), device="cpu")
    assert skipped == []
    assert sorted(loaded) == sorted(n for n, _ in upstream.named_parameters() if "lora_" in n)
    assert sorted(loaded) == sorted(load_file(str(tmp_path / LORA_WEIGHTS)))

    for seed in (3, 4):
        torch.testing.assert_close(
            losses(upstream, batch, seed), losses(model, batch, seed), rtol=0, atol=1e-5
        )
    # the stacks carrying adapters, compared tensor by tensor
    x = torch.randn(2, 7, model.config.lm_config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(
            upstream.base_lm(x, is_causal=True)[0], model.base_lm(x), rtol=0, atol=1e-5
        )
        dit = model.config.dit_config.hidden_dim
        args = (torch.randn(3, 64, 4), torch.randn(3, 2 * dit), torch.rand(3), torch.randn(3, 64, 4))
        dt = torch.zeros(3)
        torch.testing.assert_close(
            upstream.feat_decoder.estimator(*args, dt=dt),
            model.feat_decoder.estimator(*args, dt=dt),
            rtol=0,
            atol=1e-5,
        )


def test_merged_export_is_a_plain_checkpoint(trained, tmp_path):
    model, batch = trained["model"], trained["batch"]
    want = [losses(model, batch, seed) for seed in (5, 6)]
    from_state = merge_lora_state_dict(model.state_dict(), PARAMS)

    merged = copy.deepcopy(model)
    merged.attach(model.audio_vae, model.tokenizer)
    assert merge_lora(merged) == len(trained["names"]) // 2
    assert not any(isinstance(m, LoraLinear) for m in merged.modules())
    assert from_state.keys() == merged.state_dict().keys()
    for key, value in merged.state_dict().items():
        assert torch.equal(from_state[key], value), key

    save_pretrained(merged, model.audio_vae, model.tokenizer, tmp_path, dtype=torch.float32)
    ours = from_pretrained(tmp_path).eval()  # strict: any extra or missing key fails here
    upstream = _upstream_model(tmp_path)
    saved = set(load_file(str(tmp_path / "model.safetensors")))
    assert saved == {k for k in upstream.state_dict() if not k.startswith("audio_vae.")}
    for seed, expected in zip((5, 6), want, strict=True):
        torch.testing.assert_close(losses(ours, batch, seed), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(losses(upstream, batch, seed), expected, rtol=0, atol=1e-5)


def test_the_merge_folds_each_weight_in_place_and_holds_no_second_model():
    """The export's host memory is the checkpoint once (voxpipe plan's export figure): each base
    weight is let go as its folded copy is made."""
    model = VoxCPM2(preset("tiny"))
    apply_lora(model, PARAMS)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    adapted = [k.removesuffix(".lora_A") + ".weight" for k in state if k.endswith(".lora_A")]
    originals = [weakref.ref(state[k]) for k in adapted]
    merged = merge_lora_state_dict(state, PARAMS)
    assert merged is state
    assert adapted and not any(k.endswith((".lora_A", ".lora_B")) for k in merged)
    gc.collect()
    assert [k for k, ref in zip(adapted, originals, strict=True) if ref() is not None] == []


def test_meta_build_then_reset_is_reproducible():
    """The trainer's path: build on meta, apply, materialise, reset from a seed; wrappers don't matter."""
    cfg = preset("tiny")
    params = LoraParams(enabled=True, r=4, alpha=8)

    def build(meta: bool, wrap: bool) -> VoxCPM2:
        with torch.device("meta" if meta else "cpu"):
            model = VoxCPM2(cfg)
        apply_lora(model, params)
        if wrap:
            apply_activation_checkpointing(model, check_fn=lambda m: m in model.layers_to_shard())
        if meta:
            model.to_empty(device="cpu")
        reset_lora_parameters(model, seed=7)
        return model

    ref = lora_state_dict(build(meta=False, wrap=False))
    for meta, wrap in ((True, False), (True, True)):
        model = build(meta, wrap)
        assert any("_checkpoint_wrapped_module" in n for n, _ in model.named_parameters()) == wrap
        got = lora_state_dict(model)
        assert got.keys() == ref.keys()
        for key, value in got.items():
            assert torch.equal(value, ref[key]), key
    assert all(not v.any() for k, v in ref.items() if k.endswith("lora_B"))
    a_values = [v for k, v in ref.items() if k.endswith("lora_A")]
    assert all(v.abs().sum() > 0 for v in a_values)
    assert not torch.equal(a_values[0], a_values[1])  # each layer draws its own values
    other = build(meta=False, wrap=False)
    reset_lora_parameters(other, seed=8)
    assert not torch.equal(lora_state_dict(other)[next(iter(ref))], ref[next(iter(ref))])


def test_bad_requests_fail_clearly():
    model = VoxCPM2(preset("tiny"))
    with pytest.raises(StepError, match="selects no layers"):
        apply_lora(model, LoraParams(enabled=True, target_lm=False, target_dit=False))
    with pytest.raises(ValueError, match="no LoRA adapters"):
        lora_state_dict(model)
    apply_lora(model, LoraParams(enabled=True))
    with pytest.raises(ValueError, match="already applied"):
        apply_lora(model, LoraParams(enabled=True))
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("q_proj.lora_B")}
    with pytest.raises(ValueError, match="partner"):
        merge_lora_state_dict(state, LoraParams(enabled=True))


def test_lora_defaults_follow_upstreams_recipe_unless_set(tmp_path):
    """lr 1e-4 and alpha = r with LoRA on, unless given (in params.yaml, --set or a flag)."""
    empty = tmp_path / "params.yaml"  # the schema's defaults, not the demo's params.yaml
    empty.write_text("{}\n")
    on = load_params(str(empty), ["train.lora.enabled=true", "train.lora.r=8"]).train
    assert (on.lr, on.lora.alpha, on.lora.r) == (1e-4, 8, 8)
    off = load_params(str(empty), []).train
    assert off.lr == 1e-5 and not off.lora.enabled
    pinned = load_params(str(empty), ["train.lora.enabled=true", "train.lr=3e-5", "train.lora.alpha=4"]).train
    assert (pinned.lr, pinned.lora.alpha) == (3e-5, 4)
    flagged = load_params(str(empty), [], {"train.lora.enabled": True, "train.lr": 2e-4}).train
    assert flagged.lr == 2e-4
    # the resolved values are what the run records (the train report's params)
    assert on.model_dump()["lr"] == 1e-4 and on.model_dump()["lora"]["alpha"] == 8


def test_target_modules_are_configurable_and_recorded(tmp_path):
    model = VoxCPM2(preset("tiny"))
    params = LoraParams(enabled=True, r=2, target_dit=False, target_modules_lm=["gate_proj", "down_proj"])
    names = apply_lora(model, params)
    wrapped = {n.rsplit(".", 2)[-2] for n in names}
    assert wrapped == {"gate_proj", "down_proj"}
    assert all(n.startswith(("base_lm.", "residual_lm.")) for n in names)
    export_lora(model, params, tmp_path)
    config = json.loads((tmp_path / LORA_CONFIG).read_text())["lora_config"]
    assert config["target_modules_lm"] == ["gate_proj", "down_proj"] and config["alpha"] == 2
    with pytest.raises(StepError, match=r"train.lora.target_modules_dit: qproj name no nn.Linear"):
        apply_lora(VoxCPM2(preset("tiny")), LoraParams(enabled=True, target_modules_dit=["q_proj", "qproj"]))


def test_fsdp2_sharded_adapters_match_unsharded():
    """Under fully_shard the adapters are DTensors: reset and export must give the unsharded values."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cfg = preset("tiny")
        with torch.device("meta"):
            model = VoxCPM2(cfg)
        names = apply_lora(model, PARAMS)
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.layers_to_shard():
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        reset_lora_parameters(model, seed=7)
        assert all(isinstance(p, DTensor) for _, p in model.named_parameters())
        sharded = lora_state_dict(model)

        plain = VoxCPM2(cfg)
        apply_lora(plain, PARAMS)
        reset_lora_parameters(plain, seed=7)
        expected = lora_state_dict(plain)
        assert sharded.keys() == expected.keys()
        for key, value in sharded.items():
            assert torch.equal(value, expected[key]), key

        out = model(*(make_batch(cfg)[k] for k in ORDER))
        (out["loss/diff"] + out["loss/stop"]).backward()
        assert sorted(n for n, p in model.named_parameters() if p.grad is not None) == sorted(names)
    finally:
        dist.destroy_process_group()


def _bf16_step(base_dir, frozen_in_compute_dtype: bool, rt) -> tuple[dict, dict[str, torch.Tensor]]:
    """One forward/backward of the sharded LoRA model in bf16: (losses, full adapter gradients)."""
    from voxpipe.train import fsdp

    cfg = preset("tiny")
    params = LoraParams(enabled=True, r=4, alpha=8, target_proj=True)
    if frozen_in_compute_dtype:
        model = fsdp.prepare_model(cfg, torch.bfloat16, params)
    else:  # the former path: fp32 masters of the frozen base, cast to bf16 by FSDP2 for compute
        with torch.device("meta"):
            model = VoxCPM2(cfg)
        apply_lora(model, params)
    fsdp.shard_model(model, rt, torch.bfloat16, activation_checkpointing=True)
    model.to_empty(device="cpu")
    fsdp.load_base_weights(model, base_dir, rt)
    reset_lora_parameters(model, seed=3)
    with torch.no_grad():  # B starts at zero; give it values so the gradients reach A too
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.copy_(torch.full_like(p, 0.01))
    frozen = {p.dtype for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == ({torch.bfloat16} if frozen_in_compute_dtype else {torch.float32})
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    out = model(*(make_batch(cfg)[k] for k in ORDER), generator=torch.Generator().manual_seed(0))
    (out["loss/diff"] + out["loss/stop"]).backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
    return {k: float(v.detach()) for k, v in out.items()}, grads


@pytest.mark.parametrize("checkpoint_dtype", [torch.float32, torch.bfloat16])
def test_frozen_base_in_bf16_trains_exactly_like_fp32_masters(tmp_path, checkpoint_dtype):
    """Keeping LoRA's frozen base in bf16 halves its memory and changes nothing the step computes:
    FSDP2 cast the fp32 masters to bf16 for every forward anyway, and round-to-nearest of the same
    checkpoint value gives the same bf16 value whether done at load or at each all-gather. So the
    losses and the adapters' gradients are bit-identical (the tolerance is zero)."""
    from safetensors.torch import save_file

    from voxpipe.train.device import Runtime

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    torch.manual_seed(0)
    state = {k: v.to(checkpoint_dtype).contiguous() for k, v in VoxCPM2(preset("tiny")).state_dict().items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rt = Runtime(torch.device("cpu"), 0, 1, init_device_mesh("cpu", (1,)))
        new_loss, new_grads = _bf16_step(tmp_path, True, rt)
        old_loss, old_grads = _bf16_step(tmp_path, False, rt)
    finally:
        dist.destroy_process_group()
    assert new_loss == old_loss
    assert new_grads.keys() == old_grads.keys() and new_grads
    for name, grad in new_grads.items():
        assert torch.equal(grad, old_grads[name]), name
