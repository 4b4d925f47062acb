"""`make sweep GRID="train.lr=5e-5,1e-4 train.lora.r=16,32"`: a local sweep as DVC experiments.

DVC's own way, so `dvc exp show` / `dvc exp apply` work on the result: one `dvc exp run --queue -S
key=value ...` per grid point, `dvc queue start -j N` (N bounded by the cores: each point's train and
encode run `local.nproc` torchrun processes), a progress line as each point finishes, then `voxpipe
sweep-close`, and `dvc exp show` limited to the swept keys and the headline figures. The points share the
workspace's committed ingest/manifest/encode (dvc.lock + the cache): only train and the stages after it
run per point.

Safe to start: the grid is checked, bounded (`--max-points`, more with `--yes`) and every stage dep the
points need is checked to be in git or DVC before anything is queued (a queued experiment runs in a copy
of the repo made from git: an untracked data folder is not there). Make hands GRID over in the
environment (`--grid-env`), never through a shell line.

Safe to stop: Ctrl-C, SIGTERM, SIGHUP, the death of the parent process (`make` killed: PR_SET_PDEATHSIG
and a getppid check) or a failed point removes the queued points, interrupts the running ones, removes
every point that did not succeed from the queue (so `dvc exp show` lists no failed row with another
run's figures), closes the MLflow parent KILLED / FAILED with the reason, and exits in one line. DVC's
run cache cannot take a trained point back (train's checkpoints are `persist` outs, which DVC never
run-caches), so the driver does: sweep.json records the grid, the workspace it ran from and the points'
experiments, and the same command on the same workspace reopens the stopped parent and queues only the
points that did not succeed.

MLflow: `voxpipe sweep-open` makes the sweep's parent run first, and every point runs with
`-S tracking.parent_run=ID`, so its register logs it as a child and registers no version; sweep-close
registers the best (voxpipe/track/sweep.py). The tracking URI is resolved here, once, to an absolute one
(`-S tracking.uri=...`): each queued experiment runs in a temporary copy of the repo, whose relative
`work/mlflow.db` would be a store of its own.

A DVC driver, so it lives beside the repo's other tools, not in voxpipe/ (no voxpipe module runs dvc).
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":  # a stop while the modules below load: nothing has started, nothing to undo
    def _stopped_early(signum: int, _frame: object) -> None:
        os.write(2, f"sweep: stopped by {signal.Signals(signum).name} before it started\n".encode())
        os._exit(128 + signum)

    for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(_sig, _stopped_early)

import argparse
import contextlib
import ctypes
import hashlib
import json
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from voxpipe.errors import StepError
from voxpipe.params import load_params
from voxpipe.report import write_json
from voxpipe.track.sweep import SWEEP_FILE, end_sweep, grid_points, parse_grid, reopen_sweep, set_value
from voxpipe.track.tracking import redact_uri, resolve_tracking_uri

BIN = Path(sys.executable).parent
# dvc exp show's columns for the eval.json / mfu.json / train report figures the headline names
HEADLINE = ("loss_model", "loss_delta", "similarity_to_speaker_mean", "stop_failure_rate", "wer", "mfu",
            "tokens_per_s")
POLL_S = 2  # between `dvc queue status` calls (each about 0.5 CPU s): a finished point is said within ~3 s
STATUS_RETRY_S = 0.5  # `queue_status`: a failed `dvc queue status` asked again after this
MAX_POINTS = 16  # about an hour of queueing and a day of training on the demo: more is asked for (--yes)
KILL_WAIT_S = 60  # a point interrupted like Ctrl-C gets this long to stop before it is killed
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Stop(Exception):  # noqa: N818 - not an error: the sweep was asked to stop
    """A stop signal, or the parent process gone: the sweep ends, its points removed."""


class Guard:
    """Signals become `Stop`, but never inside `atomic()` (a dvc command half done could leave the queue
    or the git stash broken): there they wait until it ends. The dvc commands run in a session of their
    own, so a terminal's Ctrl-C reaches only this process, which stops them in order."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: str | None = None
        self.ppid = os.getppid()

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        if sys.platform == "linux":  # make killed (even SIGKILL): the kernel sends us SIGHUP
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGHUP, 0, 0, 0)
        self.check()  # the parent may have died before prctl

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.depth:
            self.pending = self.pending or name
            return
        raise Stop(name)

    def check(self) -> None:
        if self.depth:
            return
        if self.pending:
            raise Stop(self.pending)
        if os.getppid() != self.ppid:
            raise Stop("the parent process ended")

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            self.check()

    def hold(self) -> None:
        """From here on (the cleanup) no signal interrupts anything."""
        self.depth += 1


