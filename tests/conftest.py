"""Shared pytest fixtures, and which tests are `slow`.

`make test-fast` (`pytest -m "not slow"`) leaves out the end-to-end tests: those of a module marked
`pytestmark = pytest.mark.slow` (dvc repro, kfp.local, the image), those marked one by one,
and every test that uses a fixture in SLOW_FIXTURES (a real server, a torchrun world, a training run), so
a new test on one of them is slow without saying so. `make test` runs them all.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Before anything imports mlflow: its telemetry thread unsets an environment variable while requests iterates
# os.environ in another thread ("API request ... failed with exception '_MLFLOW_TELEMETRY_SESSION_ID'").
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# the local checkpoint signing key (voxpipe/integrity.py) lives in the user's state folder: the tests' own,
# so they neither read nor write the real user's key (set before any test; torchrun children inherit it)
os.environ["XDG_STATE_HOME"] = os.path.join(
    os.environ.get("PYTEST_XDG_STATE_HOME") or f"/tmp/voxpipe-tests-{os.getuid()}-{os.getpid()}", "state")

# numba's on-disk cache (librosa's pyin kernels, voxpipe's Viterbi) per xdist worker: three workers compiling
# the same functions into one cache folder at once crashed one in a cache load (SIGSEGV in librosa's
# localmin). A worker's subprocesses inherit its folder (set before numba's import)
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(os.environ["XDG_STATE_HOME"]),
                                                          f"numba-{worker}"))

# pytest-xdist runs one worker per core: each with one intra-op thread, so that two workers' torch
# and numpy thread pools do not oversubscribe the cores and spin (set before anything imports torch)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# fixtures that start a real end-to-end part: a server, a training run, a DVC repo, a KFP local runner
SLOW_FIXTURES = {
    "server", "auth_server", "s3",  # `mlflow server` (plain, basic-auth), moto's S3 server
    "voxpipe_server",  # `voxpipe serve` on a registered tiny model (tests/test_serve.py)
    "hostile_server",  # `voxpipe serve` of a model that never stops, hostile clients (test_serve_hostile.py)
    "batching_server",  # the same model served in batches of 2 rows (test_serve_batching.py)
    "first_repro", "local_runner", "container",  # `dvc repro`, kfp.local, the built image
    "two_rank_run", "finished", "live", "pipeline",  # training runs (torchrun, or in process)
}

MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")  # worker seconds per module, last measured
NEW_SLOW_MODULE = 60.0  # a slow module not measured yet: early enough not to end the run alone


@pytest.fixture(scope="module")
def one_thread():
    """The tiny model's ops are too small to split: one intra-op thread is as fast, and does not stall when
    other processes share the cores (parallel tests, torchrun workers). A module opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # Longest modules first (LPT): `make test` hands whole modules to its workers in this order, so the
    # last ones handed out are short and fill the gap while another worker ends a long one (a pipeline
    # module handed out last left a worker idle for minutes). The seconds are a run's own: after a
    # change in where time goes, `VOXPIPE_MODULE_SECONDS=tests/module_seconds.json make test` rewrites
    # them (pytest_terminal_summary below).
    seconds = json.loads(MODULE_SECONDS.read_text()) if MODULE_SECONDS.is_file() else {}
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def weight(module: str) -> float:
        return seconds.get(module, NEW_SLOW_MODULE if module in slow else 0.0)

    items.sort(key=lambda item: -weight(item.nodeid.split("::")[0]))


def pytest_terminal_summary(terminalreporter, config):
    """With VOXPIPE_MODULE_SECONDS=PATH: each module's seconds (setup, call and teardown of its tests)
    written to PATH, for the ordering above."""
    target = os.environ.get("VOXPIPE_MODULE_SECONDS")
    if not target:
        return
    spent: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(getattr(report, "duration", None), float) and getattr(report, "nodeid", ""):
                module = report.nodeid.split("::")[0]
                spent[module] = spent.get(module, 0.0) + report.duration
    Path(target).write_text(json.dumps({m: round(t, 1) for m, t in sorted(spent.items())}, indent=1) + "\n")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random-init tiny VoxCPM2 in eval mode on the CPU, once per session: read-only for tests (generate,
    decode, batch; never train it)."""
    from voxpipe.model.io import from_pretrained
    from voxpipe.steps.model import ModelParams
    from voxpipe.train.init_model import init_model

    folder = tmp_path_factory.mktemp("tiny")
    init_model(ModelParams(preset="tiny", out=str(folder)))
    return from_pretrained(folder, device="cpu").eval()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real MLflow tracking + registry server on localhost (tests/servers.py), one per test module; its
    process group is ended afterwards."""
    from servers import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as uri:
        yield uri


