"""Issue 47 part 3: the pods' grace period from the plan (launch.grace_seconds: auto), a number as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxpipe.launch.grace import FACTOR, MARGIN_SECONDS
from voxpipe.launch.pod import StepJob
from voxpipe.launch.trainjob import render_trainjob
from voxpipe.launch.volcano import render_job
from voxpipe.params import load_params
from voxpipe.train import plan as P

ROOT = Path(__file__).resolve().parents[1]


def volcano_grace(job: dict) -> tuple[int, str]:
    """The pod's grace and torchrun's shutdown timeout in its command."""
    pod = job["spec"]["tasks"][0]["template"]["spec"]
    return pod["terminationGracePeriodSeconds"], pod["containers"][0]["args"][-1]


def planned(params) -> float:
    t, launch = params.train, params.launch
    setup = P.Setup(P.model_config_or_preset(params), launch.pods * launch.devices_per_pod, t.lora,
                    t.activation_checkpointing, P.compute_dtype_name(params), t.max_tokens)
    return P.checkpoint_save_seconds(setup, params.plan.checkpoint_write_gbps)


def test_auto_is_the_plans_save_time_plus_a_margin_in_the_pod_and_in_torchrun():
    params = load_params(ROOT / "params.yaml", recipe="voxcpm2-full-npu16")
    assert params.launch.grace_seconds == "auto"
    grace, script = volcano_grace(render_job(params, "ml"))
    assert grace == MARGIN_SECONDS + int(-(-FACTOR * planned(params) // 1))
    assert grace > MARGIN_SECONDS and f"--shutdown_timeout={grace} " in script


def test_a_slower_volume_or_a_smaller_world_gives_a_longer_grace_and_a_number_wins():
    recipe = "voxcpm2-full-npu16"
    base = volcano_grace(render_job(load_params(ROOT / "params.yaml", recipe=recipe), "ml"))[0]
    slow = load_params(ROOT / "params.yaml", recipe=recipe,
                       overrides=["plan.checkpoint_write_gbps=0.01"])
    small = load_params(ROOT / "params.yaml", recipe=recipe, overrides=["launch.pods=1"])
    assert volcano_grace(render_job(slow, "ml"))[0] > base
    assert volcano_grace(render_job(small, "ml"))[0] > base
    fixed = load_params(ROOT / "params.yaml", recipe=recipe, overrides=["launch.grace_seconds=900"])
    grace, script = volcano_grace(render_job(fixed, "ml"))
    assert grace == 900 and "--shutdown_timeout=900 " in script


def test_the_trainjob_runtime_carries_the_planned_grace_and_encode_only_the_margin():
    params = load_params(ROOT / "params.yaml", recipe="voxcpm2-lora-npu8",
                         overrides=["launch.backend=trainjob"])
    runtime, _ = render_trainjob(params, "ml")
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    grace = replicated["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == MARGIN_SECONDS + int(-(-FACTOR * planned(params) // 1))
    runtime, _ = render_trainjob(params, "ml", job=StepJob.encode(params.launch))
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == MARGIN_SECONDS


@pytest.mark.parametrize("value", ["-1", "soon", "0.5"])
def test_a_grace_that_is_neither_auto_nor_a_whole_number_of_seconds_is_refused(value, capsys):
    from voxpipe.errors import StepError

    with pytest.raises(StepError, match="launch.grace_seconds"):
        load_params(ROOT / "params.yaml", overrides=[f"launch.grace_seconds={value}"])


def test_a_bandwidth_that_is_not_positive_is_refused():
    from voxpipe.errors import StepError

    with pytest.raises(StepError, match="plan.checkpoint_write_gbps"):
        load_params(ROOT / "params.yaml", overrides=["plan.checkpoint_write_gbps=0"])
