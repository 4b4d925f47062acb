"""The accelerator fast path, proven on CPU: `model.kernels`, bf16 RoPE, work not done, one host read.

torch_npu cannot be installed here (without CANN it breaks `import torch`), so a test double
stands in for it: plain-torch reference implementations of `npu_rms_norm` and `npu_swiglu`,
put in `sys.modules` where voxpipe.model.npu imports torch_npu from. With `model.kernels: fused`
the real trainer then runs the very code an NPU runs, op by op.
"""

from __future__ import annotations

import sys
import traceback
import types
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from upstream import upstream_rows

from voxpipe.errors import StepError
from voxpipe.model.config import preset
from voxpipe.model.minicpm import MiniCPMMLP, RMSNorm, rope_cos_sin, rotate
from voxpipe.model.npu import OFF, NpuKernels, resolve_kernels
from voxpipe.model.rows import host_rows, plan_rows
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.params import Params
from voxpipe.steps.train import TrainParams
from voxpipe.train.device import distributed_runtime
from voxpipe.train.loop import Trainer
from voxpipe.train.signals import TerminationFlag


class FakeTorchNpu(types.ModuleType):
    """torch_npu's two fused ops in plain torch; each call is recorded with the module that made it."""

    def __init__(self) -> None:
        super().__init__("torch_npu")
        self.calls: list[tuple[str, str]] = []
        self.current = ""  # set by forward pre-hooks: the qualified name of the calling block

    def npu_rms_norm(self, x: torch.Tensor, gamma: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, ...]:
        self.calls.append(("npu_rms_norm", self.current))
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + epsilon)
        return (x32 * rstd).to(x.dtype) * gamma, rstd

    def npu_swiglu(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        self.calls.append(("npu_swiglu", self.current))
        first, second = x.chunk(2, dim=dim)
        return F.silu(first) * second


@pytest.fixture
def fake_npu(monkeypatch) -> FakeTorchNpu:
    fake = FakeTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    return fake


# -- model.kernels ----------------------------------------------------------------------------------
def test_auto_is_eager_off_npu_and_never_imports_torch_npu():
    assert resolve_kernels("auto", torch.device("cpu")) == OFF
    npu = types.SimpleNamespace(type="npu")  # torch.device("npu") needs torch_npu's backend
    assert resolve_kernels("eager", npu) == OFF
    assert resolve_kernels("auto", npu) == NpuKernels.all()  # on an NPU: all three
    assert "torch_npu" not in sys.modules
    assert (OFF.label, NpuKernels.all().label) == ("eager", "fused")


def test_fused_without_torch_npu_is_a_one_paragraph_error():
    with pytest.raises(StepError, match=r"model.kernels is 'fused' but torch_npu cannot be imported.*auto"):
        resolve_kernels("fused", torch.device("cpu"))


def train_one_step(encoded_sample, out: Path, kernels: str, fake: FakeTorchNpu | None = None) -> dict:
    params = Params(
        model={"base": str(encoded_sample.base_model), "kernels": kernels},
        train=TrainParams(data=str(encoded_sample.encoded), out=str(out), device="cpu", max_steps=2,
                          max_tokens=512, warmup_steps=0, lr=1e-3),
    )
    with distributed_runtime("cpu") as rt, TerminationFlag() as flag:
        trainer = Trainer(params, rt, flag)
        if fake is not None:
            for name, module in trainer.model.named_modules():
                if isinstance(module, RMSNorm | MiniCPMMLP):
                    module.register_forward_pre_hook(lambda _m, _a, name=name: setattr(fake, "current", name))
        record = trainer.train_step()
        return {"record": record, "kernels": trainer.kernels, "model": trainer.model}


def test_fused_kernels_run_in_every_layer_and_keep_the_eager_loss(encoded_sample, tmp_path, fake_npu):
    fused = train_one_step(encoded_sample, tmp_path / "fused", "fused", fake_npu)
    assert fused["kernels"] == NpuKernels.all()
    model = fused["model"]
    norms = {n for n, m in model.named_modules() if isinstance(m, RMSNorm)}
    mlps = {n for n, m in model.named_modules() if isinstance(m, MiniCPMMLP)}
    assert {n for op, n in fake_npu.calls if op == "npu_rms_norm"} == norms  # each norm of each stack
    assert {n for op, n in fake_npu.calls if op == "npu_swiglu"} == mlps  # each layer's MLP
    assert len(mlps) == sum(len(stack.layers) for stack in (
        model.base_lm, model.residual_lm, model.feat_encoder.encoder, model.feat_decoder.estimator.decoder))

    sys.modules.pop("torch_npu")  # the eager run must not touch the double
    eager = train_one_step(encoded_sample, tmp_path / "eager", "eager")
    for key in ("loss", "loss/diff", "loss/stop", "grad_norm"):
        assert fused["record"][key] == pytest.approx(eager["record"][key], rel=1e-6, abs=1e-6), key


def test_bf16_rope_stays_within_the_ports_tolerance_at_the_real_shape():
    """bf16 RoPE against fp32 at L=830, head_dim 128 (voxcpm2's LongRoPE): relative error < 1e-2."""
    config = preset("voxcpm2").lm_config
    assert config.head_dim == 128
    cos, sin = rope_cos_sin(config, torch.arange(830))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, config.num_attention_heads, 830, 128, generator=gen).bfloat16()
    k = torch.randn(4, config.num_key_value_heads, 830, 128, generator=gen).bfloat16()
    want = [rotate(x.float(), cos, sin) for x in (q, k)]  # fp32 math on the same bf16 inputs
    got = [rotate(x, cos, sin, upcast=False) for x in (q, k)]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16
        error = ((g.float() - w).norm() / w.norm()).item()
        assert 0 < error < 1e-2  # > 0: the bf16 path really ran in bf16


