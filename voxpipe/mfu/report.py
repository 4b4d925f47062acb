"""`voxpipe mfu`: model FLOPs utilisation of a finished training run.

Reads the train step's report.json (devices, dtype) and metrics.jsonl (per optimizer step: wall
time and model FLOPs or micro-batch shapes, as voxpipe/train/throughput.py writes them), the checkpoint's
config.json (tower shapes), and writes mfu.json (a DVC metric), mfu.md and report.json.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxpipe.data.jsonl import jsonl_records
from voxpipe.errors import StepError
from voxpipe.files import atomic_write_text, read_json_object
from voxpipe.mfu.flops import TOWERS, dit_inner_length, forward_flops, tower_shares, training_flops
from voxpipe.mfu.peak import CPU_NO_PEAK, UnknownPeakError, lookup_peak
from voxpipe.mfu.published import published_check
from voxpipe.model.config import VoxCPM2Config
from voxpipe.params import Params
from voxpipe.report import write_json, write_report
from voxpipe.steps.mfu import MfuParams


@dataclass(frozen=True)
class StepRecord:
    step: int
    time_s: float
    flops: float  # all ranks, all micro-batches
    tokens: int | None  # padded LM positions, all ranks
    real_tokens: int | None  # positions holding text or audio, all ranks
    # rank 0's micro-batches: (B, L, DiT rows, encoder rows); None = all B*L rows
    shapes: tuple[tuple[int, int, int | None, int | None], ...]


@dataclass(frozen=True)
class MfuResult:
    out: Path
    figures: dict[str, Any]

    def summary(self) -> str:
        f = self.figures
        if f["mfu"] is None:
            return (
                f"mfu: null ({f['mfu_null_reason']}) | {f['achieved_tflops_per_device']:.3g} TFLOP/s per "
                "device | "
                f"{f['step_time_s']:.3g} s/step over {f['steps_measured']} steps -> {self.out}/mfu.json"
            )
        return (
            f"mfu {100 * f['mfu']:.2f} % | {f['achieved_tflops_per_device']:.3g} TFLOP/s per device of "
            f"{f['peak_tflops']:.4g} ({f['peak_source']}) | {f['step_time_s']:.3g} s/step over "
            f"{f['steps_measured']} steps -> {self.out}/mfu.json"
        )


Shape = tuple[int, int, int | None, int | None, int | None]  # B, L, DiT, encoder and LM rows


def _shapes(value: Any, where: str) -> tuple[Shape, ...]:
    """Micro-batch shapes of a step line; rows left out are None: every row, as runs before the row
    plan (voxpipe/model/rows.py) computed them."""
    if value is None:
        return ()
    ok = isinstance(value, list) and all(
        isinstance(s, list) and 2 <= len(s) <= 5 and all(isinstance(x, int) and x > 0 for x in s)
        for s in value
    )
    if not ok:
        raise StepError(
            f"{where}: 'shapes' must be a list of "
            f"[batch_size, seq_len(, dit_rows(, encoder_rows(, lm_rows)))], got {value!r}"
        )
    return tuple((*s, *[None] * (5 - len(s))) for s in value)


def read_steps(path: Path, config: VoxCPM2Config, world_size: int) -> list[StepRecord]:
    """Optimizer-step lines of metrics.jsonl (lines without `step_time_s`, e.g. validation, are skipped)."""
    if not path.is_file():
        raise StepError(f"{path}: metrics.jsonl of the training run not found (set mfu.metrics)")
    records = []
    for number, row, bad in jsonl_records(path):
        where = f"{path} line {number}"
        if row is None:
            raise StepError(f"{where}: {bad}")
        if row.get("step_time_s") is None:
            continue
        step_time = row["step_time_s"]
        if not isinstance(step_time, int | float) or step_time <= 0:
            raise StepError(f"{where}: step_time_s must be a positive number, got {step_time!r}")
        shapes = _shapes(row.get("shapes"), where)
        if row.get("flops") is not None:
            flops = float(row["flops"])
        elif shapes:
            flops = world_size * sum(
                training_flops(config, b, length, dit_rows=r, enc_rows=e, lm_rows=n)
                for b, length, r, e, n in shapes
            )
        else:
            raise StepError(f"{where}: a step line needs 'flops' or 'shapes' to count model FLOPs")
        tokens = row.get("tokens")
        if tokens is None and shapes:
            tokens = world_size * sum(s[0] * s[1] for s in shapes)
        step = int(row.get("step", number))
        records.append(StepRecord(step, float(step_time), flops, tokens, row.get("real_tokens"), shapes))
    return sorted(records, key=lambda r: r.step)


PEAK_KEY = "mfu.peak_tflops"
THROUGHPUT_DEFINITIONS = {
    "tokens_per_s": "text and audio positions (padding left out) per second of training, all devices "
    "together, over every step: the train report's figure, the headline in dvc exp show, MLflow and "
    "voxpipe compare",
    "padded_tokens_per_s_per_device": "padded LM positions per second per device over the measured steps "
    "(warm-up left out): what the hardware computed, the convention MFU's FLOPs are counted in",
}


def _run_peak(p: MfuParams, run: dict[str, Any], dtype: str) -> tuple[float, str]:
    """override > the trainer's own peak (train.peak_tflops, or its table's) > the table by device name;
    a CPU without either has no peak (peak.py CPU_NO_PEAK)."""
    if p.peak_tflops is not None:
        return p.peak_tflops * 1e12, "override"
    if run.get("peak_flops"):
        return float(run["peak_flops"]), f"train report: {run.get('peak_source', 'unknown')}"
    if run["device_type"] == "cpu":
        raise UnknownPeakError(CPU_NO_PEAK)
    return lookup_peak(str(run["device_name"]), dtype)


def compute(p: MfuParams, base: Path) -> dict[str, Any]:
    """Every figure of mfu.json; `base` is the checkpoint folder whose config.json gives the shapes."""
    config = VoxCPM2Config.from_file(base / "config.json")
    report_path = Path(p.train_report)
    run = read_json_object(report_path, "the train report")
    for key in ("world_size", "device_type", "device_name"):
        if key not in run:
            raise StepError(f"{report_path}: key {key!r} missing (see the mfu interface: world_size, "
                            "device_type, device_name, dtype)")
    dtype = p.dtype or run.get("dtype")
    if dtype not in ("float32", "bfloat16"):
        raise StepError(
            f"{report_path}: training dtype {dtype!r} unknown; set mfu.dtype (float32 or bfloat16)"
        )
    world = int(run["world_size"])
    metrics_path = Path(p.metrics) if p.metrics else report_path.parent / "metrics.jsonl"
    records = read_steps(metrics_path, config, world)
    used = records[p.warmup_steps :]
    if not used:
        raise StepError(
            f"{metrics_path}: {len(records)} optimizer steps, none left after skipping "
            f"mfu.warmup_steps={p.warmup_steps}"
        )
    # An accelerator missing from the table must not fail a finished pipeline run: MFU is then
    # null with the reason and the key that supplies the peak; every other figure still counts.
    peak: float | None = None
    peak_source: str | None = None
    null_reason: str | None = None
    try:
        peak, peak_source = _run_peak(p, run, dtype)
    except UnknownPeakError as e:
        null_reason = str(e)
        if run["device_type"] != "cpu":  # a CPU never has a peak unless given: the summary says so
            warnings.warn(f"mfu: null: {e}", stacklevel=2)

    total_time = sum(r.time_s for r in used)
    total_flops = sum(r.flops for r in used)
    achieved = total_flops / total_time / world
    figures: dict[str, Any] = {
        "mfu": achieved / peak if peak else None,
        "mfu_null_reason": null_reason,
        "peak_key": PEAK_KEY,
        "achieved_tflops_per_device": achieved / 1e12,
        "step_time_s": total_time / len(used),
        "step_time_s_median": statistics.median(r.time_s for r in used),
        "flops_per_step": total_flops / len(used),
        "flops_per_step_per_device": total_flops / len(used) / world,
        "peak_tflops": peak / 1e12 if peak else None,
        "peak_source": peak_source,
        "world_size": world,
        "device_name": run["device_name"],
        "dtype": dtype,
        "steps_measured": len(used),
        "steps_skipped": len(records) - len(used),
        # the run's one speed figure, as the train report, MLflow and `voxpipe compare` have it
        "tokens_per_s": run.get("tokens_per_s"),
        "padded_tokens_per_s_per_device": None,
        "throughput_definitions": THROUGHPUT_DEFINITIONS,
        "lora": bool(run.get("lora", False)),
        "tower_shares": None,
        "mfu_causal_half": None,
        "mean_batch_shape": None,
    }
    if all(r.tokens is not None for r in used):
        figures["padded_tokens_per_s_per_device"] = sum(r.tokens or 0 for r in used) / total_time / world
    shapes = [s for r in used for s in r.shapes]
    if shapes:
        towers = {name: 0.0 for name in TOWERS}
        half = 0.0
        for b, length, dit_rows, enc_rows, lm_rows in shapes:
            rows = {"dit_rows": dit_rows, "enc_rows": enc_rows, "lm_rows": lm_rows}
            for name, value in forward_flops(config, b, length, **rows).items():
                towers[name] += value
            half += training_flops(config, b, length, causal_half=True, **rows)
        figures["tower_shares"] = tower_shares(towers)
        if peak:  # same run, the lower-triangle attention convention of other ports
            figures["mfu_causal_half"] = figures["mfu"] * half / (3 * sum(towers.values()))
        figures["mean_batch_shape"] = [
            statistics.fmean(s[0] for s in shapes),
            statistics.fmean(s[1] for s in shapes),
        ]
    figures["conventions"] = {
        "flops": "matmuls only, forward + backward = 3 x forward, padded shapes (the local encoder on the "
        "audio rows and the local DiT on the loss-weighted rows they run on), no recompute",
        "attention": "full L x L score square (what the MATH SDPA backend runs); mfu_causal_half halves it "
        "in the causal LMs",
        "local_encoder_inner_length": config.patch_size + 1,
        "local_dit_inner_length": dit_inner_length(config),
    }
    figures["published_check"] = published_check()
    return figures


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def render_markdown(f: dict[str, Any]) -> str:
    """Human report: the run's figures, the tower split, and the published-figure comparison."""

    def opt(value: Any, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    causal_half = "n/a" if f["mfu_causal_half"] is None else _pct(f["mfu_causal_half"])
    mfu_text = f"**{_pct(f['mfu'])}**" if f["mfu"] is not None else f"null: {f['mfu_null_reason']}"
    peak_text = (
        f"{f['peak_tflops']:.4g} ({f['peak_source']})" if f["peak_tflops"] else f"unknown: set {PEAK_KEY}"
    )

    conv = f["conventions"]
    lines = [
        "# MFU of the training run",
        "",
        "| figure | value |",
        "|---|---|",
        f"| MFU | {mfu_text} |",
        f"| achieved TFLOP/s per device | {f['achieved_tflops_per_device']:.4g} |",
        f"| peak TFLOP/s per device | {peak_text} |",
        f"| step time (mean / median) | {f['step_time_s']:.4g} s / {f['step_time_s_median']:.4g} s |",
        f"| model FLOPs per step (all devices) | {f['flops_per_step']:.4g} |",
        f"| tokens/s (the run's speed: {THROUGHPUT_DEFINITIONS['tokens_per_s']}) | "
        f"{opt(f['tokens_per_s'], '.4g')} |",
        f"| padded LM positions/s per device (MFU's convention) | "
        f"{opt(f['padded_tokens_per_s_per_device'], '.4g')} |",
        f"| devices | {f['world_size']} x {f['device_name']} ({f['dtype']}) |",
        f"| steps measured (skipped as warm-up) | {f['steps_measured']} ({f['steps_skipped']}) |",
        f"| MFU with causal-half LM attention | {causal_half} |",
        "",
        f"Counting: {conv['flops']}; attention: {conv['attention']}. Local encoder inner sequences of "
        f"{conv['local_encoder_inner_length']} tokens (special token + P frames), local DiT inner "
        f"sequences of {conv['local_dit_inner_length']} tokens (2 LM conditions + time + previous patch + "
        "noisy patch).",
        "",
    ]
    if f["lora"]:
        lines += [
            "LoRA run: model FLOPs still count 3 x forward of every weight, as MFU conventionally does; "
            "frozen weights skip their weight gradients, so the hardware ran about a third less matmul work.",
            "",
        ]
    if f["tower_shares"]:
        lines += ["## FLOPs by tower", "", "| tower | share |", "|---|---|"]
        lines += [f"| {name} | {_pct(share)} |" for name, share in f["tower_shares"].items()]
        lines.append("")
    lines += _published_section(f["published_check"])
    return "\n".join(lines) + "\n"


def _published_section(check: dict[str, Any]) -> list[str]:
    pub = check["published"]
    rows = check["conventions"]
    ours = rows["voxpipe (full attention square)"]
    lines = [
        "## Check against a published figure",
        "",
        f"A VoxCPM2 FSDP2 port reported on one Ascend 910C die: L = {pub['seq_len']} LM tokens, micro-batch "
        f"{pub['batch_size']}, {pub['step_time_s']} s/step, {pub['tflops_per_device']} TFLOP/s, "
        f"{_pct(pub['mfu'])} MFU, i.e. {pub['flops_per_step'] / 1e12:.1f} TFLOP per step. Peak: "
        f"{check['peak_flops'] / 1e12:.1f} TFLOP/s ({check['peak_source']}; 24 cube cores x 16^3 MAC "
        "x 2 x 1.8 GHz).",
        "",
        f"**Our calculator** (real voxcpm2 shape, B = {pub['batch_size']}, L = {pub['seq_len']}): "
        f"{ours['flops_per_step'] / 1e12:.1f} TFLOP per step, so their step time means "
        f"{ours['tflops_per_device']:.1f} TFLOP/s and **{_pct(ours['mfu'])} MFU** in our convention "
        f"({100 * ours['vs_published']:+.1f} % FLOPs vs theirs).",
        "",
        "| convention | TFLOP per step | TFLOP/s at their step time | MFU | vs published |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['flops_per_step'] / 1e12:.2f} | {row['tflops_per_device']:.1f} | "
            f"{_pct(row['mfu'])} | {100 * row['vs_published']:+.2f} % |"
        )
    frames = rows["stacks only, local towers over audio frames (P, 2P)"]
    half = rows["voxpipe, causal half of LM attention"]
    naive = rows["6 * params * LM tokens"]
    lines += [
        "",
        f"Why they differ: the published figure is reproduced ({100 * frames['vs_published']:+.2f} %) by "
        "counting the four transformer stacks with the full attention square, but the local encoder over "
        "only the P = 4 audio frames of each patch and the local DiT over only the 2P = 8 frames (previous + "
        "noisy patch), leaving out the encoder's special token, the DiT's two LM-condition tokens and its "
        "time token, and the small projections, FSQ and stop head. Those 1 + 3 extra inner tokens per patch "
        "are work the device really runs at the padded shape (FlopCounterMode counts them too), so voxpipe "
        "counts them: that is the whole gap. The causal-half attention convention does not explain it (it "
        f"moves the count by only {100 * (half['flops_per_step'] / ours['flops_per_step'] - 1):+.1f} % at "
        f"L = {pub['seq_len']}), nor does 6 x params x tokens ({check['parameters'] / 1e9:.2f} B params: "
        f"{100 * naive['vs_published']:+.0f} %, because every LM position also runs 5 encoder and 11 DiT "
        f"inner tokens). Same run, same hardware: their {_pct(pub['mfu'])} is {_pct(ours['mfu'])} in "
        "voxpipe's convention. This check counts the local encoder and DiT on all B x L patch rows, as "
        "upstream's model runs them; voxpipe's model runs the encoder only on audio rows and the DiT only on "
        "the rows with loss weight (target audio), and the figures of this run count only those.",
        "",
    ]
    return lines


def mfu(params: Params) -> MfuResult:
    """`mfu`: the train report's steps against model.base's shapes."""
    p, base = params.mfu, Path(params.model.base)
    start = time.perf_counter()
    figures = compute(p, base)
    out = Path(p.out)
    write_json(out / "mfu.json", figures)
    atomic_write_text(out / "mfu.md", render_markdown(figures))
    write_report(
        out,
        {
            "train_report": p.train_report,
            "model": str(base),
            "steps_measured": figures["steps_measured"],
            "mfu": figures["mfu"],
            "peak_source": figures["peak_source"],
        },
        run={"seconds": round(time.perf_counter() - start, 3)},
    )
    return MfuResult(out, figures)
