"""images/: the torch / torch_npu pins agree with pyproject, and the images run as non-root users.

The images cannot be built here (no container engine); `make lint` runs hadolint over them.
"""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("Dockerfile.*"))
REGENERATE = "images/constraints.py > images/constraints.txt"
PIN = re.compile(r"\b(torch|torch_npu|torch-npu)==([0-9][0-9a-z.+]*)")


def project_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["cluster"]
    return {Requirement(r).name: Requirement(r) for r in reqs}


def pins(text: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, version in PIN.findall(text):
        out.setdefault(name.replace("-", "_"), set()).add(version)
    return out


def constraints() -> dict[str, str]:
    lines = (IMAGES / "constraints.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def test_there_is_an_image_per_device():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.cuda", "Dockerfile.npu"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.suffix[1:])
def test_torch_pin_is_one_exact_version_that_pyproject_allows(dockerfile):
    torch_spec = project_requirements()["torch"].specifier
    found = pins(dockerfile.read_text())
    assert len(found["torch"]) == 1, f"{dockerfile.name}: one torch version, not {found['torch']}"
    (version,) = found["torch"]
    assert Version(version) in torch_spec, f"{dockerfile.name}: torch=={version}, pyproject: {torch_spec}"
    assert version == constraints()["torch"]


def test_torch_npu_is_version_paired_with_torch_and_cann_is_the_ascend_base():
    text = (IMAGES / "Dockerfile.npu").read_text()
    found = pins(text)
    assert found["torch_npu"] == found["torch"]  # torch_npu X is built for torch X only
    tag = re.search(r"^ARG CANN_TAG=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"\d+\.\d+\.\d+-910b-ubuntu22\.04-py3\.11", tag), tag
    assert "FROM ascendai/cann:${CANN_TAG}" in text


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.suffix[1:])
def test_image_installs_the_project_pinned_and_runs_as_a_numeric_non_root_user(dockerfile):
    text = dockerfile.read_text()
    assert re.search(r'pip install --constraint images/constraints\.txt "\.\[cluster\]"', text)
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and not users[-1].startswith(("root", "0")), f"{dockerfile.name} ends as {users}"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() or uid.startswith("${"), "numeric, so the kubelet can check runAsNonRoot"
    assert "ENV PIP_NO_INDEX=1" in text  # nothing downloaded at run time


def test_constraints_satisfy_pyproject():
    pinned = constraints()
    for name, req in project_requirements().items():
        key = name.lower().replace("_", "-")
        assert key in pinned, f"{name} unpinned: run `.venv/bin/python {REGENERATE}`"
        assert Version(pinned[key]) in req.specifier, f"{name}=={pinned[key]} violates pyproject's {req}"
