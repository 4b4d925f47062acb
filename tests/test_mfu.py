"""The analytic FLOPs model against torch's FlopCounterMode, the peak table, and the `mfu` step."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from voxpipe.cli import main
from voxpipe.mfu.flops import (
    batch_rows,
    batch_training_flops,
    forward_flops,
    training_flops,
)
from voxpipe.mfu.peak import UnknownPeakError, lookup_peak, measure_cpu_gemm_peak, peak_flops, table_peak
from voxpipe.mfu.published import PUBLISHED, frames_only_flops, published_check
from voxpipe.model.config import preset
from voxpipe.model.rows import host_rows
from voxpipe.model.voxcpm2 import VoxCPM2

# tiny/small at training-like shapes, voxcpm2 at the published configuration (B=4, L=830)
SHAPES = {"tiny": (2, 37), "small": (4, 200), "voxcpm2": (4, 830)}
# module prefixes of the counter -> our towers
MODULES = {
    "VoxCPM2.base_lm": "base_lm",
    "VoxCPM2.residual_lm": "residual_lm",
    "VoxCPM2.feat_encoder": "local_encoder",
    "VoxCPM2.feat_decoder": "local_dit",
    "VoxCPM2.fsq_layer": "fsq",
}


def make_batch(config, b: int, length: int, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A right-padded training batch: text, audio_start, target patches, then padding."""
    p, d = config.patch_size, config.feat_dim
    text = length // 4
    audio = torch.zeros(b, length)
    audio[:, text + 1 : length - 2] = 1
    text_mask = torch.zeros(b, length)
    text_mask[:, : text + 1] = 1
    labels = torch.zeros(b, length, dtype=torch.long)
    labels[:, length - 3] = 1
    tokens = torch.randint(110, config.lm_config.vocab_size, (b, length)) * text_mask.long()
    batch = {
        "text_tokens": tokens,
        "text_mask": text_mask,
        "audio_feats": torch.randn(b, length, p, d),
        "audio_mask": audio,
        "loss_mask": audio,
        "position_ids": torch.arange(length).expand(b, length),
        "labels": labels,
    }
    return {name: value.to(device) for name, value in batch.items()}


# small runs a real fwd+bwd at B=4, L=200: with the slow tests (tiny and the meta-device real shape stay fast)
@pytest.fixture(scope="module", params=[pytest.param(n, marks=pytest.mark.slow) if n == "small" else n
                                        for n in SHAPES])
def counted(request):
    """(config, B, L, rows per tower, forward counter, forward+backward total) of our VoxCPM2.

    The batch's row plan (rows.py) is made on the host, as the trainer makes it, so the count sees
    each tower run on its rows; the real shape then runs on the meta device.
    """
    config = preset(request.param)
    b, length = SHAPES[request.param]
    batch = make_batch(config, b, length)
    rows = batch_rows(batch)
    assert rows["lm_rows"] < b * length and rows["dit_rows"] < b * length  # rows really left out
    batch = {**batch, **host_rows(batch)}
    on_meta = request.param == "voxcpm2"
    with torch.device("meta" if on_meta else "cpu"):
        model = VoxCPM2(config)
    if on_meta:
        batch = {name: value.to("meta") for name, value in batch.items()}
    with sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as forward:
            model(**batch)
        with FlopCounterMode(display=False) as both:
            losses = model(**batch)
            (losses["loss/diff"] + losses["loss/stop"]).backward()
    return config, b, length, rows, forward, both.get_total_flops()


def test_forward_flops_agree_with_flop_counter(counted):
    config, b, length, rows, forward, _ = counted
    ours = forward_flops(config, b, length, **rows)
    assert sum(ours.values()) == pytest.approx(forward.get_total_flops(), rel=0.02)
    counts = forward.get_flop_counts()
    for module, tower in MODULES.items():
        assert ours[tower] == pytest.approx(sum(counts[module].values()), rel=0.02), tower


def test_training_flops_are_three_forwards_like_the_counter(counted):
    config, b, length, rows, _, both = counted
    # backward skips input grads of the first layers (data needs none), so the counter is just under 3x
    ours = training_flops(config, b, length, **rows)
    assert ours == pytest.approx(both, rel=0.02)


