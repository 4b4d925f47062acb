"""`voxpipe registry-init`: the experiment and the registered model created by the pipeline's account.

Run once per deployment, before the first `register` (manifests/namespaced/registry-init-job.yaml runs
it in the cluster), with the pipeline's credentials in the environment. On a server with the
basic-auth app, whoever creates an experiment or a registered model owns it; creating both (and the
register lock's run) as the pipeline's account means no reader can create them first. Rerunning it is
safe: what exists and the pipeline owns is kept, other users' direct EDIT grants on it are lowered to
READ, and anything another user owns is refused, naming them (ownership.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from voxpipe.params import Params
from voxpipe.track.ownership import current_account, refuse_foreign, resources
from voxpipe.track.registry import ensure_registered_model
from voxpipe.track.reglock import lock_runs
from voxpipe.track.tracking import (
    pipeline_experiments,
    redact_uri,
    resolve_tracking_uri,
    session,
)


@dataclass
class RegistryInitResult:
    uri: str
    experiment: str
    experiment_id: str
    model: str
    account: str | None
    lowered: dict[str, list[str]] = field(default_factory=dict)

    def summary(self) -> str:
        who = f"owned by {self.account!r}, others READ" if self.account else "no accounts on this server"
        lowered = "; ".join(f"{k}: {', '.join(v)} lowered to READ" for k, v in self.lowered.items() if v)
        return (f"registry-init: experiment {self.experiment!r} (id {self.experiment_id}) and registered "
                f"model {self.model!r} at {redact_uri(self.uri)}, {who}"
                + (f"; {lowered}" if lowered else ""))


def registry_init(params: Params) -> RegistryInitResult:
    tracking, name = params.tracking, params.registered_model_name()
    work = Path(tracking.work)
    uri = resolve_tracking_uri(tracking.uri, work)
    with session(uri) as client:
        me = current_account(uri)
        experiment, locks = pipeline_experiments(client, tracking.experiment, uri, work)
        ensure_registered_model(client, name)
        lowered = {}
        if me is not None:
            for resource in resources(experiment, tracking.experiment, name, locks):
                lowered[resource.label] = refuse_foreign(uri, me, resource, lower=True)
        lock_runs(client, locks, name)  # after the check: the lock lives in the verified experiment
    account = me.username if me else None
    return RegistryInitResult(uri, tracking.experiment, experiment, name, account, lowered)
