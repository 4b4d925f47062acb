"""The launchers by name (launch.backend): the one place a backend is registered.

params.py spells the names in launch.backend's choices (it cannot import the launchers: the params
layer sits below them).
"""

from __future__ import annotations

from collections.abc import Callable

from voxpipe.launch.base import Launcher
from voxpipe.launch.volcano import VolcanoLauncher

LAUNCHERS: dict[str, Callable[[], Launcher]] = {"volcano": VolcanoLauncher}


def launcher(backend: str) -> Launcher:
    return LAUNCHERS[backend]()  # launch.backend's schema admits only these names
