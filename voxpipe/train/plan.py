"""`voxpipe plan`: will a training configuration fit, per device, before any hardware is rented.

The plan runs voxpipe's own model, built and sharded exactly as train builds it
(`prepare_model` + `shard_model`), through a steady-state optimizer step (AdamW's moments already
there) of the longest micro-batch that `train.max_tokens` allows, on fake tensors
(`FakeTensorMode`: shapes and dtypes, no memory) in a fake process group of the planned world
size. torch's `FSDPMemTracker` counts every tensor alive
on rank 0 by category; the peak is the plan. The optimizer is AdamW with `foreach=False`, which
holds what the accelerators' fused AdamW holds (two moments, no list-wide temporaries); the CPU's
foreach AdamW would add ~10x params of temporaries that no accelerator run has.

Categories (the tracker's, grouped): params = the sharded parameters; gradients = sharded and
unsharded gradients; optimizer = AdamW state; activations = saved activations and the backward's
temporaries; other = the all-gathered (unsharded) parameters, communication buffers and inputs;
ema = the EMA copy of the trainable parameters' shards (train.ema_decay; 0 when off), counted on the meta
model rather than traced: it is alive through the whole step, so it adds to the peak as it is.

Cost: fake tensors cost per op, not per byte, so a plan of the real shape (60 blocks) takes
minutes on a small CPU whatever the memory it describes. Each plan is kept on disk, keyed by its
setup and a fingerprint of the model and sharding code (`cache_dir`), so the same question is
answered once. (Planning a 1- and 2-block model and scaling per-block costs was tried and is not
used: the peak moves between phases as blocks are added, so it underestimated gradients and
activations by up to 90 % on `small`.)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from voxpipe.accelerators import DEVICE_MEMORY_GIB
from voxpipe.data.token_budget import TokenBudget
from voxpipe.errors import StepError
from voxpipe.files import atomic_write_text
from voxpipe.model.audiovae import AudioVAE
from voxpipe.model.config import VoxCPM2Config, preset
from voxpipe.model.memory import available_bytes, on_meta
from voxpipe.model.rows import host_rows
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.params import Params
from voxpipe.steps.train import LoraParams
from voxpipe.train.device import Runtime
from voxpipe.train.fsdp import DTYPES, prepare_model, shard_model
from voxpipe.voxcpm2_format import CONFIG, is_checkpoint

GIB = 2**30
CATEGORIES = ("params", "gradients", "optimizer", "activations", "other")
_TRACKER_CATEGORY = {
    "Sharded Param": "params",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "OptState": "optimizer",
    "Activation": "activations",
    "Temp": "activations",
    "Unsharded Param": "other",
    "All Gather": "other",
    "Reduce Scatter": "other",
    "Buffer": "other",
    "Inputs": "other",
}
STACKS = ("lm", "residual", "encoder", "dit")


@dataclass(frozen=True)
class Setup:
    """What the memory of one training configuration depends on."""

    config: VoxCPM2Config
    world_size: int
    lora: LoraParams
    activation_checkpointing: bool
    dtype: str  # "float32" | "bfloat16": the compute dtype
    max_tokens: int
    ema: bool = False  # train.ema_decay > 0: a copy of the trainable shards (voxpipe/train/ema.py)

    def micro_batch(self) -> tuple[int, int]:
        """(rows, positions) of the largest micro-batch train.max_tokens allows (TokenBudget), a row at
        most config.max_length long (collate cuts it there)."""
        return TokenBudget(self.max_tokens).largest_batch(self.config.max_length)

    def with_max_tokens(self, max_tokens: int) -> Setup:
        return Setup(self.config, self.world_size, self.lora, self.activation_checkpointing, self.dtype,
                     max_tokens, self.ema)


@dataclass
class Plan:
    world_size: int
    device: str
    device_memory_gib: float
    peak_gib: float
    by_category_gib: dict[str, float]
    fits: bool
    largest_max_tokens: int | None  # None: not even the shortest micro-batch fits
    host_peak_gib: float  # rank 0's host memory at its largest: its phases below, and on the CPU the step
    host_by_phase_gib: dict[str, float]  # "load" and "export"; on the CPU each includes the model
    max_tokens: int
    micro_batch: list[int]  # [rows, positions]
    headroom: float
    checkpoint_gib_per_rank: float  # what one rank writes in a DCP checkpoint (checkpoint_bytes_per_rank)
    checkpoint_write_gbps: float  # plan.checkpoint_write_gbps: the write bandwidth of one rank, GB/s
    checkpoint_save_seconds: float  # the first over the second: launch.grace_seconds: auto's core

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def summary(self) -> str:
        usable = self.device_memory_gib * (1 - self.headroom)
        rows, length = self.micro_batch
        cats = ", ".join(f"{k} {v:.2f}" for k, v in self.by_category_gib.items())
        verdict = "fits" if self.fits else "does NOT fit"
        largest = ("none: not even 1 position fits" if self.largest_max_tokens is None
                   else str(self.largest_max_tokens))
        return (
            f"plan: peak {self.peak_gib:.2f} GiB per device ({cats}) for a micro-batch of {rows} x {length} "
            f"(train.max_tokens {self.max_tokens}), world of {self.world_size}; {self.device} has "
            f"{self.device_memory_gib:.1f} GiB, {usable:.1f} GiB usable with {self.headroom:.0%} headroom: "
            f"{verdict}. Largest train.max_tokens that fits: {largest}. Host peak on rank 0: "
            f"{self.host_peak_gib:.2f} GiB (loading {self.host_by_phase_gib['load']:.2f}, exporting "
            f"{self.host_by_phase_gib['export']:.2f}). Checkpoint per rank: "
            f"{self.checkpoint_gib_per_rank:.2f} GiB, {self.checkpoint_save_seconds:.0f} s at "
            f"{self.checkpoint_write_gbps:g} GB/s (plan.checkpoint_write_gbps)"
        )


# -- the fake world -------------------------------------------------------------------------------
@contextmanager
def fake_world(world_size: int):
    """A process group of `world_size` fake ranks (collectives return at once) and its 1-D CPU mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise StepError("voxpipe plan needs a process of its own (a process group is already initialised)")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
        yield Runtime(torch.device("cpu"), 0, world_size, mesh)
    finally:
        dist.destroy_process_group()


