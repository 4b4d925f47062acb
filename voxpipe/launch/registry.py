"""The launcher of launch.backend, loaded from its entry in voxpipe/launchers.py (the one place a
launcher is registered, with its settings), after refusing another launcher's key it would ignore."""

from __future__ import annotations

from voxpipe.errors import StepError
from voxpipe.launch.base import Launcher
from voxpipe.launchers import LAUNCHERS, foreign_settings
from voxpipe.steps.launch import LaunchParams


def launcher(launch: LaunchParams) -> Launcher:
    for key, owner in foreign_settings(launch, launch.backend):
        default = LaunchParams.model_fields[key].get_default(call_default_factory=True)
        value = repr(getattr(launch, key))
        value = value if len(value) <= 80 else value[:77] + "..."
        raise StepError(
            f"launch.{key}={value} is a setting of launch.backend={owner}, which "
            f"launch.backend={launch.backend} does not use: leave launch.{key} at its default "
            f"({default!r}), or set launch.backend={owner}."
        )
    # launch.backend's schema admits only these names; a launcher reads its settings from the params
    return LAUNCHERS[launch.backend].imported()()
