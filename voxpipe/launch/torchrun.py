"""`python -m voxpipe.launch.torchrun ARGS`: torchrun, with its own arguments, for a terminal and `dvc repro`.

When a worker fails, torchrun adds a `ChildFailedError` traceback and a "Root Cause" block (the failed
ranks, their pids, a link to its docs) below the worker's own one-paragraph error, and a Ctrl-C ends in
its `SignalException` traceback. Here the workers' words stand alone: the exit status is the first failed
worker's (1 for a step's error), a worker killed by a signal is named in one line, and an interrupt says
how to go on. The pods on a cluster run torchrun itself: their logs are read per pod.
"""

from __future__ import annotations

import logging
import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

INTERRUPTED = 130  # the shell's status for a process ended by SIGINT


def _status(error: ChildFailedError) -> int:
    """The first failed worker's exit status; one line for a worker a signal killed (it said nothing)."""
    failure = min(error.failures.values(), key=lambda f: f.timestamp)
    if failure.exitcode >= 0:
        return failure.exitcode or 1
    name = signal.Signals(-failure.exitcode).name
    print(f"torchrun: rank {failure.rank} (pid {failure.pid}) was killed by {name}; the other ranks were "
          "stopped. Rerun the same command: training resumes from its newest checkpoint", file=sys.stderr)
    return 128 - failure.exitcode


def _quiet_elastic() -> None:
    """The agent's own failure and shutdown lines repeat what the workers said. Each of its loggers sets
    its level itself (torch.distributed.elastic.utils.logging), so each is quieted, not their parent."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _quiet_elastic()
    try:
        run(args)
    except ChildFailedError as e:
        return _status(e)
    except (SignalException, KeyboardInterrupt):
        print("torchrun: interrupted; every rank was stopped and what was done is kept: rerun the same "
              "command to resume", file=sys.stderr)
        return INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
