"""CPU training throughput, `small` preset: our trainer vs upstream's way, same process and data; prints JSON.

Data: the shipped sample through ingest (no quality score: nothing here reads it) -> manifest ->
init-model small (fp32) -> encode (timed once, reported as the one-time cost). Three figures:

1. End-to-end samples/s. Ours = the trainer's own step (`Trainer.train_step`: FSDP2 world of 1,
   pre-encoded latents, token-budget batches, clip, NaN guard, AdamW) and its step-time meter.
   Upstream's way = its training loop's work per step: fixed-size shuffled batches of waveforms
   (decoded to 16 kHz once, outside the timing, which favours upstream), its packer VAE-encoding
   every clip one at a time with its AudioVAE, then its VoxCPM2Model forward + backward + clip +
   AdamW. Goal: ours >= 4x.
2. Model-side tokens/s with latents already encoded on both sides: upstream's model trained on
   the very batches our trainer saw (same sampler, same collate), vs ours. Goal: >= 2.0x
   (work not done: the local encoder on audio rows, the DiT on loss rows; one host read a step).
3. Padding waste of token-budget batches vs fixed-size batches of the same rows.
4. With `--ema-decay D`: a second trainer of ours with train.ema_decay=D steps in the same rotation, and
   its step time against ours without EMA (the EMA update alone is timed too, 20 calls).

The three runs advance one step each in turn, so background load hits them alike; the first
`--warmup` steps of every run are left out. Without upstream voxcpm 2.0.3 only ours runs, and each
ratio is null with its `*_null_reason`.

    .venv/bin/python benchmarks/train_step.py [--steps 12] [--warmup 2] [--max-tokens 640] [--batch-size 8]
        [--kernels auto] [--compile] [--preset small] [--rows-per-speaker 0] [--ema-decay 0.999]
    .venv/bin/python benchmarks/train_step.py --smoke   # tiny preset, 6 clips, 2 steps: seconds
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from _bench import nulls, parse_args  # noqa: E402
from small_sample import write_small_sample  # noqa: E402
from upstream import load_upstream, upstream_packer_class  # noqa: E402

from voxpipe.data.audio import decode  # noqa: E402
from voxpipe.data.batching import TokenBudgetSampler, fixed_size_batches, padding_waste  # noqa: E402
from voxpipe.data.dataset import BATCH_KEYS, EncodedDataset, collate  # noqa: E402
from voxpipe.data.encode.step import encode  # noqa: E402
from voxpipe.data.ingest_step import ingest  # noqa: E402
from voxpipe.data.manifest import build_manifest  # noqa: E402
from voxpipe.params import Params  # noqa: E402
from voxpipe.steps.encode import EncodeParams  # noqa: E402
from voxpipe.steps.ingest import IngestParams  # noqa: E402
from voxpipe.steps.manifest import ManifestParams  # noqa: E402
from voxpipe.steps.model import ModelParams  # noqa: E402
from voxpipe.steps.train import TrainParams  # noqa: E402
from voxpipe.train.device import distributed_runtime  # noqa: E402
from voxpipe.train.init_model import init_model  # noqa: E402
from voxpipe.train.loop import Trainer  # noqa: E402
from voxpipe.train.signals import TerminationFlag  # noqa: E402

LR = 1e-5


def log(msg: str) -> None:
    print(f"[bench train_step] {msg}", file=sys.stderr, flush=True)


def prepare(work: Path, model_preset: str, rows_per_speaker: int) -> tuple[Path, Path, float]:
    sample = REPO / "data" / "sample"
    if rows_per_speaker:
        sample = write_small_sample(work / "sample", rows_per_speaker)
    ingest(IngestParams(input=[str(sample)], out=str(work / "ingest"), workers=1, score_quality=False))
    build_manifest(ManifestParams(input=[str(work / "ingest" / "raw.jsonl")], out=str(work / "manifest")))
    init_model(ModelParams(preset=model_preset, out=str(work / "base"), dtype="float32"))
    start = time.perf_counter()
    encode(Params(model={"base": str(work / "base")}, encode=EncodeParams(
        manifest=[str(work / "manifest" / "train.jsonl")], out=str(work / "encoded"), device="cpu")))
    return work / "base", work / "encoded", time.perf_counter() - start


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    return int(((batch["text_mask"] > 0) | (batch["audio_mask"] > 0)).sum())


def record(start: float, samples: int, batch: dict[str, torch.Tensor]) -> dict:
    return {"step_time_s": time.perf_counter() - start, "samples": samples, "real_tokens": real_tokens(batch)}


def upstream_model(base: Path):
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    model = VoxCPM2Model.from_local(str(base), training=True, device="cpu")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params, torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


def upstream_step(model, params, optimizer, batch: dict[str, torch.Tensor]) -> None:
    out = model(**{k: batch[k] for k in BATCH_KEYS})
    (out["loss/diff"] + out["loss/stop"]).backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def pad(rows: list[torch.Tensor]) -> torch.Tensor:
    """Upstream's collate: right-pad with -100, the value its packer strips again."""
    width = max(r.numel() for r in rows)
    return torch.stack([torch.cat((r, torch.full((width - r.numel(),), -100, dtype=r.dtype))) for r in rows])


