"""`make sweep GRID="train.lr=5e-5,1e-4 train.lora.r=16,32"`: a local sweep as DVC experiments.

DVC's own way, so `dvc exp show` / `dvc exp apply` work on the result: one `dvc exp run --queue -S
key=value ...` per grid point, `dvc queue start -j N` (N bounded by the cores: each point's train and
encode run `local.nproc` torchrun processes), wait, then `voxpipe sweep-close`, and `dvc exp show`
limited to the swept keys and the headline figures. The points share the workspace's committed
ingest/manifest/encode (dvc.lock + the cache): only train and the stages after it run per point.

MLflow: `voxpipe sweep-open` makes the sweep's parent run first, and every point runs with
`-S tracking.parent_run=ID`, so its register logs it as a child and registers no version; sweep-close
registers the best (voxpipe/track/sweep.py). The tracking URI is resolved here, once, to an absolute one
(`-S tracking.uri=...`): each queued experiment runs in a temporary copy of the repo, whose relative
`work/mlflow.db` would be a store of its own.

A DVC driver, so it lives beside the repo's other tools, not in voxpipe/ (no voxpipe module runs dvc).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from voxpipe.errors import StepError
from voxpipe.params import load_params
from voxpipe.track.sweep import SWEEP_FILE, grid_points, parse_grid, set_value
from voxpipe.track.tracking import resolve_tracking_uri

BIN = Path(sys.executable).parent
# dvc exp show's columns for the eval.json / mfu.json / train report figures the headline names
HEADLINE = ("loss_model", "loss_delta", "similarity_to_speaker_mean", "stop_failure_rate", "wer", "mfu",
            "tokens_per_s")
POLL_S = 5


def workers(asked: int, points: int) -> int:
    """`dvc queue start -j`: as asked, else one per two cores (a point's torchrun takes two), at least one,
    never more than the points."""
    auto = max(1, (os.cpu_count() or 1) // 2)
    return max(1, min(asked or auto, points))


def run(*cmd: str) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise StepError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): "
                        f"{(proc.stderr or proc.stdout).strip()[-3000:]}")
    return proc.stdout


def dvc(*args: str) -> str:
    return run(str(BIN / "dvc"), *args)


def voxpipe(*args: str) -> str:
    return run(str(BIN / "voxpipe"), *args)


def ran(log: str) -> list[str]:
    """The stages an experiment's log says it ran (the others were taken from dvc.lock and the cache)."""
    return re.findall(r"Running stage '([\w-]+)'", log)


def queue_states(names: list[str]) -> dict[str, str]:
    """`dvc queue status` for the named experiments: name -> Queued / Running / Success / Failed."""
    states = {}
    for line in dvc("queue", "status").splitlines():
        fields = line.split()
        if fields and fields[0] in names or len(fields) > 1 and fields[1] in names:
            name = fields[0] if fields[0] in names else fields[1]
            states[name] = next((f for f in fields if f in ("Queued", "Running", "Success", "Failed")), "?")
    return states


def sweep(grid_args: list[str], params_file: str, asked_workers: int, sets: list[str]) -> dict:
    grid = parse_grid(grid_args, params_file)
    params = load_params(params_file, sets)
    uri = resolve_tracking_uri(params.tracking.uri, Path(params.tracking.work))
    common = ["--params", params_file, *(a for s in sets for a in ("--set", s)), "--tracking-uri", uri]
    voxpipe("sweep-open", *common, *(a for g in grid_args for a in ("--grid", g)))
    record = json.loads((Path(params.sweep.out) / SWEEP_FILE).read_text())
    parent = record["parent_run"]
    points = grid_points(grid)
    names = []
    for i, point in enumerate(points):
        name = f"sweep-{parent[:8]}-{i}"
        values = [*(f"{k}={set_value(v)}" for k, v in point.items()), *sets,
                  f"tracking.parent_run={parent}", f"tracking.uri={uri}"]
        dvc("exp", "run", "--queue", "-n", name, *(a for v in values for a in ("-S", v)))
        names.append(name)
    jobs = workers(asked_workers or params.sweep.workers, len(points))
    print(f"sweep {parent}: {len(points)} experiments queued, {jobs} at a time", flush=True)
    dvc("queue", "start", "-j", str(jobs))
    states = queue_states(names)
    while any(states.get(n) in (None, "Queued", "Running") for n in names):
        time.sleep(POLL_S)
        states = queue_states(names)
    logs = {n: dvc("queue", "logs", n) for n in names}
    for n in names:
        stages = ", ".join(ran(logs[n])) or "nothing"
        print(f"{n} ({states[n]}): ran {stages}")
    failed = [n for n in names if states[n] != "Success"]
    if failed:
        raise StepError(f"sweep {parent}: {', '.join(failed)} failed; `dvc queue logs NAME` shows why. "
                        "Fix it and run the sweep again (the points that succeeded come from the run "
                        "cache)")
    print(voxpipe("sweep-close", *common, "--set", f"tracking.parent_run={parent}").strip())
    keep = "|".join(["Experiment", *(re.escape(k) + "$" for k in grid), *(f"^{h}$" for h in HEADLINE)])
    print(dvc("exp", "show", "--md", "--drop", ".*", "--keep", keep))
    return {"parent_run": parent, "experiments": names, "logs": logs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/sweep.py", description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="append", default=[], metavar="SECTION.KEY=A,B",
                        help="a swept setting and its values (repeatable: every combination runs)")
    parser.add_argument("--params", default="params.yaml", help="params file (default: ./params.yaml)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting every point shares (repeatable)")
    parser.add_argument("--workers", type=int, default=0, help="experiments at once (0: sweep.workers)")
    args = parser.parse_args(argv)
    try:
        sweep(args.grid, args.params, args.workers, args.sets)
    except StepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