def synthetic_batch(config: VoxCPM2Config, rows: int, length: int) -> dict[str, torch.Tensor]:
    """Right-padded rows shaped like encoded data: a quarter text + audio_start, then target patches."""
    p, d = config.patch_size, config.feat_dim
    text_mask = torch.zeros(rows, length)
    audio_mask = torch.zeros(rows, length)
    labels = torch.zeros(rows, length, dtype=torch.long)
    text = length // 4
    text_mask[:, : text + 1] = 1
    audio_mask[:, text + 1 :] = 1
    labels[:, -1] = 1
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(110, config.lm_config.vocab_size, (rows, length), generator=gen) * text_mask.long()
    return {
        "text_tokens": tokens,
        "text_mask": text_mask,
        "audio_feats": torch.randn(rows, length, p, d, generator=gen) * audio_mask[..., None, None],
        "audio_mask": audio_mask,
        "loss_mask": audio_mask,
        "position_ids": torch.arange(length).expand(rows, length),
        "labels": labels,
    }


def optimizer_for(model: nn.Module, fused_like: bool = True) -> torch.optim.AdamW:
    """AdamW over the trainable parameters as train groups them; foreach=False holds what fused holds."""
    decay = [q for q in model.parameters() if q.requires_grad and q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.requires_grad and q.dim() < 2]
    groups = [g for g in ({"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0})
              if g["params"]]
    return torch.optim.AdamW(groups, lr=1e-4, foreach=not fused_like)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    """What train does per optimizer step (one micro-batch): forward, backward, clip, AdamW, zero."""
    out = model(**batch, progress=0.0)
    (out["loss/diff"] + out["loss/stop"]).backward()
    params = [q for q in model.parameters() if q.grad is not None]
    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def init_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """AdamW's moments as after a first step (zero gradients, lr 0), so one tracked step shows the
    steady state: the moments alive through forward and backward, as from the second step on."""
    for q in model.parameters():
        if q.requires_grad:
            q.grad = torch.zeros_like(q)
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs, strict=True):
        g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


def by_category(snapshot: dict[str, int]) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for name, nbytes in snapshot.items():
        if name in _TRACKER_CATEGORY:
            out[_TRACKER_CATEGORY[name]] += nbytes
    return out


def rank_peak_tracker(model: nn.Module, optimizer: torch.optim.Optimizer):
    """torch's FSDPMemTracker, keeping only the rank's peak, which is all the plan reads. Its per-module
    peaks walk every tracked module after each op: 30 % of a real-shape plan's time (cProfile, 2.13)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    class RankPeakTracker(FSDPMemTracker):
        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(snap)

    return RankPeakTracker(model, optimizer)


def tracked_peak(setup: Setup, rt: Runtime, *, fake: bool) -> dict[str, int]:
    """Bytes by category at rank 0's peak over one steady-state optimizer step, in the world of `rt`.

    fake=True: on fake tensors (the plan); fake=False: real tensors on the CPU (the validation).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype = DTYPES[setup.dtype]
    rows, length = setup.micro_batch()
    host = synthetic_batch(setup.config, rows, length)
    batch = {**host, **host_rows(host)}  # found on real tensors, before fake mode
    torch.manual_seed(0)
    model = prepare_model(setup.config, dtype, setup.lora)
    shard_model(model, rt, dtype, setup.activation_checkpointing)
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    with mode if mode is not None else _nothing():
        model.to_empty(device="cpu")
        if not fake:
            _init_real(model)
        optimizer = optimizer_for(model)
        init_optimizer_state(model, optimizer)
        tracker = rank_peak_tracker(model, optimizer)
        tracker.track_inputs((batch,))
        with tracker:
            train_step(model, optimizer, batch)
        snap = tracker.get_tracker_snapshot("peak")
    per_device = next(iter(snap.values()))
    return by_category(per_device)


@contextmanager
def _nothing():
    yield


def _init_real(model: nn.Module) -> None:
    """Small random weights for a real-tensor run (to_empty leaves garbage that could overflow)."""
    with torch.no_grad():
        for q in model.parameters():
            q.normal_(0.0, 0.02)


# -- planning, once per shape ------------------------------------------------------------------
def fake_peak(setup: Setup) -> dict[str, int]:
    """The planned bytes by category at rank 0's peak (the whole model, on fake tensors)."""
    return _fake_peak_of(setup)


_CACHE: dict[str, dict[str, int]] = {}
_PACKAGE = Path(__file__).resolve().parents[1]
_CODE = ("model/*.py", "train/fsdp.py", "train/lora.py", "train/plan.py")


def _code_fingerprint() -> str:
    """What a plan depends on besides its setup: the model and sharding code, and torch."""
    digest = hashlib.sha256(torch.__version__.encode())
    for pattern in _CODE:
        for path in sorted(_PACKAGE.glob(pattern)):
            digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_dir() -> Path:
    """Plans already made, one small JSON each (VOXPIPE_PLAN_CACHE, else ~/.cache/voxpipe/plans);
    keyed by the setup and the code fingerprint, so a change to the model or sharding code replans."""
    return Path(os.environ.get("VOXPIPE_PLAN_CACHE", Path.home() / ".cache" / "voxpipe" / "plans"))


def _fake_peak_of(setup: Setup) -> dict[str, int]:
    """One fake-tensor plan, memoised in the process and on disk (the same shapes recur)."""
    key = json.dumps([setup.config.to_dict(), setup.world_size, setup.lora.model_dump(),
                      setup.activation_checkpointing, setup.dtype, setup.micro_batch(), _code_fingerprint()],
                     sort_keys=True)
    if key in _CACHE:
        return _CACHE[key]
    path = cache_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    try:
        _CACHE[key] = {k: int(v) for k, v in json.loads(path.read_text()).items()}
        return _CACHE[key]
    except (OSError, ValueError, AttributeError):
        pass
    with fake_world(setup.world_size) as rt:
        _CACHE[key] = tracked_peak(setup, rt, fake=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(_CACHE[key]))
    except OSError:
        pass  # a read-only home: plan again next time
    return _CACHE[key]


def host_load_bytes(setup: Setup) -> int:
    """Rank 0's extra host memory while loading: the largest base tensor, read then cast to fp32."""
    with on_meta():
        model = prepare_model(setup.config, DTYPES[setup.dtype], setup.lora)
    largest = max(q.numel() for q in model.parameters())
    return largest * (2 + 4)  # bf16 as read + the parameter's dtype (at most fp32)


def host_export_bytes(setup: Setup, export_dtype: str) -> int:
    """Rank 0's extra host memory while exporting (train/export.py).

    The checkpoint once in `export_dtype` (its file size); the VAE twice in fp32 (built, then its
    weights read); and the tensor in flight: a gathered fp32 tensor beside its cast, or with LoRA
    the fold's three fp32 terms (W, B @ A, their sum) of the largest adapted weight.
    """
    with on_meta():
        plain = VoxCPM2(setup.config)
        vae = AudioVAE(setup.config.audio_vae_config)
        trained = prepare_model(setup.config, DTYPES[setup.dtype], setup.lora) if setup.lora.enabled else None
    size = DTYPES[export_dtype].itemsize
    state = plain.state_dict()
    checkpoint = sum(t.numel() * (size if t.is_floating_point() else t.element_size())
                     for t in state.values())
    vae_bytes = 2 * sum(t.numel() * t.element_size() for t in vae.state_dict().values())
    if trained is None:
        in_flight = max(t.numel() for t in state.values()) * (4 + size)
    else:
        shapes = dict(trained.named_parameters())
        adapted = [shapes[n].shape[1] * shapes[n.removesuffix("_A") + "_B"].shape[0]
                   for n in shapes if n.endswith(".lora_A")]
        in_flight = max(adapted) * 3 * 4
    return checkpoint + vae_bytes + in_flight


def checkpoint_bytes_per_rank(setup: Setup) -> int:
    """Bytes one rank writes in a DCP checkpoint: its shard of every parameter (full fine-tune: the fp32
    master weights; LoRA: the frozen base in the compute dtype too) and of AdamW's two moments of the
    trainable ones. Counted on the meta model train builds (prepare_model), so no fake step is needed:
    the launcher sizes the grace period with it in a second. FSDP2 shards each parameter evenly."""
    model = prepare_model(setup.config, DTYPES[setup.dtype], setup.lora)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = sum(2 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return -(-(weights + moments) // setup.world_size) + ema_bytes_per_rank(setup)


def ema_bytes_per_rank(setup: Setup) -> int:
    """The EMA copy on one rank (0 without train.ema_decay): its shard of every trainable parameter, in the
    parameters' own dtype (the fp32 masters; LoRA: the adapters only). It sits in device memory beside
    them and is written into every checkpoint."""
    if not setup.ema:
        return 0
    model = prepare_model(setup.config, DTYPES[setup.dtype], setup.lora)
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return -(-trained // setup.world_size)


def checkpoint_save_seconds(setup: Setup, write_gbps: float) -> float:
    """Planned seconds for one rank to write its checkpoint at `write_gbps` GB/s (1e9 bytes)."""
    return checkpoint_bytes_per_rank(setup) / (write_gbps * 1e9)


def largest_max_tokens(setup: Setup, usable: int) -> int | None:
    """The largest train.max_tokens (a multiple of 64) whose planned peak fits `usable` bytes.

    Params, gradients and optimizer state do not depend on the micro-batch; activations and the
    rest grow linearly with its positions (FSDP2 gathers one block at a time; SDPA keeps no L x L
    matrix). So two plans, at max_tokens and at half of it, give the line, and its crossing with
    `usable` gives the answer without a search.
    """
    step = 64
    high = max(setup.max_tokens, 2 * step)
    low = high // 2
    y_high = sum(fake_peak(setup.with_max_tokens(high)).values())
    y_low = sum(fake_peak(setup.with_max_tokens(low)).values())
    slope = max((y_high - y_low) / (high - low), 1e-9)
    tokens = int((usable - y_low) / slope) + low
    tokens = min(tokens, setup.config.max_length * 64) // step * step
    return tokens if tokens >= step else None


# -- the step -------------------------------------------------------------------------------------
def model_config(params: Params) -> VoxCPM2Config:
    """model.base's config.json when it is there, else model.preset (the plan needs no weights). A
    model.base that does not exist is an error (a mistyped folder would be planned as the preset's
    model), unless plan.missing_base is preset (a recipe planned before its checkpoint is downloaded)."""
    base = Path(params.model.base)
    if not base.exists() and params.plan.missing_base == "error":
        raise StepError(
            f"model.base {params.model.base}: no such folder, so there is no model to plan. Point "
            "--model-base at the checkpoint folder (or run `voxpipe init-model` to make the default one); "
            f"to plan model.preset's shape ({params.model.preset}) before the checkpoint is there, set "
            "plan.missing_base: preset (--set plan.missing_base=preset)")
    return VoxCPM2Config.from_file(base / CONFIG) if is_checkpoint(base) else preset(params.model.preset)


def model_config_or_preset(params: Params) -> VoxCPM2Config:
    """model.base's config.json when this machine has it, else model.preset's shape: the launcher's view,
    where model.base is a path on the cluster's volume."""
    base = Path(params.model.base)
    return VoxCPM2Config.from_file(base / CONFIG) if is_checkpoint(base) else preset(params.model.preset)


def world_size(params: Params) -> int:
    if params.plan.launcher == "launch":
        return params.launch.pods * params.launch.devices_per_pod
    return params.local.nproc


def compute_dtype_name(params: Params) -> str:
    """train.dtype; auto is what train picks on the planned device (fp32 on the CPU, else bf16)."""
    if params.train.dtype != "auto":
        return params.train.dtype
    return "float32" if params.plan.device == "cpu" else "bfloat16"


def device_memory_bytes(params: Params) -> int:
    p = params.plan
    if p.device_memory_gib:
        return int(p.device_memory_gib * GIB)
    if p.device == "cpu":
        free = available_bytes(torch.device("cpu"))
        return (free or 0) // max(1, world_size(params))  # the ranks of this host share its RAM
    return int(DEVICE_MEMORY_GIB[p.device] * GIB)


def setup_of(params: Params) -> Setup:
    t = params.train
    return Setup(model_config(params), world_size(params), t.lora, t.activation_checkpointing,
                 compute_dtype_name(params), t.max_tokens, t.ema_decay > 0)


def make_plan(setup: Setup, device: str, memory: int, headroom: float, export_dtype: str,
              write_gbps: float) -> Plan:
    usable = int(memory * (1 - headroom))
    ema = ema_bytes_per_rank(setup)
    peak = {**fake_peak(setup), "ema": ema}
    total = sum(peak.values())
    # on the CPU the model is in host memory: filled while loading (the step's peak is the device
    # plan); the trained model and its optimizer state stay beside the export
    on_cpu = device == "cpu"
    trained = peak["params"] + peak["optimizer"] + ema
    phases = {"load": host_load_bytes(setup) + on_cpu * peak["params"],
              "export": host_export_bytes(setup, export_dtype) + on_cpu * trained}
    host = max(*phases.values(), on_cpu * total)
    return Plan(
        world_size=setup.world_size,
        device=device,
        device_memory_gib=round(memory / GIB, 3),
        peak_gib=round(total / GIB, 3),
        by_category_gib={k: round(v / GIB, 3) for k, v in peak.items()},
        fits=total <= usable,
        largest_max_tokens=largest_max_tokens(setup, usable - ema),
        host_peak_gib=round(host / GIB, 3),
        host_by_phase_gib={k: round(v / GIB, 3) for k, v in phases.items()},
        max_tokens=setup.max_tokens,
        micro_batch=list(setup.micro_batch()),
        headroom=headroom,
        checkpoint_gib_per_rank=round(checkpoint_bytes_per_rank(setup) / GIB, 3),
        checkpoint_write_gbps=write_gbps,
        checkpoint_save_seconds=round(checkpoint_save_seconds(setup, write_gbps), 1),
    )


@dataclass
class PlanResult:
    plan: Plan
    as_json: bool

    def summary(self) -> str:
        return self.plan.to_json() if self.as_json else self.plan.summary()


def plan(params: Params) -> PlanResult:
    """`plan`: the per-device memory of the train section on the planned device and world."""
    torch.set_num_threads(min(torch.get_num_threads(), os.cpu_count() or 1))
    setup = setup_of(params)
    memory = device_memory_bytes(params)
    return PlanResult(make_plan(setup, params.plan.device, memory, params.plan.headroom,
                                params.train.export_dtype, params.plan.checkpoint_write_gbps),
                      params.plan.json_)


def fits_free_memory(plan_: Plan, free: int, headroom: float) -> str | None:
    """None when the planned peak fits `free` bytes with headroom, else train's one-paragraph refusal."""
    usable = free * (1 - headroom)
    if plan_.peak_gib * GIB <= usable:
        return None
    largest = plan_.largest_max_tokens
    tokens = (f"the largest train.max_tokens that fits is {largest}" if largest is not None
              else "not even the shortest micro-batch fits")
    cats = ", ".join(f"{k} {v:.2f}" for k, v in plan_.by_category_gib.items())
    rows, length = plan_.micro_batch
    return (
        f"the training plan needs {plan_.peak_gib:.2f} GiB per device ({cats}; micro-batch {rows} x "
        f"{length}, world of {plan_.world_size}), but the device has {free / GIB:.2f} GiB free "
        f"({headroom:.0%} kept as headroom); nothing was allocated. Here {tokens}. Levers: lower "
        "train.max_tokens, train.activation_checkpointing: true, train.lora.enabled: true, or more "
        "devices (local.nproc / launch.pods x launch.devices_per_pod: FSDP2 shards params, gradients and "
        "optimizer state over them); `voxpipe plan` shows the figures"
    )


# -- train's check ------------------------------------------------------------------------------
def free_device_memory(device: torch.device) -> int:
    """Free bytes on the accelerator (torch.cuda / torch.npu mem_get_info): the one device query."""
    return int(getattr(torch, device.type).mem_get_info(device)[0])


def planned_for_train(params: Params, world: int, dtype: str, free: int) -> Plan:
    """The plan of this train run (its world, its compute dtype) against `free` bytes, made in a
    process of its own: the fake process group cannot live beside train's real one."""
    from voxpipe.params import params_yaml

    with tempfile.TemporaryDirectory(prefix="voxpipe-plan-") as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(params_yaml(params), encoding="utf-8")
        sets = {"plan.launcher": "local", "local.nproc": world, "train.dtype": dtype,
                "plan.device_memory_gib": free / GIB}
        cmd = [sys.executable, "-m", "voxpipe", "plan", "--params", str(path), "--json"]
        cmd += [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the plan touches no device
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise StepError(f"train's memory plan failed (`voxpipe plan`): {done.stderr.strip()[-800:]}")
    return Plan(**json.loads(done.stdout.strip().splitlines()[-1]))


def plan_verdict(params: Params, device: torch.device, world: int, dtype: str) -> str | None:
    """Train's check before it allocates on an accelerator: None (go on) or the one-paragraph refusal.
    On the CPU the host-RAM check of build_model applies instead (the plan models accelerators)."""
    if device.type not in ("cuda", "npu"):
        return None
    free = free_device_memory(device)
    return fits_free_memory(planned_for_train(params, world, dtype, free), free, params.plan.headroom)
