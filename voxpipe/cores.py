"""How many cores this process may use: ingest's decode workers, evaluate's DNSMOS threads and torch's
threads in `voxpipe serve` and `synthesize` are sized by it."""

from __future__ import annotations

import math
import os
from pathlib import Path

CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"


def usable_cores(cpu_max: Path = CPU_MAX) -> int:
    """The cores this process may run on: its CPU affinity (taskset, cpusets), capped by a cgroup CPU
    quota. A pod limited to 4 CPUs on a 64-core node sees all 64 in its affinity; 64 decode workers
    there would crowd into the quota of 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    return max(1, min(cores, math.ceil(int(quota) / int(period))))


def torch_threads(cores: int, event_loop: bool, streams: int = 1) -> tuple[int, int]:
    """(intra-op, inter-op) torch threads for a process that may use `cores`. An event loop beside torch keeps
    one of them where there are several (torch's threads spinning against the loop made one request 5-7
    times slower on a shared machine); the rest are split between the `streams` threads that run torch ops
    at the same time (each op's intra-op threads are a team of its own: two teams of every core would spin
    against each other). One inter-op thread: the model's forward never forks work."""
    left = cores - 1 if event_loop and cores > 1 else cores
    return max(1, left // streams), 1


def use_cores(event_loop: bool, streams: int = 1, cpu_max: Path = CPU_MAX) -> dict[str, int]:
    """Size torch's threads by the cores this process may use (`usable_cores`, `torch_threads`), not the
    cores the machine has; returns what was set, for logs and benchmarks. The inter-op count can only be set
    before torch's first parallel work: after it, the one torch has is kept and reported."""
    import torch

    cores = usable_cores(cpu_max)
    intra, inter = torch_threads(cores, event_loop, streams)
    torch.set_num_threads(intra)
    try:
        torch.set_num_interop_threads(inter)
    except RuntimeError:  # already started
        pass
    return {"usable_cores": cores, "intra_op_threads": torch.get_num_threads(),
            "inter_op_threads": torch.get_num_interop_threads()}