def upstream_end_to_end(base: Path, encoded: Path, batch_size: int) -> Iterator[dict]:
    """Fixed-size batches of waveforms; the packer VAE-encodes each clip inside every step."""
    data = EncodedDataset(encoded, "train")
    wavs, refs, texts = [], [], []
    for i, row in enumerate(data.rows):  # decoding happens once, outside the timing
        wavs.append(torch.from_numpy(decode(encoded / row["audio"], 16000)))
        ref = row.get("ref_audio")
        refs.append(torch.from_numpy(decode(encoded / ref, 16000)) if ref else torch.tensor([-100.0]))
        texts.append(data[i].text_ids.to(torch.int32))
    model, params, optimizer = upstream_model(base)
    packer_cls = upstream_packer_class()
    packer = packer_cls(1, model.config.max_length, model.patch_size, model.feat_dim, model.audio_vae)
    order = fixed_size_batches(len(wavs), batch_size, seed=0)
    for step in itertools.count():
        rows = order[step % len(order)]
        start = time.perf_counter()
        packed = packer(
            pad([wavs[i] for i in rows]),
            pad([texts[i] for i in rows]),
            torch.ones(len(rows), dtype=torch.int32),
            torch.zeros(len(rows), dtype=torch.int32),
            [False] * len(rows),
            ref_audio_tokens=pad([refs[i] for i in rows]),  # [-100] = no reference
        )
        upstream_step(model, params, optimizer, packed)
        yield record(start, len(rows), packed)


def upstream_on_latents(base: Path, encoded: Path, max_tokens: int) -> Iterator[dict]:
    """Upstream's model on the batches our trainer uses (same sampler and seed), collated each step."""
    data = EncodedDataset(encoded, "train")
    sampler = TokenBudgetSampler(data.lengths(), max_tokens, seed=0)
    batches = iter(sampler)
    model, params, optimizer = upstream_model(base)
    while True:
        indices = next(batches, None)
        if indices is None:  # epoch over: the sampler moved on, as in the trainer
            batches = iter(sampler)
            indices = next(batches)
        start = time.perf_counter()
        batch = collate([data[i] for i in indices], data.patch_size, model.config.max_length)
        upstream_step(model, params, optimizer, batch)
        yield record(start, len(indices), batch)


def interleaved(runners: dict[str, Callable[[], dict]], steps: int) -> dict[str, list[dict]]:
    """One step of each runner in turn (rotating who goes first), so background load hits all alike."""
    names = list(runners)
    records: dict[str, list[dict]] = {name: [] for name in names}
    for step in range(steps):
        for name in names[step % len(names):] + names[: step % len(names)]:
            records[name].append(runners[name]())
            log(f"step {step + 1}/{steps} {name}: {records[name][-1]['step_time_s']:.2f} s")
    return records


def rates(records: list[dict], warmup: int) -> dict[str, float]:
    kept = records[warmup:]
    seconds = sum(r["step_time_s"] for r in kept)
    return {
        "samples_per_s": sum(r["samples"] for r in kept) / seconds,
        "tokens_per_s": sum(r["real_tokens"] for r in kept) / seconds,
        "median_step_s": statistics.median(r["step_time_s"] for r in kept),
        "samples_per_step": sum(r["samples"] for r in kept) / len(kept),
        "steps_timed": len(kept),
    }


def ratio(key: str, ours: dict, theirs: dict | None, missing: str | None) -> dict:
    """ours / theirs of one rate, or null with the reason upstream did not run."""
    if theirs is None:
        return nulls([f"{key}_ratio"], missing)
    return {f"{key}_ratio": ours[key] / theirs[key]}


