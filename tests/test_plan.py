"""`voxpipe plan`: the fake-tensor plan against the measured peak of the same configuration.

The measurement is torch's own FSDPMemTracker over real tensors on the CPU, in a real gloo world
of 1 or 2 processes (spawned, as torchrun would), running the same step as the plan: the
planner's figures must be within 10 % of it (upstream's own tolerance for the tracker against
CUDA's measured peak).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest
import torch
import torch.distributed as dist

from voxpipe.cli import main
from voxpipe.model.config import preset
from voxpipe.steps.train import LoraParams
from voxpipe.train import plan as P
from voxpipe.train.device import Runtime

GIB = 2**30


def _measure_rank(rank: int, world: int, store_path: str, setup: P.Setup, queue) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        rt = Runtime(torch.device("cpu"), rank, world, init_device_mesh("cpu", (world,)))
        peak = P.tracked_peak(setup, rt, fake=False)
        if rank == 0:
            queue.put(peak)
    finally:
        dist.destroy_process_group()


def measured(setup: P.Setup, tmp_path) -> dict[str, int]:
    """Rank 0's real peak by category, in a gloo world of setup.world_size spawned processes."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = str(tmp_path / f"store-{os.getpid()}-{setup.world_size}-{setup.dtype}")
    procs = [ctx.Process(target=_measure_rank, args=(r, setup.world_size, store, setup, queue))
             for r in range(setup.world_size)]
    for p in procs:
        p.start()
    result = queue.get(timeout=900)
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    return result


CASES = {
    "tiny-w1-full-fp32": ("tiny", 1, False, False, "float32", 512),
    "tiny-w2-full-bf16-ac": ("tiny", 2, False, True, "bfloat16", 512),
    "small-w1-lora-bf16-ac": ("small", 1, True, True, "bfloat16", 256),
    "small-w2-full-fp32": ("small", 2, False, False, "float32", 256),
}


@pytest.mark.parametrize("case", [c if c == "tiny-w1-full-fp32" else pytest.param(c, marks=pytest.mark.slow)
                                  for c in CASES])  # one in the fast loop; a world of 2 or `small`: slow
def test_plan_is_within_10_percent_of_the_measured_peak(case, tmp_path):
    name, world, use_lora, ac, dtype, tokens = CASES[case]
    setup = P.Setup(preset(name), world, LoraParams(enabled=use_lora), ac, dtype, tokens)
    plan = P.fake_peak(setup)
    real = measured(setup, tmp_path)
    assert abs(sum(plan.values()) - sum(real.values())) <= 0.10 * sum(real.values()), (plan, real)
    for k in ("params", "gradients", "optimizer"):  # these are counted exactly, not estimated
        assert abs(plan[k] - real[k]) <= 0.02 * max(real[k], 1), (k, plan, real)


@pytest.mark.slow
def test_the_rank_peak_tracker_finds_torchs_own_peak(monkeypatch):
    """rank_peak_tracker overrides a private method of torch's FSDPMemTracker: its peak must stay torch's."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    name, world, use_lora, ac, dtype, tokens = CASES["tiny-w2-full-bf16-ac"]
    setup = P.Setup(preset(name), world, LoraParams(enabled=use_lora), ac, dtype, tokens)
    with P.fake_world(world) as rt:
        ours = P.tracked_peak(setup, rt, fake=True)
    monkeypatch.setattr(P, "rank_peak_tracker", FSDPMemTracker)
    with P.fake_world(world) as rt:
        assert P.tracked_peak(setup, rt, fake=True) == ours


SMALL_FULL = P.Setup(preset("small"), 1, LoraParams(enabled=False), True, "float32", 256)


def test_the_optimizer_is_the_fused_one_not_the_cpu_foreach():
    """AdamW state is 2 x the fp32 params (two moments), not foreach's ~10x of temporaries."""
    peak = P.fake_peak(SMALL_FULL)  # the next test's plan: planned once
    assert 1.9 * peak["params"] <= peak["optimizer"] <= 2.1 * peak["params"], peak


