"""`voxpipe <step>`: one subcommand per pipeline step.

Every step flag maps to a `section.key` in params.yaml; precedence is params file < `--set` < flag.
Step modules are imported only when their step runs, so `voxpipe --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass, field
from typing import Any

from voxpipe.errors import StepError
from voxpipe.params import load_params


@dataclass(frozen=True)
class Flag:
    name: str
    key: str
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    name: str
    help: str
    target: str  # "module:function", called with the step's params section
    section: str | None  # None: the function gets the whole Params (it needs several sections)
    flags: tuple[Flag, ...]


def _f(name: str, key: str, help: str, **kwargs: Any) -> Flag:
    return Flag(name, key, help, kwargs)


STEPS: tuple[Step, ...] = (
    Step(
        "ingest",
        "parquet → 16 kHz mono FLAC + raw.jsonl, bad rows quarantined",
        "voxpipe.data.ingest:ingest",
        "ingest",
        (
            _f("--input", "ingest.input", "parquet files or folders of them", nargs="+"),
            _f("--out", "ingest.out", "output folder"),
            _f("--text-column", "ingest.text_column", "column with the transcript"),
            _f("--audio-column", "ingest.audio_column", "column with the audio (struct, bytes or path)"),
            _f("--speaker-column", "ingest.speaker_column", "column with the speaker id ('' = one speaker)"),
            _f("--min-seconds", "ingest.min_seconds", "shortest clip kept", type=float),
            _f("--max-seconds", "ingest.max_seconds", "longest clip kept", type=float),
            _f("--max-bad-fraction", "ingest.max_bad_fraction", "fail above this quarantined fraction",
               type=float),
            _f("--workers", "ingest.workers", "decode processes (0 = all cores)", type=int),
        ),
    ),
    Step(
        "manifest",
        "raw.jsonl → train.jsonl / val.jsonl in the upstream VoxCPM format",
        "voxpipe.data.manifest:build_manifest",
        "manifest",
        (
            _f("--input", "manifest.input", "raw.jsonl files from ingest", nargs="+"),
            _f("--out", "manifest.out", "output folder"),
            _f("--val-fraction", "manifest.val_fraction", "share of rows held out", type=float),
            _f("--ref-fraction", "manifest.ref_fraction", "share of train rows given a ref_audio",
               type=float),
            _f("--seed", "manifest.seed", "seed for reference choice", type=int),
        ),
    ),
    Step(
        "validate",
        "check a manifest: files exist, decode, durations in bounds",
        "voxpipe.data.validate:validate_manifest",
        "validate",
        (_f("--manifest", "validate.manifest", "manifest .jsonl to check"),),
    ),
    Step(
        "init-model",
        "write a random-init VoxCPM2 checkpoint (upstream layout) with its own small tokenizer",
        "voxpipe.model.io:init_model",
        "model",
        (
            _f("--preset", "model.preset", "model size", choices=["tiny", "small"]),
            _f("--out", "model.out", "output folder"),
            _f("--seed", "model.seed", "seed for the random weights", type=int),
        ),
    ),
    Step(
        "encode",
        "manifests → AudioVAE latents + token ids in safetensors shards (resumable, done once)",
        "voxpipe.data.encode:encode",
        "encode",
        (
            _f("--manifest", "encode.manifest", "manifest .jsonl files (train, val)", nargs="+"),
            _f("--model", "encode.model", "base checkpoint dir"),
            _f("--out", "encode.out", "output folder"),
            _f("--device", "encode.device", "AudioVAE device", choices=["auto", "cpu", "cuda", "npu"]),
        ),
    ),
    Step(
        "train",
        "FSDP2 fine-tuning on encoded data (plain or under torchrun): checkpoints/, export/, metrics.jsonl",
        "voxpipe.train.loop:train",
        "train",
        (
            _f("--data", "train.data", "`encode` output folder"),
            _f("--model", "train.model", "base checkpoint folder (upstream layout)"),
            _f("--out", "train.out", "output folder"),
            _f("--device", "train.device", "device type", choices=["auto", "cpu", "cuda", "npu"]),
            _f("--dtype", "train.dtype", "parameter compute dtype", choices=["auto", "float32", "bfloat16"]),
            _f("--max-steps", "train.max_steps", "optimizer steps", type=int),
            _f("--lr", "train.lr", "peak learning rate", type=float),
            _f("--grad-accum", "train.grad_accum", "micro-batches per optimizer step", type=int),
            _f("--max-tokens", "train.max_tokens", "padded LM positions per micro-batch", type=int),
            _f("--val-every", "train.val_every", "fixed-seed validation every N steps", type=int),
            _f("--checkpoint-every", "train.checkpoint_every", "checkpoint every N steps", type=int),
            _f("--no-resume", "train.resume", "start fresh even if out/checkpoints has a checkpoint",
               action="store_false"),
            _f("--activation-checkpointing", "train.activation_checkpointing",
               "recompute decoder layers in backward", action="store_true"),
            _f("--seed", "train.seed", "seed for noise, dropout and data order", type=int),
            _f("--lora", "train.lora.enabled", "train LoRA adapters only", action="store_true"),
            _f("--lora-r", "train.lora.r", "LoRA rank", type=int),
            _f("--lora-alpha", "train.lora.alpha", "LoRA alpha (scaling = alpha / r)", type=int),
        ),
    ),
    Step(
        "evaluate",
        "fixed-seed loss and voice metrics vs the baseline: eval.json (DVC metric), samples/, eval.png",
        "voxpipe.evaluate.step:evaluate",
        "evaluate",
        (
            _f("--model", "evaluate.model", "fine-tuned checkpoint folder"),
            _f("--baseline", "evaluate.baseline", "checkpoint to compare against (the base model)"),
            _f("--data", "evaluate.data", "`encode` output folder (val.jsonl)"),
            _f("--out", "evaluate.out", "output folder"),
            _f("--device", "evaluate.device", "device type", choices=["auto", "cpu", "cuda", "npu"]),
            _f("--seeds", "evaluate.seeds", "fixed-seed loss seeds", nargs="+", type=int),
            _f("--require-improvement", "evaluate.require_improvement",
               "fail unless the loss beats the baseline by more than the seed spread", action="store_true"),
        ),
    ),
    Step(
        "mfu",
        "model FLOPs utilisation of a training run: mfu.json (DVC metric) + mfu.md",
        "voxpipe.mfu.report:mfu",
        "mfu",
        (
            _f("--model", "mfu.model", "checkpoint folder whose config.json gives the shapes"),
            _f("--train-report", "mfu.train_report", "the train step's report.json"),
            _f("--out", "mfu.out", "output folder"),
            _f("--peak-tflops", "mfu.peak_tflops", "peak dense TFLOP/s of one device (default: table / "
               "measured on CPU)", type=float),
        ),
    ),
    Step(
        "launch-train",
        "run the train section on a cluster as a gang-scheduled Volcano Job (torchrun per pod) and watch it",
        "voxpipe.launch.step:launch_train",
        None,
        (
            _f("--dry-run", "launch.dry_run", "print the Job YAML, submit nothing", action="store_true"),
            _f("--pods", "launch.pods", "pods (nodes) in the gang", type=int),
            _f("--devices-per-pod", "launch.devices_per_pod", "accelerators (torchrun processes) per pod",
               type=int),
            _f("--accelerator", "launch.accelerator",
               "device resource: huawei.com/Ascend910, nvidia.com/gpu, '' for CPU"),
            _f("--image", "launch.image", "training image"),
            _f("--queue", "launch.queue", "Volcano queue"),
            _f("--namespace", "launch.namespace", "namespace of the job ('' = the launcher pod's own)"),
        ),
    ),
    Step(
        "register",
        "log the pipeline run to MLflow, register the export (@candidate; @champion when its eval loss wins)",
        "voxpipe.track.register:register",
        None,
        (
            _f("--model", "register.model", "exported checkpoint folder"),
            _f("--eval", "register.eval", "eval.json of the evaluate step"),
            _f("--mfu", "register.mfu", "mfu.json of the mfu step"),
            _f("--train", "register.train", "the train step's folder (report.json, metrics.jsonl)"),
            _f("--out", "register.out", "output folder (registered.json)"),
            _f("--tracking-uri", "register.tracking_uri",
               "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite in the work folder)"),
            _f("--experiment", "register.experiment", "MLflow experiment"),
            _f("--model-name", "register.model_name", "registered model name"),
        ),
    ),
    Step(
        "compare",
        "the runs of an experiment side by side (differing params, val loss, eval, MFU) + val curves png",
        "voxpipe.track.compare:compare",
        "compare",
        (
            _f("--experiment", "compare.experiment", "MLflow experiment"),
            _f("--format", "compare.format", "output format", choices=["table", "markdown", "csv", "json"]),
            _f("--out", "compare.out", "output folder (compare.<format>, val_curves.png)"),
            _f("--tracking-uri", "compare.tracking_uri", "MLflow tracking URI"),
        ),
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxpipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True, metavar="<step>")
    for step in STEPS:
        sp = sub.add_parser(step.name, help=step.help, description=step.help)
        sp.add_argument("--params", default=None, help="params file (default: ./params.yaml)")
        sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one params key (repeatable)")
        for flag in step.flags:
            sp.add_argument(flag.name, dest=flag.key, default=None, help=f"{flag.help} [{flag.key}]",
                            **flag.kwargs)
    return parser


def run_step(step: Step, args: argparse.Namespace) -> Any:
    flags = {f.key: getattr(args, f.key) for f in step.flags}
    params = load_params(args.params, args.overrides, flags)
    module, func = step.target.split(":")
    arg = params if step.section is None else params.section(step.section)
    return getattr(importlib.import_module(module), func)(arg)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    step = next(s for s in STEPS if s.name == args.step)
    try:
        result = run_step(step, args)
    except StepError as e:
        print(f"voxpipe {step.name}: error: {e}", file=sys.stderr)
        return 1
    summary = getattr(result, "summary", None)
    text = summary() if callable(summary) else ""
    if text:
        print(text)
    return int(getattr(result, "exit_code", 0))


if __name__ == "__main__":
    sys.exit(main())
