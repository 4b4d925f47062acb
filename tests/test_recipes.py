"""recipes/: each loads through the schema layered on params.yaml, renders its Volcano job, states its
memory and step-time figures with their source, and reaches DVC (params.yaml), KFP and the CLI alike."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from voxpipe.cli import main
from voxpipe.errors import StepError
from voxpipe.launch.pod import PARAMS_ENV, job_yaml
from voxpipe.launch.volcano import render_job
from voxpipe.params import Params, load_params, recipe_names

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["demo-cpu", "demo-raw", "voxcpm2-full-gpu8-24g", "voxcpm2-full-npu16", "voxcpm2-lora-gpu1",
           "voxcpm2-lora-gpu1-24g", "voxcpm2-lora-npu8"]
K8S_VERSION = kubernetes_validate.latest_version()


def test_the_recipes_are_shipped():
    assert recipe_names() == RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_states_memory_and_step_time_with_a_source(name):
    lines = (ROOT / "recipes" / f"{name}.yaml").read_text().splitlines()
    header = " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))
    for label in ("memory:", "step time:", "source:"):
        assert label in header, f"recipes/{name}.yaml: no {label!r} line in its header"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_loads_through_the_schema_and_renders_its_volcano_job(name):
    params = load_params(ROOT / "params.yaml", recipe=name)
    overlay = yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())
    for section, values in overlay.items():  # every key the recipe sets wins over params.yaml
        dumped = params.model_dump(by_alias=True)[section]
        for key, value in values.items():
            if not isinstance(value, dict):
                assert dumped[key] == value, f"{section}.{key}"
    job = render_job(params, "ml")
    tasks = job["spec"]["tasks"]
    assert job["spec"]["minAvailable"] == sum(t["replicas"] for t in tasks) == params.launch.pods
    for task in tasks:
        spec = task["template"]["spec"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"j-{task['name']}-0"}, "spec": spec}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        container = spec["containers"][0]
        assert f"--nproc_per_node={params.launch.devices_per_pod}" in container["args"][-1]
        if params.launch.accelerator:
            limits = container["resources"]["limits"]
            assert limits[params.launch.accelerator] == params.launch.devices_per_pod
        carried = next(e["value"] for e in container["env"] if e["name"] == PARAMS_ENV)
        in_pod = Params.model_validate(yaml.safe_load(carried))
        assert (in_pod.train, in_pod.model.base, in_pod.tracking) == (params.train, params.model.base,
                                                                       params.tracking)
    assert job_yaml(job)


def test_precedence_file_then_recipe_then_set_then_flag(tmp_path):
    own = tmp_path / "params.yaml"
    own.write_text("train:\n  max_steps: 5\n  seed: 3\nmodel:\n  base: mine\n")
    p = load_params(own, recipe="voxcpm2-lora-gpu1")
    assert (p.train.max_steps, p.model.base, p.train.seed) == (1000, "models/VoxCPM2", 3)  # seed: not in it
    p = load_params(own, ["train.max_steps=7"], recipe="voxcpm2-lora-gpu1")
    assert p.train.max_steps == 7
    p = load_params(own, ["train.max_steps=7"], {"train.max_steps": 9}, recipe="voxcpm2-lora-gpu1")
    assert p.train.max_steps == 9


def test_unknown_recipe_names_the_ones_there_are(tmp_path):
    with pytest.raises(StepError, match="no recipe 'nope'.*demo-cpu.*voxcpm2-lora-npu8"):
        load_params(None, recipe="nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  max_stepz: 3\n")
    with pytest.raises(StepError, match=r"(?s)recipe .*bad\.yaml.*train\.max_stepz: unknown key"):
        load_params(None, recipe=str(bad))


def test_demo_cpu_is_todays_default():
    assert load_params(ROOT / "params.yaml", recipe="demo-cpu") == load_params(ROOT / "params.yaml")


def test_recipe_reaches_dvc_through_params_yaml(tmp_path, monkeypatch):
    """`make repro RECIPE=NAME` writes the recipe into params.yaml, where `dvc repro` reads and tracks it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    assert main(["params", "--recipe", "voxcpm2-lora-npu8", "--write", "params.yaml"]) == 0
    written = load_params(tmp_path / "params.yaml")
    assert written == load_params(ROOT / "params.yaml", recipe="voxcpm2-lora-npu8")
    assert written.local.nproc == 8 and written.train.lora.enabled


def test_recipe_reaches_kfp_as_the_pipeline_defaults(tmp_path):
    from pipelines.common import compile_pipeline
    from pipelines.finetune import finetune_pipeline

    out = tmp_path / "finetune-npu8.yaml"
    compile_pipeline(finetune_pipeline(), str(out), recipe="voxcpm2-lora-npu8")
    spec = next(yaml.safe_load_all(out.read_text()))
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    train = inputs["train"]["defaultValue"]
    assert train["lora"]["enabled"] is True and train["max_steps"] == 1000 and train["device"] == "npu"
    assert isinstance(train["max_steps"], int)  # the schema's int, not protobuf's 1000.0
    assert inputs["base_model"]["defaultValue"] == "models/VoxCPM2"
    assert inputs["accelerator"]["defaultValue"] == "huawei.com/Ascend910"
    assert "'max_steps': 1000," in out.read_text().split("\n# ", 1)[0] + out.read_text()