def ema_cost(runs: dict[str, list[dict]], trainer: Trainer, args: argparse.Namespace) -> dict:
    """Step time with train.ema_decay against without, from the same rotation; the update alone."""
    assert trainer.ema is not None
    start = time.perf_counter()
    for _ in range(20):
        trainer.ema.update()
    update_s = (time.perf_counter() - start) / 20
    on, off = rates(runs["ours_ema"], args.warmup), rates(runs["ours"], args.warmup)
    return {"decay": args.ema_decay, "ours_ema": on,
            "median_step_ratio": on["median_step_s"] / off["median_step_s"],
            "ema_update_s": update_s, "ema_bytes": trainer.ema.local_bytes()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=640, help="our token budget per micro-batch")
    parser.add_argument("--batch-size", type=int, default=8, help="upstream's fixed batch size")
    parser.add_argument("--kernels", default="auto", choices=["auto", "fused", "eager"], help="model.kernels")
    parser.add_argument("--compile", action="store_true", help="train.compile: torch.compile each block")
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--rows-per-speaker", type=int, default=0, help="the sample's first N rows of each "
                        "speaker (0: all of it)")
    parser.add_argument("--ema-decay", type=float, default=0.0, help="also time a trainer with "
                        "train.ema_decay at this value beside ours (0: not)")
    args = parse_args(parser, preset="tiny", rows_per_speaker=3, steps=2, warmup=1, batch_size=2)
    try:
        load_upstream()
        missing = None
    except ImportError as e:
        missing = str(e)
        log(f"only ours runs: {missing}")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work = Path(tmp)
        log(f"preparing data: ingest, manifest, init-model {args.preset}, encode")
        base, encoded, encode_s = prepare(work, args.preset, args.rows_per_speaker)
        params = Params(model={"base": str(base), "kernels": args.kernels}, train=TrainParams(
            data=str(encoded), out=str(work / "ours"), device="cpu", dtype="float32", lr=LR, warmup_steps=0,
            max_tokens=args.max_tokens, compile=args.compile))
        with distributed_runtime("cpu") as rt, TerminationFlag() as flag:
            trainer = Trainer(params, rt, flag)  # the trainer's own step: data, FSDP2 model, clip, AdamW
            runners: dict[str, Callable[[], dict]] = {"ours": trainer.train_step}
            if missing is None:
                e2e = upstream_end_to_end(base, encoded, args.batch_size)
                lat = upstream_on_latents(base, encoded, args.max_tokens)
                runners["upstream_vae_per_step"] = lambda: next(e2e)
                runners["upstream_pre_encoded"] = lambda: next(lat)
            if args.ema_decay:
                with_ema = Trainer(params.model_copy(update={"train": params.train.model_copy(update={
                    "ema_decay": args.ema_decay, "out": str(work / "ours_ema")})}), rt, flag)
                runners["ours_ema"] = with_ema.train_step
            runs = interleaved(runners, args.steps)
            ema = ema_cost(runs, with_ema, args) if args.ema_decay else None
        ours, up_e2e, up_lat = (rates(runs[name], args.warmup) if name in runs else None
                                for name in ("ours", "upstream_vae_per_step", "upstream_pre_encoded"))
        lengths = EncodedDataset(encoded, "train").lengths()
        budget = TokenBudgetSampler(lengths, args.max_tokens, seed=0).global_batches(0)
        fixed = fixed_size_batches(len(lengths), args.batch_size, seed=0)
        result = {
            "preset": args.preset,
            "device": "cpu",
            "kernels": trainer.kernels.label,
            "compile": args.compile,
            "threads": torch.get_num_threads(),
            "train_rows": len(lengths),
            "one_time_encode_s": round(encode_s, 2),
            "end_to_end": {
                "ours": ours,
                "upstream_vae_per_step": up_e2e,
                **ratio("samples_per_s", ours, up_e2e, missing),
                "goal": ">= 4.0",
            },
            "pre_encoded": {
                "ours": ours,
                "upstream_same_batches": up_lat,
                **ratio("tokens_per_s", ours, up_lat, missing),
                "goal": ">= 2.0",
            },
            **({"ema": ema} if ema else nulls(["ema"], "no --ema-decay: only ours without EMA ran")),
            "padding_waste": {
                "token_budget": padding_waste(budget, lengths),
                "fixed_size": padding_waste(fixed, lengths),
                "max_tokens": args.max_tokens,
                "batch_size": args.batch_size,
                "definition": "padded positions per real position",
            },
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