@dataclass(frozen=True)
class EncodedSample:
    ingest: Path  # raw.jsonl + audio/ from `voxpipe ingest`
    manifest: Path  # train.jsonl / val.jsonl from `voxpipe manifest`
    base_model: Path  # random-init tiny checkpoint from `voxpipe init-model --preset tiny`
    encoded: Path  # `voxpipe encode` output: train.jsonl / val.jsonl, shards/, report.json


@pytest.fixture(scope="session")
def encoded_sample(tmp_path_factory) -> EncodedSample:
    """The shipped sample through ingest -> manifest -> init-model tiny -> encode, once per session.

    Read-only for tests: copy a folder before running a step into it.
    """
    from voxpipe.data.encode.step import encode
    from voxpipe.data.ingest_step import ingest
    from voxpipe.data.manifest import build_manifest
    from voxpipe.params import Params
    from voxpipe.steps.encode import EncodeParams
    from voxpipe.steps.ingest import IngestParams
    from voxpipe.steps.manifest import ManifestParams
    from voxpipe.steps.model import ModelParams
    from voxpipe.train.init_model import init_model

    work = tmp_path_factory.mktemp("encoded_sample")
    paths = EncodedSample(work / "ingest", work / "manifest", work / "base_model", work / "encoded")
    # no DNSMOS: ~0.4 CPU s a clip, and nothing downstream of ingest reads the score (test_quality does)
    ingest(IngestParams(input=[str(ROOT / "data" / "sample")], out=str(paths.ingest), workers=1,
                        score_quality=False))
    build_manifest(ManifestParams(input=[str(paths.ingest / "raw.jsonl")], out=str(paths.manifest)))
    init_model(ModelParams(preset="tiny", out=str(paths.base_model)))
    encode(Params(model={"base": str(paths.base_model)}, encode=EncodeParams(
        manifest=[str(paths.manifest / "train.jsonl"), str(paths.manifest / "val.jsonl")],
        out=str(paths.encoded),
        device="cpu",
    )))
    return paths


@pytest.fixture(autouse=True)
def _print_restored():
    """kfp.local runs ParallelFor tasks in threads, each wrapping `builtins.print` to indent its logs and
    restoring what it saw: overlapping tasks can leave an indenting print behind, which then corrupts the
    stdout of later tests in the same process. Every test starts and ends with the real print."""
    import builtins

    original = builtins.print
    yield
    builtins.print = original


class SmallDisks:
    """Real tmpfs mounts of a given size: writes fail with the kernel's ENOSPC as on a full volume."""

    def __init__(self, root: Path) -> None:
        self.root, self.mounted = root, []

    def mount(self, size: str) -> Path:
        """A new tmpfs of `size` ("1m"); the test is skipped where mounting is not allowed (needs root)."""
        folder = self.root / f"disk{len(self.mounted)}"
        folder.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                                str(folder)], capture_output=True).returncode != 0:
            pytest.skip("mounting a tmpfs needs root")
        self.mounted.append(folder)
        return folder

    def resize(self, folder: Path, size: str) -> None:
        """More space on a mounted one (a remount): what a user frees before the rerun."""
        subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[SmallDisks]:
    """`small_disk.mount("1m")`: a real full-able volume, unmounted at the end of the test."""
    disks = SmallDisks(tmp_path)
    yield disks
    for folder in reversed(disks.mounted):
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.fixture
def local_runner(tmp_path):
    """kfp.local in this venv (SubprocessRunner), its pipeline root under tmp_path; yields tmp_path."""
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    return tmp_path
