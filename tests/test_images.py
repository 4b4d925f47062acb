"""images/Dockerfile: the image of every device carries what the pipeline steps it runs need, at the
versions the tests ran with; the torch / torch_npu pins agree with pyproject; the image runs as a
non-root user and knows its commit.

These checks read the Dockerfile; `make lint` runs hadolint over it, and `make image-test` builds the CPU
image for real and runs the steps inside it (tests/test_image.py).
"""

import ast
import importlib.util
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
DOCKERFILE = IMAGES / "Dockerfile"
DEVICES = ("cpu", "cuda", "npu")
PIPELINE = ROOT / "pipelines" / "finetune.yaml"
CONSTRAINTS = "images/constraints.txt"
REGENERATE = "make generate"  # images/constraints.py > images/constraints.txt, with the others
PIN = re.compile(r"\b(torch|torch_npu|torch-npu)==([0-9][0-9a-z.+]*)")
IMAGE_PARAMETER = re.compile(r"\{\{\$\.inputs\.parameters\['pipelinechannel--(\w+)'\]\}\}")

# The images each image parameter of the pipeline may name. accelerator_image is also the training
# pods' image (the train task hands it to launch-train): any of the three, the CPU one on CPU clusters.
IMAGE_CHOICES = {"cpu_image": ("cpu",), "accelerator_image": ("cpu", "cuda", "npu")}


@dataclass(frozen=True)
class Needs:
    extras: frozenset[str]  # voxpipe's, installed with the constraints
    no_deps: frozenset[str] = frozenset()  # installed --no-deps at the Makefile's pin


KFP = Needs(frozenset({"cluster"}))  # KFP's executor runs every component: kfp, in the cluster extra
# What each component's step needs beyond the project's dependencies (mlflow, matplotlib, torch...).
# A new component fails test_every_component_says_what_it_needs until it has a row here.
NEEDS = {
    "ingest-plan": KFP,
    "ingest-shard": KFP,
    "ingest-merge": KFP,
    "manifest": KFP,
    "validate": KFP,
    "init-model": KFP,
    "encode": KFP,  # launch-encode's kubernetes client (launch_backend not in-task): the cluster extra too
    "train": KFP,  # launch-train's kubernetes client: the cluster extra too
    # pitch (librosa), ASR (pocketsphinx), the figure; the speaker encoder
    "evaluate": Needs(frozenset({"cluster", "eval"}), frozenset({"resemblyzer"})),
    "mfu": KFP,
    "register": KFP,
}


