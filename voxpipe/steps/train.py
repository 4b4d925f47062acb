"""`train`'s section (and its LoRA sub-section) and step (a stage under torchrun)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step


def default_lr(lora: bool) -> float:
    """train.lr when not given: upstream's recipes, 1e-5 for a full fine-tune and 1e-4 for LoRA."""
    return 1e-4 if lora else 1e-5


LORA_ATTENTION = ["q_proj", "v_proj", "k_proj", "o_proj"]  # upstream LoRAConfig's defaults, in its order
LORA_PROJ = ["enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj", "fusion_concat_proj"]


class LoraParams(Section):
    """LoRA adapters for `train` (embedded as `train.lora`); names mirror upstream's LoRAConfig."""

    enabled: bool = Field(False, description="train LoRA adapters on a frozen base instead of every weight")
    r: int = Field(32, gt=0, description="adapter rank")
    alpha: int = Field(
        32, gt=0, description="scaling = alpha / r (an int, as upstream's LoRAConfig). Not given: alpha = r "
        "(upstream's LoRA recipe, scaling 1)"
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input")
    target_lm: bool = Field(True, description="adapters in base_lm and residual_lm (target_modules_lm)")
    target_dit: bool = Field(True, description="adapters in the local DiT (target_modules_dit)")
    target_proj: bool = Field(False, description="adapters on the projections in target_proj_modules")
    target_modules_lm: list[str] = Field(
        default_factory=lambda: list(LORA_ATTENTION), min_length=1,
        description="Linear layer names wrapped in the LMs (also e.g. gate_proj, up_proj, down_proj)",
    )
    target_modules_dit: list[str] = Field(
        default_factory=lambda: list(LORA_ATTENTION), min_length=1,
        description="Linear layer names wrapped in the local DiT",
    )
    target_proj_modules: list[str] = Field(
        default_factory=lambda: list(LORA_PROJ), min_length=1,
        description="top-level projections wrapped when target_proj is on",
    )

    @model_validator(mode="after")
    def _alpha_follows_r(self) -> LoraParams:
        """alpha not given = r (model_fields_set: what the user wrote, not what defaulted)."""
        if "alpha" not in self.model_fields_set and self.alpha != self.r:
            self.alpha = self.r
        return self


# bounds that keep a typo from taking the machine (`voxpipe plan --train-max-tokens 1e9` allocated 18 GB,
# `--local-nproc 1e6` never returned): refused by the schema before anything is built
MAX_TOKENS = 1 << 20  # LM positions per micro-batch: 250x the default, far past any device's memory


class TrainParams(Section):
    """`train`: FSDP2 fine-tuning on encoded data, one process or under torchrun."""

    def file_values(self) -> dict[str, Any]:
        """lora.alpha is left out when it equals r (what leaving it out gives), so it keeps following r; lr
        is null when it is the default for the run's kind, so it keeps following lora.enabled (it stays in
        the file: DVC tracks it and fails on a tracked key the file lacks)."""
        data = super().file_values()
        if data["lora"]["alpha"] == data["lora"]["r"]:
            del data["lora"]["alpha"]
        if data["lr"] == default_lr(data["lora"]["enabled"]):
            data["lr"] = None
        return data

    data: str = Field("work/encoded", description="`encode` output folder (train.jsonl, val.jsonl, shards)",
                      json_schema_extra={"result": False, "wired": True})
    out: str = Field(
        "work/train", description="output folder: checkpoints/, export/, metrics.jsonl, train_curve.csv, "
        "report.json",
        json_schema_extra={"result": False, "wired": True},
    )
    device: Literal["auto", "cpu", "cuda", "npu"] = Field(
        "auto", description="auto = npu, else cuda, else cpu"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="compute dtype of the parameters (FSDP2 mixed precision; fp32 masters and "
        "fp32 gradient reduction). auto = bfloat16 on accelerators, float32 on CPU"
    )
    max_steps: int = Field(
        40, gt=0, description="optimizer steps (40: the demo on the sample; a real fine-tune wants 1000s)",
        json_schema_extra={"weights": False},
    )
    lr: float | None = Field(
        None, gt=0, description="peak learning rate. Not given or null: 1e-5, or 1e-4 with lora.enabled "
        "(upstream's full and LoRA recipes)"
    )
    min_lr: float = Field(1e-6, ge=0, description="cosine decay floor, reached at max_steps")
    warmup_steps: int = Field(4, ge=0, description="linear warm-up steps (about 10 % of max_steps)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decay on matrices (not norms/biases)")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    max_tokens: int = Field(4096, gt=0, le=MAX_TOKENS, description="token budget: LM positions per "
                            f"micro-batch (padded); at most {MAX_TOKENS} (2^20)")
    clip_norm: float = Field(1.0, gt=0, description="gradient norm clipping threshold")
    max_bad_steps: int = Field(5, ge=1, description="stop after this many non-finite steps in a row",
                               json_schema_extra={"result": False})
    log_every: int = Field(
        10, ge=1, description="off a terminal (a pod, a pipe): one log line every N steps (step, loss, lr, "
        "tokens/s, MFU, peak memory) from rank 0, instead of a progress bar",
        json_schema_extra={"result": False},
    )
    val_every: int = Field(10, ge=0, description="fixed-seed validation every N steps (0 = only at the end)",
                           json_schema_extra={"result": False})
    val_batches: int = Field(8, ge=0, description="val micro-batches per validation (0 = all)",
                             json_schema_extra={"result": False})
    checkpoint_every: int = Field(500, ge=0, description="DCP checkpoint every N steps (0 = only at the end)",
                                  json_schema_extra={"result": False})
    keep_checkpoints: int = Field(2, ge=1, description="newest complete checkpoints kept",
                                  json_schema_extra={"result": False})
    export_every: int = Field(
        20, ge=0, description="also export exports/step-N/ every N steps and at the last (0 = only export/): "
        "evaluate scores them all and keeps the best. 20: the demo; a real fine-tune wants 100s",
        json_schema_extra={"result": False},
    )
    keep_exports: int = Field(3, ge=1, description="newest exports/step-N/ kept",
                              json_schema_extra={"result": False})
    ema_decay: float = Field(
        0.0, ge=0, lt=1, description="keep EMA weights beside the live ones (e.g. 0.999; 0 = off): sharded "
        "like them, in the checkpoints, and exported beside each exports/step-N/ as exports/step-N-ema/, a "
        "candidate evaluate judges by the same rule (needs export_every > 0)",
        json_schema_extra={"weights": False},
    )
    resume: bool = Field(
        True, description="continue from the newest verified checkpoint in out/checkpoints; it must come "
        "from the same params (only max_steps, checkpoint and logging keys may differ). false: start fresh "
        "(old checkpoints are moved aside, not deleted)",
        json_schema_extra={"result": False},
    )
    fresh_on_change: bool = Field(
        False, description="when the checkpoint's params differ: start fresh (old checkpoints moved aside) "
        "instead of stopping with an error; for `dvc repro`, which reruns train when a tracked key changes",
        json_schema_extra={"result": False},
    )
    activation_checkpointing: bool = Field(False, description="recompute each decoder layer in backward",
                                           json_schema_extra={"result": False})
    compile: bool = Field(
        False, description="torch.compile each transformer block (first steps pay the compile; measured in "
        "docs/accelerators.md: 0.97x on CPU)",
        json_schema_extra={"result": False},
    )
    export_dtype: Literal["float32", "bfloat16"] = Field(
        "bfloat16", description="dtype of the exported model.safetensors (upstream ships bfloat16)",
        json_schema_extra={"weights": False},
    )
    peak_tflops: float = Field(
        0.0, ge=0,
        description="per-device peak for live MFU; 0 = device table (CPU: none, `voxpipe mfu` measures)",
        json_schema_extra={"result": False},
    )
    seed: int = Field(0, description="seed of the noise, dropout and data order")
    track: bool = Field(
        False,
        description="MLflow while training: params and every step's metrics live from rank 0, into the "
        "run `register` then completes (off: metrics.jsonl only; `register` logs it afterwards)",
        json_schema_extra={"result": False},
    )
    lora: LoraParams = Field(default_factory=LoraParams)

    @model_validator(mode="after")
    def _default_lr(self) -> TrainParams:
        """lr not given (or null): upstream's recipe for the kind of run. LoRA's B starts at zero, and
        1e-5 barely moves it, so LoRA gets 1e-4."""
        if self.lr is None:
            self.lr = default_lr(self.lora.enabled)
        return self

    @model_validator(mode="after")
    def _ema_exported(self) -> TrainParams:
        """EMA weights that are never exported would cost memory and time for nothing."""
        if self.ema_decay and not self.export_every:
            raise ValueError("train.ema_decay needs train.export_every > 0: the EMA weights are exported "
                             "beside each exports/step-N/ as exports/step-N-ema/ (export/ holds the live "
                             "weights); set train.export_every, or train.ema_decay=0")
        return self


ORDER = 60
SECTIONS = {"train": TrainParams}

STEPS = (
    Step("train", "FSDP2 fine-tuning on encoded data (plain or under torchrun): checkpoints/, export/, "
         "metrics.jsonl", target="voxpipe.train.loop:train",
         reads=("train", "model.base", "model.kernels", "tracking", "plan.headroom"),
         # plan.headroom: the memory check before allocating refuses or goes on, it changes no weights
         wires=(("live", "voxpipe.track.live:LiveRun"),), untracked=("tracking", "plan.headroom"),
         stage=Stage(
             deps=("${train.data}", "${model.base}"), torchrun=True, args="--set train.fresh_on_change=true",
             params=("train.max_steps",),
             outs=(Out("${train.out}/export"),
                   Out("${train.out}/exports", persist=True,
                       note="train.export_every: the step-N exports evaluate chooses from; those written "
                       "before a kill are kept: a resumed run does not write them again"),
                   Out("${train.out}/checkpoints", persist=True, cache=False,
                       note="a killed or repeated `dvc repro` resumes from the newest good checkpoint"),
                   Out("${train.out}/train_curve.csv"),
                   Out("${train.out}/report.json", cache=False,
                       note="the run's record (timings per step, resume, MLflow run): new on every run"),
                   Out("${train.out}/metrics.jsonl", persist=True, cache=False,
                       note="a resumed run keeps the lines up to its checkpoint and appends")),
             plots=(("val_loss", {"x": "step", "y": {"${train.out}/report.json": "val/loss"}}),
                    ("train_loss", {"x": "step",
                                    "y": {"${train.out}/train_curve.csv":
                                          ["loss", "loss/diff", "loss/stop"]}})),
             note="voxpipe.launch.torchrun: torchrun's arguments, without its traceback over a rank's "
                  "error. --standalone: a free rendezvous port, so two runs on one machine never meet. "
                  "fresh_on_change: a rerun for changed params or data moves the old checkpoints aside and "
                  "starts fresh; one with the same inputs resumes",
             notes=(("train.max_steps", "grown: training continues from the last checkpoint"),
                    ("local.nproc", "the world size changes the data order"),
                    ("val_loss", "the trainer's fixed-seed validation curve"),
                    ("train_loss",
                     "training loss per optimizer step (the raw flow-matching loss is noisy by nature)")))),
)
