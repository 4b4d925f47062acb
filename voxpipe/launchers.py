"""The launchers by name (launch.backend): the one place each is registered.

An entry is a `Backend` (voxpipe/backends.py): the launcher's name, its class as "module:Class" (named,
not imported: this module sits below the schema, which takes launch.backend's choices from here, and
the launchers sit above it; voxpipe/launch/registry.py loads one) and its settings model, the launch.*
keys only it reads. launch's schema (voxpipe/steps/launch.py) composes every launcher's settings model,
so it names no launcher and none of their keys; a launcher refuses another's key set away from its
default (`foreign_settings`).

Adding a launcher: its module in voxpipe/launch/ (a `Launcher`), its entry here with its settings
model if it reads keys of its own, its test, and the docs (`make generate` for params.yaml and
docs/params.md).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from voxpipe.backends import Backend, backend_settings, registry
from voxpipe.section import Section


class TrainJobSettings(Section):
    runtime: str = Field(
        "", description='trainjob only: the ClusterTrainingRuntime to train on ("" = voxpipe renders its '
        "own TrainingRuntime next to the TrainJob); it must mount the workspace PVC and meet \"restricted\" "
        "itself (docs/cluster.md)"
    )
    progress_every_s: float = Field(
        30.0, ge=5, description="trainjob only: rank 0 writes the progress percentage, estimated remaining "
        "seconds and headline metrics into the TrainJob's status.trainerStatus at most this often, and "
        "once at the end (seconds; Trainer's floor is 5; docs/cluster.md)"
    )


LAUNCHERS = registry(
    Backend("volcano", "voxpipe.launch.volcano:VolcanoLauncher", about="a Volcano Job (batch.volcano.sh)"),
    Backend("trainjob", "voxpipe.launch.trainjob:TrainJobLauncher", TrainJobSettings,
            about="a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org) gang-scheduled by Volcano "
            "(docs/cluster.md)"),
)


def launcher_settings() -> tuple[type[Section], ...]:
    """Every launcher's settings model: the bases launch's schema composes (see `backend_settings`)."""
    return backend_settings(LAUNCHERS)


def listed() -> str:
    """`name = about, ...` for launch.backend's description."""
    return ", ".join(f"{b.name} = {b.about}" for b in LAUNCHERS.values())


def foreign_settings(launch: BaseModel, backend: str) -> list[tuple[str, str]]:
    """(key, its launcher) for each setting of a launcher other than `backend` (launch.backend) that
    `launch` sets away from its default: a key the chosen launcher would silently ignore."""
    return [
        (key, other.name)
        for other in LAUNCHERS.values() if other.name != backend and other.settings
        for key, field in other.settings.model_fields.items()
        if getattr(launch, key) != field.get_default(call_default_factory=True)
    ]