def constraints_module():
    spec = importlib.util.spec_from_file_location("images_constraints", IMAGES / "constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def project_requirements(extras) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = [r for extra in sorted(extras) for r in project["optional-dependencies"][extra]]
    return [Requirement(r) for r in project["dependencies"] + optional]


def pins(text: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, version in PIN.findall(text):
        out.setdefault(name.replace("-", "_"), set()).add(version)
    return out


def constraints() -> dict[str, str]:
    lines = (ROOT / CONSTRAINTS).read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def pip_installs(dockerfile: Path) -> list[list[str]]:
    """The arguments of every `pip install` in the RUN instructions."""
    text = dockerfile.read_text().replace("\\\n", " ")
    commands = [shlex.split(c) for run in re.findall(r"^RUN (.*)$", text, re.M) for c in run.split("&&")]
    return [words[2:] for words in commands if words[:2] == ["pip", "install"]]


def project_extras(dockerfile: Path) -> set[str]:
    """The extras of the image's `pip install ".[...]"`, each checked to go through the constraints."""
    extras: set[str] = set()
    for args in pip_installs(dockerfile):
        for arg in args:
            if match := re.fullmatch(r"\.\[([\w,-]+)\]", arg):
                constrained = "--constraint" in args and args[args.index("--constraint") + 1] == CONSTRAINTS
                assert constrained, f"{dockerfile.name}: `pip install {' '.join(args)}` without {CONSTRAINTS}"
                extras |= set(match[1].split(","))
    return extras


def no_deps_pins(dockerfile: Path) -> dict[str, str]:
    """name -> version of what the image installs with `pip install --no-deps name==version`."""
    out = {}
    for args in pip_installs(dockerfile):
        if "--no-deps" in args:
            for req in (Requirement(a) for a in args if "==" in a and not a.startswith("-")):
                (spec,) = req.specifier
                out[canonicalize_name(req.name)] = spec.version
    return out


def makefile_no_deps_pins() -> dict[str, str]:
    found = re.findall(r"--no-deps (\S+)==(\S+)", (ROOT / "Makefile").read_text())
    return {canonicalize_name(name): version for name, version in found}


def pipeline_images() -> dict[str, str]:
    """component -> the pipeline parameter naming its image, from the compiled pipeline."""
    spec, _ = yaml.safe_load_all(PIPELINE.read_text())
    images = {}
    for name, executor in spec["deploymentSpec"]["executors"].items():
        image = executor["container"]["image"]
        match = IMAGE_PARAMETER.fullmatch(image)
        images[name.removeprefix("exec-")] = match[1] if match else image
    return images


def imported_distributions(name: str) -> dict[str, list[str]]:
    """Top-level modules the installed distribution's code imports (not its own, not the stdlib) ->
    the installed distributions that provide them."""
    dist = distribution(name)
    provides = packages_distributions()
    own = {m for m, dists in provides.items() if dist.metadata["Name"] in dists}
    modules: set[str] = set()
    for file in dist.files or []:
        if file.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules.add(node.module.split(".")[0])
    return {m: provides.get(m, []) for m in sorted(modules - own - set(sys.stdlib_module_names))}


STEP_IMAGES = [
    (step, device)
    for step, parameter in pipeline_images().items()
    for device in IMAGE_CHOICES.get(parameter, ())
]


def test_one_dockerfile_builds_every_device():
    text = DOCKERFILE.read_text()
    assert re.findall(r"^\s+(\w+)\) ", text, re.M) == list(DEVICES), "the torch install's case per DEVICE"
    for device in DEVICES:
        assert re.search(rf"^FROM \S+ AS base-{device}$", text, re.M), f"no base stage for {device}"
    assert [p.name for p in IMAGES.glob("Dockerfile*")] == ["Dockerfile"], "one parameterised Dockerfile"
    assert re.search(r"for device in cpu cuda npu; do", (ROOT / "Makefile").read_text())


def test_the_image_knows_its_commit():
    """The commit goes into the environment (`register` records it) and the OCI revision label; every
    build path passes it."""
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG VOXPIPE_GIT_COMMIT=", text, re.M)
    assert "VOXPIPE_GIT_COMMIT=${VOXPIPE_GIT_COMMIT}" in text
    assert 'org.opencontainers.image.revision="${VOXPIPE_GIT_COMMIT}"' in text
    for builder in (ROOT / "Makefile", IMAGES / "buildah-build.sh"):
        passed = re.search(r"--build-arg VOXPIPE_GIT_COMMIT=\S*git rev-parse HEAD", builder.read_text())
        assert passed, f"{builder.name} builds without the commit"


def test_every_component_says_what_it_needs_and_runs_on_an_image_parameter():
    images = pipeline_images()
    assert set(images) == set(NEEDS), "a component without a NEEDS row, or a row without a component"
    assert set(images.values()) <= set(IMAGE_CHOICES), f"images not from a known parameter: {images}"
    spec, _ = yaml.safe_load_all(PIPELINE.read_text())
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    for parameter, devices in IMAGE_CHOICES.items():
        device = defaults[parameter]["defaultValue"].rsplit("-", 1)[-1]
        assert device in devices, f"{parameter} defaults to {defaults[parameter]['defaultValue']}"


@pytest.mark.parametrize(("step", "device"), STEP_IMAGES, ids=[f"{s}-{d}" for s, d in STEP_IMAGES])
def test_image_has_what_the_step_it_runs_needs(step, device):
    """The project install is the same for every DEVICE; the parametrisation names which image may run
    which step, so a device-specific install added later is checked too."""
    assert device in DEVICES
    needs = NEEDS[step]
    missing = needs.extras - project_extras(DOCKERFILE)
    assert not missing, f"the {device} image may run {step}, which needs voxpipe's {sorted(missing)} extras"
    pinned, wanted = no_deps_pins(DOCKERFILE), makefile_no_deps_pins()
    for name in needs.no_deps:
        assert pinned.get(name) == wanted[name], (
            f"the {device} image may run {step}, which needs `pip install --no-deps {name}=={wanted[name]}` "
            f"(the Makefile's); it has {pinned.get(name)}"
        )


def test_no_deps_pins_are_the_versions_the_tests_ran_with():
    for name, version in no_deps_pins(DOCKERFILE).items():
        installed = Version(distribution(name).version).public
        assert version == installed, f"images/Dockerfile: {name}=={version}, the tests ran {installed}"


def test_what_no_deps_packages_import_is_pinned():
    """Their declared dependencies are skipped, so what their code imports must come pinned with the
    extras (Resemblyzer's webrtcvad: the webrtcvad-wheels distribution)."""
    pinned = {canonicalize_name(name) for name in constraints()}
    for name in sorted(set().union(*(needs.no_deps for needs in NEEDS.values()))):
        for module, dists in imported_distributions(name).items():
            assert dists, f"{name} imports {module}, which no installed distribution provides"
            assert pinned & {canonicalize_name(d) for d in dists}, (
                f"{name} imports {module} ({', '.join(dists)}), not in {CONSTRAINTS}: add it to an extra "
                f"the images install, then `{REGENERATE}`"
            )


def test_constraints_cover_the_extras_the_images_install():
    extras, installed = constraints_module().EXTRAS, project_extras(DOCKERFILE)
    assert installed <= extras, f"images/Dockerfile installs {sorted(installed - extras)}, unpinned"
    assert extras == installed, "constraints.py pins an unused extra"


def test_constraints_txt_is_what_constraints_py_writes(capsys):
    constraints_module().main()
    written = capsys.readouterr().out
    assert written == (ROOT / CONSTRAINTS).read_text(), f"stale: run `{REGENERATE}`"


def test_torch_pin_is_one_exact_version_that_pyproject_allows():
    (torch,) = [r for r in project_requirements(()) if r.name == "torch"]
    found = pins(DOCKERFILE.read_text())
    assert len(found["torch"]) == 1, f"images/Dockerfile: one torch version, not {found['torch']}"
    (version,) = found["torch"]
    assert Version(version) in torch.specifier, f"images/Dockerfile: torch=={version}, pyproject: {torch}"
    assert version == constraints()["torch"]


def test_torch_npu_is_version_paired_with_torch_and_cann_is_the_ascend_base():
    text = DOCKERFILE.read_text()
    found = pins(text)
    assert found["torch_npu"] == found["torch"]  # torch_npu X is built for torch X only
    tag = re.search(r"^ARG NPU_BASE=ascendai/cann:(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"\d+\.\d+\.\d+-910b-ubuntu22\.04-py3\.11", tag), tag
    assert "FROM ${NPU_BASE} AS base-npu" in text


def test_image_installs_the_project_pinned_and_runs_as_a_numeric_non_root_user():
    text = DOCKERFILE.read_text()
    assert project_extras(DOCKERFILE), 'images/Dockerfile: no `pip install ... ".[...]"` of the project'
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and not users[-1].startswith(("root", "0")), f"images/Dockerfile ends as {users}"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() or uid.startswith("${"), "numeric, so the kubelet can check runAsNonRoot"
    assert "ENV PIP_NO_INDEX=1" in text  # nothing downloaded at run time


def test_constraints_satisfy_pyproject():
    pinned = constraints()
    for req in project_requirements(constraints_module().EXTRAS):
        key = canonicalize_name(req.name)
        assert key in pinned, f"{req.name} unpinned: run `{REGENERATE}`"
        assert Version(pinned[key]) in req.specifier, f"{req.name}=={pinned[key]} violates pyproject's {req}"