def test_lora_keeps_the_frozen_base_in_the_compute_dtype():
    lora = P.Setup(preset("small"), 1, LoraParams(enabled=True), True, "bfloat16", 256)
    lora_params, fp32_params = P.fake_peak(lora)["params"], P.fake_peak(SMALL_FULL)["params"]
    assert lora_params < 0.6 * fp32_params, (lora_params, fp32_params)  # bf16 base + small fp32 adapters


def test_cli_prints_one_json_object_with_the_planned_figures(capsys, tmp_path):
    (tmp_path / "empty.yaml").write_text("")  # the schema's defaults
    code = main(["plan", "--params", str(tmp_path / "empty.yaml"), "--set", "model.base=" + str(tmp_path),
                 "--set", "plan.device=rtx-4090", "--set", "train.max_tokens=256", "--set", "local.nproc=1",
                 "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)  # exactly one object: json.loads refuses anything after it
    assert {"world_size", "device", "device_memory_gib", "peak_gib", "by_category_gib", "fits",
            "largest_max_tokens", "host_peak_gib", "host_by_phase_gib"} <= out.keys()
    assert set(out["host_by_phase_gib"]) == {"load", "export"}
    assert set(out["by_category_gib"]) == {"params", "gradients", "optimizer", "activations", "other", "ema"}
    assert out["by_category_gib"]["ema"] == 0  # train.ema_decay is off by default
    assert (out["world_size"], out["device"], out["device_memory_gib"]) == (1, "rtx-4090", 24.0)
    assert out["fits"] is True
    assert out["largest_max_tokens"] > 256
    assert out["peak_gib"] == pytest.approx(sum(out["by_category_gib"].values()), abs=0.01)


def test_the_ema_copy_is_counted_on_the_device_and_in_the_checkpoint(capsys, tmp_path):
    """train.ema_decay: one more copy of the trainable shards (full fine-tune: every fp32 master, so as
    much as the params category), alive through the step and written into every checkpoint."""
    (tmp_path / "empty.yaml").write_text("")
    common = ["plan", "--params", str(tmp_path / "empty.yaml"), "--set", "model.base=" + str(tmp_path),
              "--set", "model.preset=tiny", "--set", "plan.device=rtx-4090", "--set", "train.max_tokens=256",
              "--set", "local.nproc=2", "--set", "train.dtype=float32", "--json"]
    plans = []
    for decay in ("0", "0.999"):
        assert main([*common, "--set", f"train.ema_decay={decay}"]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    off, on = plans
    extra = on["by_category_gib"]["ema"]
    assert extra > 0 and extra == pytest.approx(on["by_category_gib"]["params"], rel=0.02)
    assert on["peak_gib"] == pytest.approx(off["peak_gib"] + extra, abs=0.002)
    setup = P.Setup(preset("tiny"), 2, LoraParams(), False, "float32", 256)
    ema_setup = P.Setup(preset("tiny"), 2, LoraParams(), False, "float32", 256, ema=True)
    assert P.ema_bytes_per_rank(setup) == 0
    extra_bytes = P.ema_bytes_per_rank(ema_setup)
    assert P.checkpoint_bytes_per_rank(ema_setup) == P.checkpoint_bytes_per_rank(setup) + extra_bytes
    lora_setup = P.Setup(preset("tiny"), 2, LoraParams(enabled=True), False, "float32", 256, ema=True)
    assert P.ema_bytes_per_rank(lora_setup) < 0.2 * P.ema_bytes_per_rank(ema_setup)  # the adapters only


def test_world_size_comes_from_the_launcher_the_plan_names():
    from voxpipe.params import load_params

    local = load_params(None, ["local.nproc=3", "launch.pods=2", "launch.devices_per_pod=8"])
    assert P.world_size(local) == 3
    cluster = load_params(None, ["local.nproc=3", "launch.pods=2", "launch.devices_per_pod=8",
                                 "plan.launcher=launch"])
    assert P.world_size(cluster) == 16


def _plan(peak: float, largest: int | None = 1024) -> P.Plan:
    cats = {"params": peak / 2, "gradients": 0.0, "optimizer": 0.0, "activations": peak / 2, "other": 0.0}
    return P.Plan(world_size=1, device="h100-80gb", device_memory_gib=80.0, peak_gib=peak,
                  by_category_gib=cats, fits=True, largest_max_tokens=largest, host_peak_gib=1.0,
                  host_by_phase_gib={"load": 0.5, "export": 1.0},
                  max_tokens=4096, micro_batch=[1, 4096], headroom=0.1, checkpoint_gib_per_rank=1.0,
                  checkpoint_write_gbps=0.1, checkpoint_save_seconds=10.7)


def test_train_refuses_a_plan_that_does_not_fit_the_free_memory():
    """The decision behind train's check, with the device's free memory given instead of queried."""
    assert P.fits_free_memory(_plan(10.0), free=20 * GIB, headroom=0.1) is None
    message = P.fits_free_memory(_plan(19.0), free=20 * GIB, headroom=0.1)
    assert message is not None and "\n" not in message
    for part in ("19.00 GiB", "20.00 GiB free", "largest train.max_tokens that fits is 1024",
                 "activation_checkpointing", "lora", "more devices"):
        assert part in message, part
    assert "not even" in P.fits_free_memory(_plan(30.0, None), free=20 * GIB, headroom=0.1)


@pytest.mark.slow
def test_train_checks_the_plan_only_on_an_accelerator(monkeypatch, tmp_path):
    """The real plan (tiny, in its own process, as train makes it) against an injected free memory:
    the device query is the only stand-in. On CPU train keeps the host-RAM check."""
    from voxpipe.params import load_params

    params = load_params(None, [f"model.base={tmp_path}", "model.preset=tiny", "train.max_tokens=256"])
    assert P.plan_verdict(params, torch.device("cpu"), 1, "float32") is None
    monkeypatch.setattr(P, "free_device_memory", lambda device: 64 * GIB)
    assert P.plan_verdict(params, torch.device("cuda", 0), 1, "bfloat16") is None
    monkeypatch.setattr(P, "free_device_memory", lambda device: int(0.03 * GIB))  # tiny's peak: ~0.04
    message = P.plan_verdict(params, torch.device("cuda", 0), 1, "bfloat16")
    assert message and "0.03 GiB free" in message and "largest train.max_tokens that fits is" in message


# -- issue 34: the planner is bounded: inputs checked against the schema before anything is built --------
@pytest.mark.parametrize(("flag", "value", "key", "bound"), [
    ("--train-max-tokens", "1e9", "train.max_tokens", "less than or equal to 1048576"),
    ("--local-nproc", "1e6", "local.nproc", "less than or equal to 64"),
    ("--device-memory-gib", "1e300", "plan.device_memory_gib", "less than or equal to 4096"),
])
def test_out_of_bounds_inputs_end_at_once_naming_the_key_and_its_bound(flag, value, key, bound, capsys,
                                                                         monkeypatch):
    """`--train-max-tokens 1e9` allocated 18 GB, `--local-nproc 1e6` never returned, `--device-memory-gib
    1e300` was an OverflowError traceback: now the schema refuses each before the planner is imported."""
    monkeypatch.setattr(P, "setup_of", lambda params: pytest.fail("planned an out-of-bounds input"))
    assert main(["plan", flag, value]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n\n") == 0
    assert f"{key}: Input should be {bound}" in err


def test_a_model_base_that_does_not_exist_is_an_error_unless_the_preset_is_asked_for(tmp_path, capsys):
    missing = tmp_path / "VoxCPM2"
    common = ["plan", "--params", str(tmp_path / "empty.yaml"), "--set", f"model.base={missing}",
              "--set", "plan.device=rtx-4090", "--set", "train.max_tokens=256", "--set", "local.nproc=1"]
    (tmp_path / "empty.yaml").write_text("")
    assert main(common) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"model.base {missing}: no such folder" in err
    assert "--model-base" in err and "plan.missing_base=preset" in err
    # the recipes' way: planned as model.preset's shape before the checkpoint is downloaded
    assert main([*common, "--set", "plan.missing_base=preset", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 1
