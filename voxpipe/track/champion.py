"""The voice's current `@champion`, fetched for `evaluate` to re-score on the candidate's val set.

The promotion rule compares fixed-seed losses only on one val set (`voxpipe.val_digest`). When a voice's
data changed since its champion was scored, register used to refuse the candidate and leave the choice
to "moving @champion by hand". Instead evaluate scores the champion's export a third time, beside the
base and the candidate, on this val set and with these seeds, and register compares the two there.
`evaluate` sits below this layer: `voxpipe evaluate` passes this function in (the cli's `wires`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

from voxpipe.params import Params
from voxpipe.track.registry import CHAMPION, VAL_TAG, alias_version
from voxpipe.track.tracking import redact_uri, resolve_tracking_uri, session

log = logging.getLogger(__name__)
SQLITE = "sqlite:///"


@dataclass(frozen=True)
class ChampionExport:
    name: str
    version: str
    val_digest: str | None  # the val set it was scored on at register
    path: Path  # its export, downloaded


def champion_export(params: Params, folder: Path, val_digest: str | None = None) -> ChampionExport | None:
    """The voice's @champion with its export downloaded under `folder`; None when there is none, no
    registry to ask (a local store that does not exist yet is not created), or when it was scored on
    `val_digest`, the val set evaluate scores on: then there is nothing to re-score, and its export (the
    whole model) is not downloaded."""
    tracking = params.tracking
    uri = resolve_tracking_uri(tracking.uri, Path(tracking.work))
    if uri.startswith(SQLITE) and not Path(uri.removeprefix(SQLITE)).is_file():
        return None
    name = params.registered_model_name()
    import mlflow

    with session(uri) as client:
        version = alias_version(client, name, CHAMPION)
        if version is None or (val_digest is not None and version.tags.get(VAL_TAG) == val_digest):
            return None
        folder.mkdir(parents=True, exist_ok=True)
        local = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version.version}",
                                                    dst_path=str(folder))
    log.info("the champion of %r, v%s, fetched from %s to re-score", name, version.version, redact_uri(uri))
    return ChampionExport(name, version.version, version.tags.get(VAL_TAG), _checkpoint(Path(local)))


def _checkpoint(model: Path) -> Path:
    """The export inside a downloaded pyfunc model: its `checkpoint` artifact (registry.log_model), where
    the MLmodel file says it lies."""
    meta = yaml.safe_load((model / "MLmodel").read_text())
    return model / meta["flavors"]["python_function"]["artifacts"]["checkpoint"]["path"]
