"""How many cores this process may use: ingest's decode workers and evaluate's DNSMOS threads are sized
by it."""

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