GUARD = Guard()


def workers(asked: int, points: int) -> int:
    """`dvc queue start -j`: as asked, else one per two cores (a point's torchrun takes two), at least one,
    never more than the points."""
    auto = max(1, (os.cpu_count() or 1) // 2)
    return max(1, min(asked or auto, points))


def run(*cmd: str) -> str:
    """A command's output. Into files, not pipes: `dvc queue start` leaves its workers holding the
    descriptors it was given, and a pipe would only reach its end when the whole queue has run."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    with GUARD.atomic(), tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.run(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                              start_new_session=True)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise StepError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): "
                        f"{(stderr or stdout).strip()[-3000:]}")
    return stdout


def dvc(*args: str) -> str:
    return run(str(BIN / "dvc"), *args)


def voxpipe(*args: str) -> str:
    return run(str(BIN / "voxpipe"), *args)


def say(line: str, err: bool = False) -> None:
    """A line to the terminal, which may be gone (make killed): never a traceback for that."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr if err else sys.stdout, flush=True)


def ran(log: str) -> list[str]:
    """The stages an experiment's log says it ran (the others were taken from dvc.lock and the cache)."""
    return re.findall(r"Running stage '([\w-]+)'", log)


def queue_status() -> str:
    """`dvc queue status`, asked again (twice at most, STATUS_RETRY_S apart) when it fails: it reads the
    tasks' info files while the queue's worker writes them, and a read that meets one mid-write ends in
    "unexpected error - Expecting value" (treeverse/dvc#8014, #9358); the next read finds it whole. Polled
    every POLL_S while points finish, a sweep would otherwise fail now and then on that race alone."""
    for _ in range(2):
        with contextlib.suppress(StepError):
            return dvc("queue", "status")
        time.sleep(STATUS_RETRY_S)
    return dvc("queue", "status")


def queue_states(names: list[str]) -> dict[str, str]:
    """`dvc queue status` for the named experiments: name -> Queued / Running / Success / Failed."""
    states = {}
    for line in queue_status().splitlines():
        fields = line.split()
        if fields and fields[0] in names or len(fields) > 1 and fields[1] in names:
            name = fields[0] if fields[0] in names else fields[1]
            states[name] = next((f for f in fields if f in ("Queued", "Running", "Success", "Failed")), "?")
    return states


# -- before anything is queued ------------------------------------------------------------------------
def grid_entries(grid_args: list[str], grid_env: str | None) -> list[str]:
    """The `--grid` entries, plus those in $`grid_env` split like a shell's words (make's GRID arrives
    this way: as data, never as a shell line)."""
    entries = list(grid_args)
    if grid_env:
        text = os.environ.get(grid_env, "")
        try:
            entries += shlex.split(text)
        except ValueError as e:
            raise StepError(f"GRID {text[:80]!r} does not split into entries ({e}); give them as "
                            "GRID=\"train.lr=5e-5,1e-4 train.lora.r=16,32\"") from None
    return entries


def check_bound(points: int, max_points: int, yes: bool) -> None:
    if points > max_points and not yes:
        raise StepError(f"the grid has {points} points, more than --max-points {max_points}; each is "
                        "a training run (and queueing alone takes seconds a point). Make the grid smaller, "
                        f"or run them all with --yes (`make sweep GRID=... YES=1`), or raise --max-points")


def untracked_deps(root: Path) -> list[tuple[str, str, bool]]:
    """(path, stage, partly in git) of each stage dependency a queued experiment would not have: not made
    by a stage or a .dvc file, and with files git does not track. DVC derives each queued experiment from
    git (the commit plus the tracked files' changes), so such files are missing from its copy."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    try:
        with GUARD.atomic(), Repo(str(root)) as repo:
            outs = [Path(o.fs_path) for o in repo.index.outs]
            deps = {}
            for stage in repo.index.stages:
                for dep in stage.deps:
                    if not isinstance(dep, ParamsDependency) and dep.protocol == "local":
                        deps.setdefault(Path(dep.fs_path), stage.addressing)
    except Stop:
        raise
    except Exception as e:  # noqa: BLE001 - dvc's own errors: one line naming dvc.yaml
        raise StepError(f"DVC cannot read the pipeline ({' '.join(str(e).split())[:300]}); "
                        "`dvc status` shows the same") from None
    missing = []
    for dep, stage in sorted(deps.items()):
        if not dep.exists() or any(dep == o or o in dep.parents for o in outs):
            continue
        rel = os.path.relpath(dep, root)
        if run("git", "-C", str(root), "ls-files", "--others", "--", rel).strip():
            missing.append((rel, stage, bool(run("git", "-C", str(root), "ls-files", "--", rel).strip())))
    return missing


def check_data(root: Path) -> None:
    missing = untracked_deps(root)
    if not missing:
        return
    rel, stage, partly = missing[0]
    more = f" (and {', '.join(m[0] for m in missing[1:])[:120]})" if len(missing) > 1 else ""
    ignore = f"{os.path.dirname(rel) or '.'}/.gitignore"
    way = (f"add them to git (`git add {rel}`)" if partly else
           f"track it with DVC: `dvc add {rel} && git add {rel}.dvc {ignore}`")
    raise StepError(f"{rel}{more}, a dependency of stage {stage}, has files neither git nor DVC "
                    "tracks; each point runs in a copy of the repo made from git, where they would be "
                    f"missing (the point fails having run nothing). Nothing was queued; {way}, then run the "
                    "sweep again")


def workspace_digest(root: Path, params_file: str, sets: list[str], uri: str) -> str:
    """What a queued experiment is made from (HEAD and the tracked files' changes), the shared settings
    and the store: a stopped sweep is taken up again only on the same."""
    head = run("git", "-C", str(root), "rev-parse", "HEAD").strip()
    diff = run("git", "-C", str(root), "diff", "HEAD", "--binary")
    return hashlib.sha256("\0".join([head, diff, params_file, *sets, redact_uri(uri)]).encode()).hexdigest()


# -- the sweep -----------------------------------------------------------------------------------------
class Sweep:
    """One sweep's state: what to stop and close if it is stopped."""

    def __init__(self, out: Path, uri: str) -> None:
        self.out, self.uri = out, uri
        self.parent: str | None = None
        self.record: dict[str, Any] = {}
        self.names: list[str] = []  # this run's points' experiments, queued or reused

    def save(self, **changes: Any) -> None:
        self.record.update(changes)
        write_json(self.out / SWEEP_FILE, self.record)

    def stop(self, status: str, why: str) -> str:
        """Remove the queued points, interrupt the running ones, take every point that did not succeed
        out of the queue (its log kept in sweep.out), close the parent `status`. Returns what was done."""
        GUARD.hold()
        done, problems = [], []
        try:
            if not self.names:
                raise LookupError
            stopped, states = settle(self.names)
            if stopped:
                done.append(f"{stopped} queued or running stopped")
            unfinished = [n for n in self.names if states.get(n) not in (None, "Success")]
            for name in unfinished:
                with contextlib.suppress(StepError):
                    (self.out / f"{name}.log").write_text(dvc("queue", "logs", name))
            if unfinished:
                dvc("queue", "remove", *unfinished)
        except LookupError:
            pass  # no point queued yet
        except (StepError, OSError) as e:
            problems.append(" ".join(str(e).split())[:200])
        if self.parent:
            try:
                end_sweep(self.uri, self.parent, status, why)
                done.append(f"parent run {self.parent} {status}")
            except (StepError, OSError) as e:
                problems.append(" ".join(str(e).split())[:200])
            with contextlib.suppress(OSError):
                self.save(state=status.lower(), ended=why)
        if problems:
            done.append("left: " + "; ".join(problems))
        return ", ".join(done) or "nothing had started"


def shared(params_file: str, sets: list[str], uri: str) -> list[str]:
    """The arguments sweep-open and sweep-close share: the points' params and the resolved store."""
    return ["--params", params_file, *(a for s in sets for a in ("--set", s)), "--tracking-uri", uri]


def open_or_resume(sw: Sweep, grid: dict, grid_args: list[str], params_file: str, sets: list[str],
                   digest: str) -> dict[str, str]:
    """The parent run: the stopped sweep's own when sweep.json records one with this grid and workspace
    (then its points' experiments by index, those that succeeded to keep), else a new one."""
    try:
        old = json.loads((sw.out / SWEEP_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        old = {}
    same = old.get("grid") == grid and old.get("workspace") == digest
    if same and old.get("state") not in (None, "closed") and isinstance(old.get("experiments"), dict):
        sw.record, sw.parent = old, old["parent_run"]
        states = queue_states(list(old["experiments"].values()))
        kept = {i: n for i, n in old["experiments"].items() if states.get(n) == "Success"}
        stale = [n for n in old["experiments"].values() if n not in kept.values()]
        sw.names = stale  # a driver killed outright may have left them queued or running
        clear(stale)
        with GUARD.atomic():
            reopen_sweep(sw.uri, sw.parent)
            sw.save(state="running", experiments=kept)
        sw.names = list(kept.values())
        return kept
    with GUARD.atomic():  # a parent made is a parent recorded, whatever signal comes meanwhile
        grids = [a for g in grid_args for a in ("--grid", g)]
        voxpipe("sweep-open", *shared(params_file, sets, sw.uri), *grids)
        sw.record = json.loads((sw.out / SWEEP_FILE).read_text())
        sw.parent = sw.record["parent_run"]
        sw.save(state="running", workspace=digest, sets=sets, experiments={})
    return {}


def clear(names: list[str]) -> None:
    """Points of an earlier run of this sweep that did not succeed: out of the queue before they run again."""
    if names:
        _, states = settle(names, force_after=0)
        present = [n for n in names if n in states]
        if present:
            dvc("queue", "remove", *present)


def settle(names: list[str], force_after: float = KILL_WAIT_S) -> tuple[int, dict[str, str]]:
    """Until none of `names` is queued or running: the queued removed, the running interrupted as by
    Ctrl-C (`dvc queue kill`; `--force` after `force_after` s). Retried: a task just taken by a worker is
    neither removable nor yet killable, and dvc refuses a kill of a task still being set up. Returns how
    many there were, and the queue states that showed none left (what the caller goes on from: no second
    `dvc queue status`)."""
    start, interrupted, seen = time.monotonic(), set(), set()
    while True:
        states = queue_states(names)
        queued = [n for n in names if states.get(n) == "Queued"]
        running = [n for n in names if states.get(n) == "Running"]
        seen |= {*queued, *running}
        if not queued and not running:
            return len(seen), states
        waited = time.monotonic() - start
        if waited > force_after + 2 * KILL_WAIT_S:
            raise StepError(f"{', '.join(running + queued)} still running after {waited:.0f} s; "
                            "`dvc queue kill --force NAME` stops it")
        if queued:
            with contextlib.suppress(StepError):
                dvc("queue", "remove", *queued)
        force = waited > force_after
        for name in running:  # one at a time: dvc refuses the whole call if one cannot be killed yet
            if force or name not in interrupted:
                with contextlib.suppress(StepError):
                    dvc("queue", "kill", *(["--force"] if force else []), name)
                    interrupted.add(name)
        time.sleep(1)


def sweep(sw: Sweep, grid_args: list[str], params_file: str, asked_workers: int, sets: list[str],
          max_points: int, yes: bool) -> dict:
    grid = parse_grid(grid_args, params_file)
    points = grid_points(grid)
    check_bound(len(points), max_points, yes)
    params = load_params(params_file, sets)
    root = Path.cwd()
    check_data(root)
    kept = open_or_resume(sw, grid, grid_args, params_file, sets,
                          workspace_digest(root, params_file, sets, sw.uri))
    parent = sw.parent
    for i, point in enumerate(points):
        if str(i) in kept:
            say(f"{kept[str(i)]} (Success): kept from the stopped run of this sweep, ran nothing")
            continue
        base = f"sweep-{parent[:8]}-{i}"  # a point tried before gets a new name: DVC keeps names once used
        attempt = sum(1 for n in sw.record.get("tried", []) if n == base or n.startswith(base + "-r"))
        name = base + (f"-r{attempt}" if attempt else "")
        values = [*(f"{k}={set_value(v)}" for k, v in point.items()), *sets,
                  f"tracking.parent_run={parent}", f"tracking.uri={sw.uri}"]
        with GUARD.atomic():
            dvc("exp", "run", "--queue", "-n", name, *(a for v in values for a in ("-S", v)))
            sw.names.append(name)
            sw.save(experiments={**sw.record["experiments"], str(i): name},
                    tried=[*sw.record.get("tried", []), name])
    todo = [n for n in sw.names if n not in kept.values()]
    jobs = workers(asked_workers or params.sweep.workers, max(1, len(todo)))
    say(f"sweep {parent}: {len(todo)} experiments queued, {jobs} at a time"
        + (f", {len(kept)} kept from the stopped run" if kept else ""))
    if todo:
        dvc("queue", "start", "-j", str(jobs))
    logs, finished, started = {}, {}, time.monotonic()
    while len(finished) < len(todo):
        GUARD.check()
        time.sleep(POLL_S)
        states = queue_states(todo)
        for name in todo:
            state = states.get(name)
            if name in finished or state not in ("Success", "Failed", None):
                continue
            finished[name] = state or "gone"
            logs[name] = dvc("queue", "logs", name) if state else ""
            minutes = (time.monotonic() - started) / 60
            say(f"{name} ({finished[name]}): ran {', '.join(ran(logs[name])) or 'nothing'} "
                f"[{len(finished)}/{len(todo)} done, {minutes:.1f} min]")
            if state != "Success":
                raise PointFailed(name, logs[name])
    GUARD.hold()  # every point ran: the sweep closes (seconds) whatever signal comes, never half closed
    closing = voxpipe("sweep-close", *shared(params_file, sets, sw.uri), "--set",
                      f"tracking.parent_run={parent}")
    say(closing.strip())
    keep = "|".join(["Experiment", *(re.escape(k) + "$" for k in grid), *(f"^{h}$" for h in HEADLINE)])
    say(dvc("exp", "show", "--md", "--drop", ".*", "--keep", keep))
    return {"parent_run": parent, "experiments": sw.names, "logs": logs}


class PointFailed(Exception):
    def __init__(self, name: str, log: str) -> None:
        lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "")
        super().__init__(f"point {name} failed: {last[:200]}")
        self.name = name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/sweep.py", description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="append", default=[], metavar="SECTION.KEY=A,B",
                        help="a swept setting and its values (repeatable: every combination runs)")
    parser.add_argument("--grid-env", metavar="NAME",
                        help="also the entries in environment variable NAME, space-separated (make's GRID)")
    parser.add_argument("--params", default="params.yaml", help="params file (default: ./params.yaml)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting every point shares (repeatable)")
    parser.add_argument("--workers", type=int, default=0, help="experiments at once (0: sweep.workers)")
    parser.add_argument("--max-points", type=int, default=MAX_POINTS,
                        help=f"refuse a grid of more points than this without --yes (default {MAX_POINTS})")
    parser.add_argument("--yes", action="store_true", help="run a grid larger than --max-points")
    args = parser.parse_args(argv)
    GUARD.install()
    sw = None
    try:
        entries = grid_entries(args.grid, args.grid_env)
        params = load_params(args.params, args.sets)
        uri = resolve_tracking_uri(params.tracking.uri, Path(params.tracking.work))
        sw = Sweep(Path(params.sweep.out), uri)
        sweep(sw, entries, args.params, args.workers, args.sets, args.max_points, args.yes)
    except Stop as e:
        if not (sw and sw.parent):
            say(f"sweep: stopped by {e}: nothing had started", err=True)
            return 128 + signal.Signals[str(e)].value if str(e) in signal.Signals.__members__ else 1
        done = sw.stop("KILLED", f"stopped by {e}")
        say(f"sweep: stopped by {e}: {done}; the same command takes it up again, keeping the points that "
            "finished", err=True)
        return 128 + signal.Signals[str(e)].value if str(e) in signal.Signals.__members__ else 1
    except PointFailed as e:
        done = sw.stop("FAILED", str(e))
        say(f"sweep: {e}; its log: {sw.out / (e.name + '.log')}; {done}. Fix it and run the same command "
            "again: the points that succeeded are kept", err=True)
        return 1
    except StepError as e:
        done = sw.stop("FAILED", " ".join(str(e).split())[:300]) if sw and sw.parent else ""
        say(f"sweep: error: {e}" + (f" ({done})" if done else ""), err=True)
        return 1
    finally:
        GUARD.hold()  # a signal now, after the last line, changes nothing
    return 0


if __name__ == "__main__":
    sys.exit(main())