# -- work not done: each tower on the rows the losses read --------------------------------------------
def batch_with_references(config) -> dict[str, torch.Tensor]:
    """Rows: [103, ref, 104,] text, 101, target, 102, padding; two of three with a reference."""
    p, d = config.patch_size, config.feat_dim
    rows = ((6, 9, 5), (4, 12, 0), (5, 7, 3))  # text, target, reference patches
    width = max(t + n + (r + 2 if r else 0) + 2 for t, n, r in rows) + 2
    batch = {k: torch.zeros(3, width) for k in ("text_mask", "audio_mask", "loss_mask")}
    batch["text_tokens"] = torch.zeros(3, width, dtype=torch.long)
    batch["labels"] = torch.zeros(3, width, dtype=torch.long)
    gen = torch.Generator().manual_seed(1)
    for row, (n_text, n_target, n_ref) in enumerate(rows):
        pos = 0
        if n_ref:
            batch["text_tokens"][row, [0, n_ref + 1]] = torch.tensor([103, 104])
            batch["text_mask"][row, [0, n_ref + 1]] = 1
            batch["audio_mask"][row, 1 : n_ref + 1] = 1
            pos = n_ref + 2
        text = torch.randint(200, 1000, (n_text + 1,), generator=gen)  # text ids, then 101's place
        batch["text_tokens"][row, pos : pos + n_text + 1] = text
        batch["text_mask"][row, pos : pos + n_text + 1] = 1
        pos += n_text + 1
        batch["audio_mask"][row, pos : pos + n_target] = 1
        batch["loss_mask"][row, pos : pos + n_target] = 1
        batch["labels"][row, pos + n_target - 1] = 1
        batch["text_tokens"][row, pos + n_target] = 102
        batch["text_mask"][row, pos + n_target] = 1
    batch["audio_feats"] = torch.randn(3, width, p, d, generator=gen) * batch["audio_mask"][..., None, None]
    batch["position_ids"] = torch.arange(width).expand(3, width)
    return batch