# -- planned memory figures ---------------------------------------------------------------------------
def memory_line(name: str, plan: dict) -> str:
    """A recipe's memory paragraph: `voxpipe plan --recipe NAME --json` in words (MEMORY_RE reads it)."""
    c = plan["by_category_gib"]
    text = (f"memory: planned with `voxpipe plan --recipe {name} --json`: peak {plan['peak_gib']:.2f} GiB "
            f"per device: params {c['params']:.2f}, gradients {c['gradients']:.2f}, optimizer "
            f"{c['optimizer']:.2f}, activations {c['activations']:.2f}, other {c['other']:.2f} GiB; "
            f"micro-batch "
            f"{plan['micro_batch'][0]} x {plan['micro_batch'][1]}, world of {plan['world_size']}")
    if plan["device"] != "cpu":  # the CPU's figure is this host's free RAM: not a recipe's fact
        verdict = "fits" if plan["fits"] else "does not fit"
        text += (f"; {plan['device']} ({plan['device_memory_gib']:g} GiB): {verdict} with "
                 f"{plan['headroom']:.0%} headroom; largest train.max_tokens that fits: "
                 f"{plan['largest_max_tokens']}")
    phases = plan["host_by_phase_gib"]
    text += (f"; host peak {plan['host_peak_gib']:.2f} GiB on rank 0 (loading {phases['load']:.2f}, "
             f"exporting {phases['export']:.2f}).")
    return "\n".join(textwrap.wrap(text, 106, initial_indent="# ", subsequent_indent="#   "))


MEMORY_RE = re.compile(
    r"memory: planned with `voxpipe plan --recipe (?P<name>\S+) --json`: peak (?P<peak>[\d.]+) GiB per "
    r"device: params (?P<params>-?[\d.]+), gradients (?P<gradients>-?[\d.]+), optimizer "
    r"(?P<optimizer>-?[\d.]+), activations (?P<activations>-?[\d.]+), other (?P<other>-?[\d.]+) GiB; "
    r"micro-batch (?P<rows>\d+) x (?P<length>\d+), world of (?P<world>\d+)(; (?P<device>\S+) "
    r"\((?P<memory>[\d.]+) GiB\): (?P<fits>fits|does not fit) with \d+ ?% headroom; largest "
    r"train.max_tokens that fits: (?P<largest>\d+|None))?; host peak (?P<host>[\d.]+) GiB on rank 0 "
    r"\(loading (?P<load>[\d.]+), exporting (?P<export>[\d.]+)\)"
)


def stated(name: str) -> re.Match:
    lines = (ROOT / "recipes" / f"{name}.yaml").read_text().splitlines()
    header = " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))
    match = MEMORY_RE.search(header)
    assert match, f"recipes/{name}.yaml: no planned memory line (tests/test_recipes.py memory_line)"
    return match


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_memory_is_the_planners_with_its_command(name):
    match = stated(name)
    assert match["name"] == name
    params = load_params(ROOT / "params.yaml", recipe=name)
    assert match["device"] == (None if params.plan.device == "cpu" else params.plan.device)


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_recipe_memory_figures_are_current(name, capsys):
    """A fresh plan gives the recipe's stated figures (minutes per real-shape recipe the first time;
    plans are cached by setup and code fingerprint, so a change to the model or sharding code replans)."""
    assert main(["plan", "--params", str(ROOT / "params.yaml"), "--recipe", name, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    match = stated(name)
    figures = {"peak": plan["peak_gib"], **plan["by_category_gib"]}
    for key in ("peak", "params", "gradients", "optimizer", "activations", "other"):
        assert float(match[key]) == pytest.approx(figures[key], abs=0.006), (name, key)
    host = {"host": plan["host_peak_gib"], **plan["host_by_phase_gib"]}
    for key in ("host", "load", "export"):
        assert float(match[key]) == pytest.approx(host[key], abs=0.006), (name, key)
    assert [int(match["rows"]), int(match["length"]), int(match["world"])] == [*plan["micro_batch"],
                                                                                 plan["world_size"]]
    if match["device"]:
        assert (match["fits"] == "fits") == plan["fits"]
        assert match["largest"] == str(plan["largest_max_tokens"])
    if name == "voxcpm2-lora-gpu1":  # the frozen base in bf16: 2.29 B x 2 B, not fp32 masters
        assert plan["by_category_gib"]["params"] <= 5
    if name == "voxcpm2-full-gpu8-24g":  # FSDP2 over 8 cards; the fused AdamW's two moments
        c = plan["by_category_gib"]
        assert plan["fits"] and c["optimizer"] <= 2 * c["params"] + 0.01
