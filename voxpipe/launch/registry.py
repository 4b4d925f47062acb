"""The launchers by name (launch.backend): the one place a backend is registered.

params.py spells the names in launch.backend's choices (it cannot import the launchers: the params
layer sits below them); tests/test_launch_trainjob.py keeps the two the same.
"""

from __future__ import annotations

from collections.abc import Callable

from voxpipe.launch.base import Launcher
from voxpipe.launch.trainjob import TrainJobLauncher
from voxpipe.launch.volcano import VolcanoLauncher

LAUNCHERS: dict[str, Callable[[], Launcher]] = {"volcano": VolcanoLauncher, "trainjob": TrainJobLauncher}


def launcher(backend: str) -> Launcher:
    return LAUNCHERS[backend]()  # launch.backend's schema admits only these names
