"""Forward+backward time of our VoxCPM2 vs upstream voxcpm 2.0.3 on the same weights and batch.

Same process, CPU, fp32, the `small` preset (or --preset). Steps alternate between the two
models so background load hits both alike; prints the median step times, their ratio
ours/upstream (goal <= 0.5), the median ratio of adjacent step pairs (steadier on a busy
machine) and real (non-padding) sequence positions per second, as JSON. A third run, ours with
upstream's rows (`upstream_rows`: both LMs on every position, the encoder on every row), gives the
share of the row plan (voxpipe/model/rows.py); the last layers' reads are not undone by it.
Without upstream voxcpm 2.0.3 only ours runs; each figure of upstream's is null, with its
`*_null_reason`.

    .venv/bin/python benchmarks/model_step.py [--preset small] [--steps 10] [--warmup 2]
    .venv/bin/python benchmarks/model_step.py --smoke   # tiny preset, 1 + 1 steps: seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _bench import nulls, parse_args  # noqa: E402
from upstream import load_upstream, upstream_rows  # noqa: E402

from voxpipe.model.audiovae import AudioVAE  # noqa: E402
from voxpipe.model.config import preset  # noqa: E402
from voxpipe.model.io import from_pretrained, save_pretrained  # noqa: E402
from voxpipe.model.tokenizer import train_tokenizer  # noqa: E402
from voxpipe.model.voxcpm2 import VoxCPM2  # noqa: E402

# (text tokens, target patches, reference patches): a mixed batch like training's, 2 of 4 with a reference
ROWS = ((40, 60, 0), (30, 45, 30), (50, 70, 0), (20, 30, 25))


def make_batch(patch_size: int, feat_dim: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A right-padded batch in upstream's contract: [103, ref, 104,] text, 101, target, 102."""
    g = torch.Generator().manual_seed(seed)
    width = max(n_text + n_target + (n_ref + 2 if n_ref else 0) + 2 for n_text, n_target, n_ref in ROWS)
    batch = {k: torch.zeros(len(ROWS), width, dtype=torch.int32)
             for k in ("text_tokens", "audio_mask", "loss_mask", "labels")}
    batch["audio_feats"] = torch.zeros(len(ROWS), width, patch_size, feat_dim)
    batch["position_ids"] = torch.zeros(len(ROWS), width, dtype=torch.long)
    for row, (n_text, n_target, n_ref) in enumerate(ROWS):
        pos = 0
        if n_ref:
            batch["text_tokens"][row, [0, n_ref + 1]] = torch.tensor([103, 104], dtype=torch.int32)
            batch["audio_mask"][row, 1 : n_ref + 1] = 1
            pos = n_ref + 2
        batch["text_tokens"][row, pos : pos + n_text] = torch.randint(200, 2000, (n_text,), generator=g)
        pos += n_text
        batch["text_tokens"][row, pos] = 101
        target = slice(pos + 1, pos + 1 + n_target)
        batch["audio_mask"][row, target] = 1
        batch["loss_mask"][row, target] = 1
        end = pos + 1 + n_target
        batch["text_tokens"][row, end] = 102
        batch["labels"][row, end - 1] = 1
        batch["position_ids"][row, : end + 1] = torch.arange(end + 1)
    audio = batch["audio_mask"].bool()
    batch["audio_feats"][audio] = torch.randn(int(audio.sum()), patch_size, feat_dim, generator=g)
    batch["text_mask"] = (batch["text_tokens"] != 0).int()
    return batch


def step(model: torch.nn.Module, batch: dict[str, torch.Tensor], seed: int) -> tuple[float, float]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    start = time.perf_counter()
    out = model(**batch)
    loss = out["loss/diff"] + out["loss/stop"]
    loss.backward()
    return time.perf_counter() - start, loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parse_args(parser, preset="tiny", steps=1, warmup=1)
    try:
        load_upstream()
        missing = None
    except ImportError as e:
        missing = str(e)
        print(f"[bench model_step] only ours runs: {missing}", file=sys.stderr)

    config = preset(args.preset)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(VoxCPM2(config), AudioVAE(config.audio_vae_config), train_tokenizer(), tmp,
                        dtype=torch.float32)
        ours = from_pretrained(tmp).train()
        upstream = None
        if missing is None:
            from voxcpm.model.voxcpm2 import VoxCPM2Model

            upstream = VoxCPM2Model.from_local(tmp, training=True, device="cpu").train()
    batch = make_batch(config.patch_size, config.feat_dim)
    positions = int((batch["text_mask"].bool() | batch["audio_mask"].bool()).sum())  # real, not padding

    every_row = {**batch, **upstream_rows(batch)}  # ours on upstream's rows: the row plan's share
    times: dict[str, list[float]] = {"ours": [], "upstream": [], "ours_upstream_rows": []}
    pair_ratios, plan_pairs = [], []  # adjacent steps see the same background load: steadier ratios
    max_rel_diff = 0.0
    for i in range(args.warmup + args.steps):
        t_ours, loss_ours = step(ours, batch, seed=i)
        if upstream is not None:
            t_up, loss_up = step(upstream, batch, seed=i)
            max_rel_diff = max(max_rel_diff, abs(loss_ours - loss_up) / abs(loss_up))
        t_every, _ = step(ours, every_row, seed=i)
        if i >= args.warmup:
            times["ours"].append(t_ours)
            times["ours_upstream_rows"].append(t_every)
            plan_pairs.append(t_ours / t_every)
            if upstream is not None:
                times["upstream"].append(t_up)
                pair_ratios.append(t_ours / t_up)

    ours_s = statistics.median(times["ours"])
    if upstream is not None:
        up_s = statistics.median(times["upstream"])
        against_upstream = {
            "upstream_s": round(up_s, 4),
            "ratio_ours_over_upstream": round(ours_s / up_s, 3),
            "median_pair_ratio": round(statistics.median(pair_ratios), 3),
            "upstream_tokens_per_s": round(positions / up_s, 1),
            "max_rel_loss_diff": max_rel_diff,
        }
    else:
        against_upstream = nulls(("upstream_s", "ratio_ours_over_upstream", "median_pair_ratio",
                                  "upstream_tokens_per_s", "max_rel_loss_diff"), missing)
    print(json.dumps({
        "benchmark": "model_step",
        "preset": args.preset,
        "device": "cpu",
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "batch_size": len(ROWS),
        "padded_length": batch["text_tokens"].shape[1],
        "positions": positions,
        "steps": args.steps,
        "warmup": args.warmup,
        "parameters": sum(p.numel() for p in ours.parameters()),
        "ours_s": round(ours_s, 4),
        "ours_tokens_per_s": round(positions / ours_s, 1),
        **against_upstream,
        "ours_upstream_rows_s": round(statistics.median(times["ours_upstream_rows"]), 4),
        "median_pair_ratio_planned_over_upstream_rows": round(statistics.median(plan_pairs), 3),
    }, indent=2))


if __name__ == "__main__":
    main()
