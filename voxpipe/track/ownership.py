"""Who may change the experiment and the registered model the pipeline writes to.

With MLflow's basic-auth app, whoever creates an experiment or a registered model gets MANAGE on it.
A reader who creates `voxpipe-fresh` (or a voice's default `voxpipe-<voice>`, or the experiment `voxpipe`)
before the pipeline's first `register` would own what every `models:/NAME@champion` consumer serves:
they could delete `@champion`, add a version from their own run and point `@champion` at it. So
before `register` writes anything, every other non-admin user's effective permission on both is read
(`/users/permissions/get`, which resolves roles and `default_permission` as a real request would),
and anything above READ is refused, naming the owner. Admins can change everything anyway: they are
the server's trust root, not a threat this can detect.

Reading other users' permissions takes an MLflow admin account; a pipeline account that is not one
cannot verify anything and is refused with the way out. Servers without the auth app (a local sqlite
store, a plain `mlflow server`) have no accounts: nothing to check, and a warning for a plain server.
`voxpipe registry-init` lowers every other user's direct EDIT grant to READ. Train's live run
(`train.track`) checks the experiment the same way before it creates or joins a run there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from voxpipe.errors import StepError
from voxpipe.track.tracking import locks_experiment

log = logging.getLogger(__name__)

EDITING = ("EDIT", "MANAGE")


@dataclass(frozen=True)
class Resource:
    kind: str  # the auth app's resource type: "experiment" or "registered_model"
    id: str  # experiment id, or the registered model's name
    label: str  # for messages: "experiment 'voxpipe' (id 3)"


@dataclass(frozen=True)
class Account:
    username: str
    is_admin: bool


def forbidden(e: Exception, what: str, uri: str) -> StepError:
    """A 403 from MLflow as one paragraph (the caller raises it; nothing swallows a 403)."""
    from voxpipe.secrets import scrub

    message = getattr(e, "message", str(e)).splitlines()[0]
    return StepError(f"MLflow at {_host(uri)} refused to {what} (403 permission denied: {scrub(message)}). "
                     "The pipeline's account (MLFLOW_TRACKING_USERNAME) needs MANAGE on the experiment and "
                     "the registered model: run `voxpipe registry-init` as that account, or have an MLflow "
                     "admin grant it")


def _host(uri: str) -> str:
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _request(uri: str, endpoint: str, method: str = "GET", **kwargs: Any) -> Any:
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    return http_request(get_default_host_creds(uri), endpoint, method, max_retries=2, timeout=30, **kwargs)


def current_account(uri: str) -> Account | None:
    """The account the credentials in the environment log in as; None when the server has no auth app."""
    if urlsplit(uri).scheme not in ("http", "https"):
        return None
    response = _request(uri, "/api/2.0/mlflow/users/current")
    if response.status_code == 404:
        log.warning("MLflow at %s has no authentication (no basic-auth app): anyone who reaches it can edit "
                    "the experiment and the registered model", _host(uri))
        return None
    if response.status_code != 200:
        raise StepError(f"MLflow at {_host(uri)}: reading the pipeline's own account gave HTTP "
                        f"{response.status_code}; check MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD")
    user = response.json()["user"]
    return Account(user["username"], bool(user["is_admin"]))


def _others(uri: str, me: Account, who: str = "register") -> list[str]:
    response = _request(uri, "/api/2.0/mlflow/users/list")
    if response.status_code != 200:
        raise StepError(f"MLflow at {_host(uri)}: listing users gave HTTP {response.status_code} for the "
                        f"pipeline's account {me.username!r}: {_way_out(me, who)}")
    return sorted(u["username"] for u in response.json()["users"]
                  if u["username"] != me.username and not u["is_admin"])


def _way_out(me: Account, who: str = "register") -> str:
    return (f"{who} cannot verify that nobody else can edit what it writes. Make {me.username!r} an "
            f"MLflow admin (AuthServiceClient.update_user_admin), the account {who} runs as")


def editors(uri: str, me: Account, resource: Resource, who: str = "register") -> dict[str, str]:
    """Every other non-admin user whose effective permission on `resource` is above READ: {user: perm}."""
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.client import AuthServiceClient

    if not me.is_admin:
        raise StepError(f"MLflow at {_host(uri)}: the pipeline's account {me.username!r} is no admin and may "
                        f"not read other users' permissions on the {resource.label}, so {_way_out(me, who)}")
    auth = AuthServiceClient(uri)
    found = {}
    for user in _others(uri, me, who):
        try:
            permission = auth.get_user_permission(user, resource.kind, resource.id).permission
        except MlflowException as e:
            raise forbidden(e, f"read {user!r}'s permission on the {resource.label}", uri) from e
        if permission in EDITING:
            found[user] = permission
    return found


def refuse_foreign(uri: str, me: Account, resource: Resource, lower: bool = False,
                   who: str = "register") -> list[str]:
    """StepError naming the owner when another non-admin user holds MANAGE on `resource`; one naming them
    when others hold EDIT, unless `lower` (registry-init): then their direct grants become READ.
    Returns who was lowered. Someone else's MANAGE is never taken over: what they own may hold their
    versions and aliases already."""
    found = editors(uri, me, resource, who)
    owners = [u for u, p in found.items() if p == "MANAGE"]
    who = ", ".join(f"{u!r} ({p})" for u, p in sorted(found.items()))
    if owners:
        raise StepError(
            f"the {resource.label} on MLflow at {_host(uri)} is owned by {', '.join(map(repr, owners))}, not "
            f"by the pipeline's account {me.username!r} (can edit it: {who}). Whatever it holds (versions, "
            "aliases, runs) may come from them: do not use it. Choose another name (register.model_name / "
            "tracking.experiment) and run `voxpipe registry-init`, or have an MLflow admin delete it first")
    if found and not lower:
        raise StepError(
            f"the {resource.label} on MLflow at {_host(uri)} can be edited by others than the pipeline's "
            f"account {me.username!r}: {who}. Run `voxpipe registry-init` as {me.username!r} to lower them "
            "to READ, and check the versions and aliases they may have changed")
    if found:
        _lower(uri, resource, found)
        left = editors(uri, me, resource)  # a role (not a direct grant) can still give them more
        if left:
            raise StepError(f"after lowering direct grants, {left} can still edit the {resource.label} "
                            "through roles; remove those role permissions (MLflow's roles API) and rerun "
                            "registry-init")
    return sorted(found)


def _lower(uri: str, resource: Resource, users: dict[str, str]) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.client import AuthServiceClient

    auth = AuthServiceClient(uri)
    for user in users:
        try:
            auth.revoke_user_permission(user, resource.kind, resource.id)
            auth.grant_user_permission(user, resource.kind, resource.id, "READ")
        except MlflowException as e:
            raise forbidden(e, f"lower {user!r} to READ on the {resource.label}", uri) from e


def check_owned(uri: str, experiment_id: str, experiment: str, model: str, locks: str | None = None
                ) -> Account | None:
    """Refuse when anyone but the pipeline (and admins) can edit the experiment, the registered model or
    the experiment of the register locks (`locks`, its id)."""
    me = current_account(uri)
    if me is None:
        return None
    for resource in resources(experiment_id, experiment, model, locks):
        refuse_foreign(uri, me, resource)
    return me


def check_experiment_owned(uri: str, experiment_id: str, experiment: str) -> Account | None:
    """`check_owned` for the experiment alone: train's live run (voxpipe/track/live.py) writes no model."""
    me = current_account(uri)
    if me is not None:
        experiment_resource = resources(experiment_id, experiment, "")[0]
        refuse_foreign(uri, me, experiment_resource, who="train's live run (train.track)")
    return me


def resources(experiment_id: str, experiment: str, model: str, locks: str | None = None) -> list[Resource]:
    found = [Resource("experiment", experiment_id, f"experiment {experiment!r} (id {experiment_id})"),
             Resource("registered_model", model, f"registered model {model!r}")]
    if locks is not None:
        label = f"experiment {locks_experiment(experiment)!r} (id {locks})"
        found.append(Resource("experiment", locks, label))
    return found
