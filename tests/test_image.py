"""The CPU image, built for real, runs the pipeline's steps as its own non-root user.

`make image-test` builds images/Dockerfile with buildah (images/buildah-build.sh) and runs this module
with VOXPIPE_IMAGE set to the image; `make test` skips it. Every command runs inside the image through
`buildah run --isolation chroot` (no container engine needed), as the image's USER, with a scratch folder
mounted at /workspace: the way a pod mounts the workspace PVC.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from small_sample import write_small_sample

from voxpipe.cli import STEPS
from voxpipe.params import Params

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("VOXPIPE_IMAGE", "")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not IMAGE or not shutil.which("buildah"),
    reason="needs a built image: `make image-test` builds it with buildah and sets VOXPIPE_IMAGE",
)]

# a few training steps of the tiny model on a few rows per speaker, a small evaluation
SETTINGS = {
    "ingest": {"workers": 1},
    "train": {"max_steps": 3, "warmup_steps": 1, "val_every": 0, "checkpoint_every": 0},
    "evaluate": {"seeds": [0], "texts_per_speaker": 1, "max_len": 8, "inference_timesteps": 2, "asr": False},
}


def image_user() -> tuple[int, int]:
    """The image's USER as uid, gid (the Dockerfile ends on a numeric one)."""
    inspect = ["buildah", "inspect", "--type", "image", "--format", "{{.OCIv1.Config.User}}", IMAGE]
    out = subprocess.run(inspect, capture_output=True, text=True, check=True).stdout.strip()
    uid, _, gid = out.partition(":")
    return int(uid), int(gid or uid)


@pytest.fixture(scope="module")
def container():
    name = subprocess.run(["buildah", "from", "--pull-never", IMAGE], capture_output=True, text=True,
                          check=True).stdout.strip()
    yield name
    subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The scratch workspace, writable by the image's user only (as a PVC with the pod's fsGroup)."""
    ws = tmp_path_factory.mktemp("workspace")
    write_small_sample(ws / "data" / "sample", per_speaker=4)
    params = Params().model_dump(by_alias=True)
    for section, values in SETTINGS.items():
        params[section] = {**params[section], **values}
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    uid, gid = image_user()
    for path in [ws, *ws.rglob("*")]:
        os.chown(path, uid, gid)
    ws.chmod(0o700)
    return ws


def inside(container: str, workspace: Path, command: str, check: bool = True) -> subprocess.CompletedProcess:
    """`command` (sh) in the image, as its USER, in /workspace. The hostname must resolve, as a pod's does
    (the kubelet writes it into /etc/hosts): torchrun's rendezvous connects to it; buildah's random one
    does not resolve."""
    proc = subprocess.run(
        ["buildah", "run", "--isolation", "chroot", "--hostname", "localhost", "--volume",
         f"{workspace}:/workspace", "--workingdir", "/workspace", container, "--", "sh", "-c", command],
        capture_output=True, text=True, timeout=900,
    )
    if check:
        assert proc.returncode == 0, f"in the image: {command}\n{(proc.stdout + proc.stderr)[-5000:]}"
    return proc


def test_version_and_every_steps_help(container, workspace):
    assert inside(container, workspace, "voxpipe --version").stdout.strip()
    for step in STEPS:
        assert "usage: voxpipe" in inside(container, workspace, f"voxpipe {step.name} --help").stdout


def test_the_pipeline_runs_as_the_image_user(container, workspace):
    for command in (
        "voxpipe ingest",
        "voxpipe manifest",
        "voxpipe init-model",
        "voxpipe encode",
        "torchrun --nproc_per_node=2 -m voxpipe.cli train",
        "voxpipe evaluate",
        "voxpipe mfu",
        "voxpipe register",
    ):
        inside(container, workspace, command)
    registered = json.loads((workspace / "work/register/registered.json").read_text())
    assert registered["version"] == 1
    uid, gid = image_user()
    written = (workspace / "work").rglob("*")
    foreign = [p for p in written if (p.lstat().st_uid, p.lstat().st_gid) != (uid, gid)]
    assert not foreign, f"written by another user than the image's {uid}:{gid}: {foreign[:5]}"


def test_nothing_is_installed_at_run_time(container, workspace):
    proc = inside(container, workspace, "pip install cowsay", check=False)  # a package the image lacks
    assert proc.returncode != 0, "pip installed a package inside the image"
    assert "from versions: none" in proc.stdout + proc.stderr, "pip failed for another reason than no index"


def test_a_compiled_kfp_component_runs_in_the_image(container, workspace):
    """init-model through KFP's executor entry point, with the command and arguments of
    pipelines/finetune.yaml: the image, the component code and the compiled spec agree."""
    spec = next(yaml.safe_load_all((ROOT / "pipelines" / "finetune.yaml").read_text()))
    executor = spec["deploymentSpec"]["executors"]["exec-init-model"]["container"]
    defaults = {k: v.get("defaultValue") for k, v in spec["root"]["inputDefinitions"]["parameters"].items()}
    task = spec["root"]["dag"]["tasks"]["init-model"]["inputs"]["parameters"]
    values = {name: defaults[source["componentInputParameter"]] for name, source in task.items()
              if "componentInputParameter" in source and not name.startswith("pipelinechannel--")}
    assert set(values) == {"workspace", "base_model", "params"}, values
    outputs = "/workspace/kfp-outputs/init-model"
    executor_input = {
        "inputs": {"parameterValues": values},
        "outputs": {
            "artifacts": {"model": {"artifacts": [{
                "name": "model", "type": {"schemaTitle": "system.Model"}, "uri": f"{outputs}/model",
                "metadata": {},
            }]}},
            "outputFile": f"{outputs}/executor_output.json",
        },
    }
    args = [json.dumps(executor_input) if a == "{{$}}" else a for a in executor["args"]]
    command = " ".join(shlex.quote(part) for part in executor["command"] + args)
    inside(container, workspace, f"mkdir -p {outputs} && {command}")
    output = json.loads((workspace / "kfp-outputs/init-model/executor_output.json").read_text())
    folder = output["artifacts"]["model"]["artifacts"][0]["metadata"]["path"]
    assert (workspace / Path(folder).relative_to("/workspace") / "config.json").is_file()