def test_each_tower_computes_only_what_the_losses_read_with_the_same_losses_grads_and_draws():
    config = preset("tiny")
    torch.manual_seed(0)
    model = VoxCPM2(config)
    batch = batch_with_references(config)
    b, t = batch["text_tokens"].shape
    seen = {"encoder": [], "base_lm": [], "residual_lm": [], "dit": []}
    for name, module in (("encoder", model.feat_encoder), ("base_lm", model.base_lm),
                         ("residual_lm", model.residual_lm), ("dit", model.feat_decoder.estimator.decoder)):
        module.register_forward_hook(lambda _m, _a, out, name=name: seen[name].append(out.shape[:-1].numel()))

    def run(**rows) -> tuple[dict, list[torch.Tensor], torch.Tensor]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        out = model(**batch, **rows)
        (out["loss/diff"] + out["loss/stop"]).backward()
        return out, [p.grad.clone() for p in model.parameters() if p.grad is not None], torch.get_rng_state()

    every, every_grad, every_rng = run(**upstream_rows(batch))
    planned, planned_grad, planned_rng = run()
    host, _, host_rng = run(**host_rows(batch))  # the trainer's way: planned on the host
    plan = plan_rows(batch["audio_mask"], batch["loss_mask"])
    last_loss = [int(torch.nonzero(row).max()) for row in batch["loss_mask"]]
    assert plan.lm_rows.tolist() == [r * t + i for r, last in enumerate(last_loss) for i in range(last)]
    n_loss = int(batch["loss_mask"].sum())
    # encoder: every row, then audio rows before each last loss row; its last layer reads one position each
    assert seen["encoder"][:2] == [b * t, int(batch["audio_mask"].sum()) - b]
    assert seen["base_lm"][:2] == [b * t, plan.lm_rows.numel()]
    assert seen["residual_lm"][:2] == [n_loss, n_loss]  # read only before the loss rows, both ways
    assert seen["dit"][0] == seen["dit"][1] == n_loss * config.patch_size  # the noisy patch's positions
    for key in ("loss/diff", "loss/stop"):
        assert planned[key].item() == pytest.approx(every[key].item(), rel=1e-6, abs=1e-6)
        assert host[key].item() == planned[key].item()
    assert len(planned_grad) == len(every_grad)
    for got, want in zip(planned_grad, every_grad, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(planned_rng, every_rng) and torch.equal(host_rng, every_rng)  # same draws
    with pytest.raises(ValueError, match="all five"):
        model(**batch, loss_rows=plan.loss_rows)


def test_a_batch_without_loss_rows_still_runs_every_tower_and_gives_zero_losses():
    """Every rank must run each FSDP-sharded tower (their collectives need all ranks), even on a batch
    of nothing but text."""
    config = preset("tiny")
    torch.manual_seed(0)
    model = VoxCPM2(config)
    batch = batch_with_references(config)
    batch["loss_mask"].zero_()
    plan = plan_rows(batch["audio_mask"], batch["loss_mask"])
    assert [x.numel() for x in plan] == [1, 1, 1, 1, 1] and plan.loss_prev.item() == -1
    out = model(**batch)
    (out["loss/diff"] + out["loss/stop"]).backward()
    assert out["loss/diff"].item() == 0.0 and out["loss/stop"].item() == 0.0
    assert all(p.grad is not None for p in model.feat_decoder.parameters())


# -- one device-to-host read per optimizer step ---------------------------------------------------
HOST_READS = ("item", "tolist", "cpu", "__float__", "__int__", "__bool__", "__index__", "nonzero")


def test_a_training_step_reads_the_device_once(encoded_sample, tmp_path, monkeypatch):
    """Counts every way a tensor's value reaches Python (and nonzero, whose output size must) during
    one optimizer step with grad_accum 2. AdamW's step counters are host tensors by design
    (non-capturable), so reads of those are not device syncs and are left out."""
    params = Params(
        model={"base": str(encoded_sample.base_model)},
        train=TrainParams(data=str(encoded_sample.encoded), out=str(tmp_path), device="cpu", max_steps=4,
                          max_tokens=256, grad_accum=2, warmup_steps=0),
    )
    with distributed_runtime("cpu") as rt, TerminationFlag() as flag:
        trainer = Trainer(params, rt, flag)
        trainer.train_step()  # creates the optimizer state
        host_counters = {id(s["step"]) for s in trainer.optimizer.state.values()}
        batches = iter([trainer.data.next_train_batch() for _ in range(2)])  # data loading is not counted
        monkeypatch.setattr(trainer.data, "next_train_batch", lambda: next(batches))
        reads: Counter[str] = Counter()
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(self, *args, _name=name, _original=original, **kwargs):
                if id(self) not in host_counters:
                    caller = traceback.extract_stack(limit=2)[0]
                    reads[f"{_name} at {Path(caller.filename).name}:{caller.lineno}"] += 1
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)
        nonzero = torch.nonzero

        def counted_nonzero(*args, **kwargs):
            reads["torch.nonzero"] += 1
            return nonzero(*args, **kwargs)

        monkeypatch.setattr(torch, "nonzero", counted_nonzero)
        record = trainer.train_step()
        monkeypatch.undo()
    assert sum(reads.values()) == 1, reads
    assert len(record["shapes"]) == 2 and record["loss"] > 0


def test_served_model_and_evaluation_loader_take_the_kernels_setting(encoded_sample, fake_npu):
    from voxpipe.serve.pyfunc import VoxpipeTTS

    served = VoxpipeTTS()
    context = types.SimpleNamespace(artifacts={"checkpoint": str(encoded_sample.base_model)},
                                    model_config={"device": "cpu", "kernels": "fused"})
    served.load_context(context)
    switches = {m.npu_kernels for m in served.model.modules() if hasattr(m, "npu_kernels")}
    assert switches == {NpuKernels.all()}
    context.model_config = {"device": "cpu"}  # auto: eager off an NPU
    served.load_context(context)
    assert {m.npu_kernels for m in served.model.modules() if hasattr(m, "npu_kernels")} == {OFF}