def test_causal_half_removes_half_of_the_lm_attention_matmuls(counted):
    config, b, length, rows, forward, _ = counted
    counts = forward.get_flop_counts()
    lm_attention = sum(
        counts[m].get(torch.ops.aten.bmm, 0) for m in ("VoxCPM2.base_lm", "VoxCPM2.residual_lm")
    )
    assert lm_attention > 0
    removed = training_flops(config, b, length, **rows) - training_flops(config, b, length, True, **rows)
    assert removed == pytest.approx(3 * lm_attention / 2, rel=1e-9)


def test_batch_flops_read_the_padded_shape_and_the_rows_each_tower_runs_on():
    config = preset("tiny")
    batch = make_batch(config, 3, 21)
    # make_batch: text + audio_start, then audio (the loss rows), then 2 padding
    dit_rows = 3 * (21 - 3 - 21 // 4)
    lm_rows = 3 * (21 - 3)  # each sequence up to its last loss row
    rows = {"dit_rows": dit_rows, "enc_rows": dit_rows - 3, "lm_rows": lm_rows}  # audio before the last
    assert batch_rows(batch) == rows
    assert batch_training_flops(config, batch) == training_flops(config, 3, 21, **rows)
    assert batch_training_flops(config, batch) < training_flops(config, 3, 21)
    batch["loss_mask"] = torch.zeros_like(batch["loss_mask"])  # every tower still runs one row
    assert batch_rows(batch) == {"dit_rows": 1, "enc_rows": 1, "lm_rows": 1}
    batch["audio_feats"] = batch["audio_feats"][:, :, :2]
    with pytest.raises(ValueError, match="audio_feats must be"):
        batch_training_flops(config, batch)


@pytest.mark.parametrize(
    "name, tflops, label",
    [
        ("NVIDIA H200", 989, "H200"),
        ("NVIDIA H20", 148, "H20"),
        ("NVIDIA H100 80GB HBM3", 989, "H100 SXM"),
        ("NVIDIA H100 PCIe", 756, "H100 PCIe"),
        ("NVIDIA A100-SXM4-80GB", 312, "A100"),
        ("AMD Instinct MI300X", 1300, "MI300X"),
        ("NVIDIA L40S", 362, "L40S"),
        # the names torch_npu reports for 910B and 910C dies; CANN formula cube cores x 16^3 x 2 x GHz
        ("Ascend910B1", 353.8944, "Ascend 910B1"),
        ("Ascend910B2", 353.8944, "Ascend 910B2"),
        ("Ascend910B2C", 353.8944, "Ascend 910B2"),
        ("Ascend910B3", 294.912, "Ascend 910B3"),
        ("Ascend910B4", 245.76, "Ascend 910B4"),
        ("Ascend910B4-1", 245.76, "Ascend 910B4"),
        ("Ascend910_9391", 353.8944, "Ascend 910C die"),
        ("Ascend910_9392", 353.8944, "Ascend 910C die"),
        ("Ascend910_9381", 353.8944, "Ascend 910C die"),
        ("Ascend910_9382", 353.8944, "Ascend 910C die"),
        ("Ascend910_9372", 294.912, "Ascend 910C die (B3 class)"),
        ("Ascend910_9362", 245.76, "Ascend 910C die (B4 class)"),
    ],
)
def test_peak_table_by_device_name(name, tflops, label):
    value, source = table_peak(name)
    assert value == pytest.approx(tflops * 1e12) and source.startswith(f"table: {label} (")
    assert "datasheet" in source or "cube cores x 16^3 x 2" in source  # every entry names its source


@pytest.mark.parametrize("name", ["Ascend910_9382", "Ascend910_9391", "Ascend910B2"])
def test_the_ports_dies_peak_at_353_9_tflops(name):
    assert round(lookup_peak(name)[0] / 1e12, 1) == 353.9


def test_peak_override_unknown_device_and_dtype_note():
    assert peak_flops("cpu", "float32", override=123e12) == (123e12, "override")
    with pytest.raises(UnknownPeakError, match="Tesla T4.*mfu.peak_tflops"):
        lookup_peak("Tesla T4")
    assert lookup_peak("NVIDIA H200", "float32")[1].endswith("(bf16 peak; training dtype float32)")
    with pytest.raises(ValueError, match="positive"):
        peak_flops("cpu", "float32", override=0.0)


def test_a_cpu_has_no_peak_unless_given_and_the_benchmarks_gemm_is_measured_once():
    """A GEMM benchmark moves with a shared machine's load, so it is never MFU's denominator."""
    with pytest.raises(UnknownPeakError, match="CPU has no recorded peak.*mfu.peak_tflops"):
        peak_flops("cpu", torch.float32)
    threads = torch.get_num_threads()
    value = measure_cpu_gemm_peak(torch.float32, threads)
    assert math.isfinite(value) and value > 0
    assert measure_cpu_gemm_peak(torch.float32, threads) == value  # cached, not re-measured
    assert torch.get_num_threads() == threads  # measuring with other thread counts restores ours


def test_published_configuration():
    check = published_check()
    assert check["parameters"] == pytest.approx(2.29e9, rel=0.01)  # docs/accelerators.md: the model's size
    assert check["peak_flops"] == pytest.approx(353.9e12, rel=1e-3)
    rows = check["conventions"]
    # the reconstructed convention reproduces their 87.1 TFLOP/s x 0.987 s
    frames = frames_only_flops(preset("voxcpm2"), PUBLISHED.batch_size, PUBLISHED.seq_len)
    assert frames == pytest.approx(PUBLISHED.flops_per_step, rel=0.005)
    ours = rows["voxpipe (full attention square)"]
    assert ours["flops_per_step"] == training_flops(preset("voxcpm2"), 4, 830)
    assert ours["mfu"] == pytest.approx(ours["flops_per_step"] / 0.987 / check["peak_flops"])
    assert ours["vs_published"] > 0.15  # we count the local towers' extra inner tokens


# -- the `voxpipe mfu` step on a real (tiny) training run ------------------------------------------
@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> tuple:
    """Time 3 real fwd+bwd+AdamW steps of the tiny model; write the train step's report and metrics."""
    tmp_path = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    config = preset("tiny")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(config.to_json())
    model = VoxCPM2(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lines = []
    for step in range(1, 4):
        batch = make_batch(config, 2, 24 + 8 * step)
        start = time.perf_counter()
        losses = model(**batch)
        (losses["loss/diff"] + losses["loss/stop"]).backward()
        opt.step()
        opt.zero_grad()
        line = {
            "step": step,
            "step_time_s": time.perf_counter() - start,
            "shapes": [[2, 24 + 8 * step, *batch_rows(batch).values()]],
            "real_tokens": int((batch["text_mask"] + batch["audio_mask"]).sum()),
        }
        if step != 2:  # step 2 exercises the fallback from shapes
            line["flops"] = batch_training_flops(config, batch)
            line["tokens"] = 2 * (24 + 8 * step)
        lines.append(line)
    run = tmp_path / "train"
    run.mkdir()
    metrics = [json.dumps(x) for x in lines]
    metrics.insert(1, json.dumps({"step": 1, "val/loss": 1.0}))  # a validation line is not a step
    (run / "metrics.jsonl").write_text("\n".join(metrics) + "\n")
    report = {"world_size": 1, "device_type": "cpu", "device_name": "cpu", "dtype": "float32",
              "tokens_per_s": 900.0, "cpu_threads": 1}
    (run / "report.json").write_text(json.dumps(report))
    return config, model_dir, run, lines


def _copy(real_run, tmp_path) -> tuple:
    """A private copy of the run folder for tests that damage it."""
    _, model_dir, run, _ = real_run
    return model_dir, Path(shutil.copytree(run, tmp_path / "train"))


def test_mfu_step_reports_a_real_run(real_run, tmp_path):
    config, model_dir, run, lines = real_run
    out = tmp_path / "mfu"
    args = ["mfu", "--model-base", str(model_dir), "--train-report", str(run / "report.json"),
            "--out", str(out)]
    assert main(args) == 0
    figures = json.loads((out / "mfu.json").read_text())
    used = lines[1:]  # warmup_steps = 1
    seconds = sum(x["step_time_s"] for x in used)
    flops = sum(training_flops(config, b, n, dit_rows=rows, enc_rows=enc, lm_rows=lm)
                for x in used for b, n, rows, enc, lm in x["shapes"])
    assert figures["steps_measured"] == 2 and figures["steps_skipped"] == 1
    assert figures["achieved_tflops_per_device"] == pytest.approx(flops / seconds / 1e12)
    # a CPU: no recorded peak, so no MFU (null with the reason), and tokens/s is the speed figure
    assert figures["mfu"] is None and figures["peak_tflops"] is None and figures["mfu_causal_half"] is None
    assert "CPU has no recorded peak" in figures["mfu_null_reason"]
    assert figures["tokens_per_s"] == 900.0  # the train report's, the one headline throughput
    assert figures["padded_tokens_per_s_per_device"] == pytest.approx(
        sum(2 * x["shapes"][0][1] for x in used) / seconds)
    assert set(figures["throughput_definitions"]) == {"tokens_per_s", "padded_tokens_per_s_per_device"}
    assert sum(figures["tower_shares"].values()) == pytest.approx(1.0)
    md = (out / "mfu.md").read_text()
    assert "## Check against a published figure" in md and "99.4 TFLOP per step" in md
    assert "null: a CPU has no recorded peak" in md and "| 900 |" in md
    assert json.loads((out / "report.json").read_text())["mfu"] is None

    assert main([*args, "--peak-tflops", "2.5"]) == 0  # a recorded peak: the same figures every run
    figures = json.loads((out / "mfu.json").read_text())
    assert (figures["peak_tflops"], figures["peak_source"]) == (2.5, "override")
    assert figures["mfu"] == pytest.approx(figures["achieved_tflops_per_device"] / 2.5)
    assert figures["mfu_causal_half"] < figures["mfu"]


def test_mfu_step_names_bad_inputs(real_run, tmp_path, capsys):
    model_dir, run = _copy(real_run, tmp_path)
    args = ["mfu", "--model-base", str(model_dir), "--train-report", str(run / "report.json"),
            "--out", str(tmp_path / "mfu"), "--peak-tflops", "1"]
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "step_time_s": 0.1}) + "\n")
    assert main(args) == 1
    assert "metrics.jsonl line 5: a step line needs 'flops' or 'shapes'" in capsys.readouterr().err
    no_name = {"world_size": 1, "device_type": "cuda", "dtype": "bfloat16"}
    (run / "report.json").write_text(json.dumps(no_name))
    assert main(args) == 1
    assert "key 'device_name' missing" in capsys.readouterr().err


