"""`make generate` and `make generate-check`: every committed file that is generated, in one list.

Each generator writes its file (or folder) fresh into a scratch folder, with the same command that made
the committed one; the result is compared with the committed file. `make generate` moves each one that
differs into place, one by one in the list's order (params.yaml before the pipeline compiled from it);
`--check` writes nothing and fails with one line naming what is stale.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
VOXPIPE = str(Path(PYTHON).parent / "voxpipe")


def run(*cmd: str, env: dict[str, str] | None = None) -> str:
    """A generator's command in the repo; its stdout. A failure is one paragraph with its stderr."""
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        sys.exit(f"make generate: `{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout


def params_md(out: Path) -> None:
    run(PYTHON, "-m", "voxpipe.paramspec", str(out))


def measurements_md(out: Path) -> None:
    """The benchmarks' recorded runs (benchmarks/results/*.json) as tables."""
    run(PYTHON, "tools/measurements.py", "render", str(out))


def params_yaml(out: Path) -> None:
    run(VOXPIPE, "params", "--params", "params.yaml", "--write", str(out))


def dvc_yaml(out: Path) -> None:
    run(VOXPIPE, "dvc-yaml", "--file", str(out))


def finetune_yaml(out: Path) -> None:
    run(PYTHON, "-m", "pipelines.finetune", str(out))


def sweep_yaml(out: Path) -> None:
    run(PYTHON, "-m", "pipelines.sweep", str(out))


def constraints_txt(out: Path) -> None:
    out.write_text(run(PYTHON, "images/constraints.py"))


def golden(out: Path) -> None:
    """The golden files of the render tests: they write where VOXPIPE_GOLDEN_DIR says when updating."""
    out.mkdir()
    run(PYTHON, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-k", "golden",
        "tests/test_launch_render.py", env={"VOXPIPE_UPDATE_GOLDEN": "1", "VOXPIPE_GOLDEN_DIR": str(out)})


# in the order they are written: a later one may read an earlier one (the pipeline reads params.yaml)
GENERATED: dict[str, Callable[[Path], None]] = {
    "docs/params.md": params_md,
    "docs/measurements.md": measurements_md,
    "params.yaml": params_yaml,
    "dvc.yaml": dvc_yaml,
    "pipelines/finetune.yaml": finetune_yaml,
    "pipelines/sweep.yaml": sweep_yaml,
    "images/constraints.txt": constraints_txt,
    "tests/golden": golden,
}


def contents(path: Path) -> dict[str, bytes]:
    """A file's bytes, or a folder's files' by their path in it; nothing for a path that is absent."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {f.relative_to(path).as_posix(): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def replace(fresh: Path, committed: Path) -> None:
    """Move the fresh file (a folder: its files, and none it lacks) over the committed one."""
    if fresh.is_dir():
        shutil.rmtree(committed, ignore_errors=True)
        shutil.copytree(fresh, committed)
    else:
        os.replace(shutil.copyfile(fresh, committed.with_name(f".{committed.name}.tmp")), committed)


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--check", action="store_true", help="write nothing; fail when a file is stale")
    args = cli.parse_args(argv)
    stale = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, generate in GENERATED.items():
            fresh = Path(scratch) / name
            fresh.parent.mkdir(parents=True, exist_ok=True)
            generate(fresh)
            if contents(fresh) != contents(ROOT / name):
                stale.append(name)
                if not args.check:
                    replace(fresh, ROOT / name)
    if stale and args.check:
        print(f"stale generated files: {', '.join(stale)}: run `make generate`, then commit", file=sys.stderr)
        return 1
    print(f"generated files: rewrote {', '.join(stale)}" if stale else "generated files: all current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