def test_an_unknown_accelerator_gives_mfu_null_and_exit_0(real_run, tmp_path, capsys):
    model_dir, run = _copy(real_run, tmp_path)
    report = {"world_size": 8, "device_type": "cuda", "device_name": "Tesla T4", "dtype": "bfloat16"}
    (run / "report.json").write_text(json.dumps(report))
    out = tmp_path / "mfu"
    with pytest.warns(UserWarning, match="mfu: null.*Tesla T4.*mfu.peak_tflops"):
        code = main(["mfu", "--model-base", str(model_dir), "--train-report", str(run / "report.json"),
                     "--out", str(out)])
    assert code == 0
    figures = json.loads((out / "mfu.json").read_text())
    assert figures["mfu"] is None and figures["peak_tflops"] is None
    assert "Tesla T4" in figures["mfu_null_reason"] and figures["peak_key"] == "mfu.peak_tflops"
    assert figures["achieved_tflops_per_device"] > 0  # the run's own figures still count
    assert "mfu: null" in capsys.readouterr().out
    assert "unknown: set mfu.peak_tflops" in (out / "mfu.md").read_text()


def test_the_run_description_gives_a_null_mfu_with_its_reason():
    """MLflow's run description (track/note.py): a CPU's MFU is n/a with the reason, never a number."""
    from voxpipe.mfu.peak import CPU_NO_PEAK
    from voxpipe.track.artifacts import PipelineArtifacts
    from voxpipe.track.note import run_note

    def note(mfu: dict) -> str:
        return run_note(PipelineArtifacts(
            export=Path("export"), export_md5="x", model_config={}, train_dir=Path("train"),
            train_report={"tokens_per_s": 900.0}, metrics=[], eval_path=Path("eval.json"), eval={},
            samples=[], mfu_path=Path("mfu.json"), mfu=mfu, data=None))

    assert f"- MFU: n/a ({CPU_NO_PEAK})" in note({"mfu": None, "mfu_null_reason": CPU_NO_PEAK})
    assert "- MFU: 1.23 % (override)" in note({"mfu": 0.0123, "peak_source": "override"})
    assert "900 tokens/s" in note({"mfu": None, "mfu_null_reason": CPU_NO_PEAK})
