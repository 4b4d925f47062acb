"""Which model `synthesize` (and anything that loads the registered pyfunc) means by `--model`.

    --model models:/NAME@ALIAS | models:/NAME/VERSION   as MLflow spells them
    --model @candidate | @champion                      an alias of `register.model_name`
    --model 3                                           a version of `register.model_name`
    --model work/train/export                           a checkpoint folder

A fine-tune that has not (yet) passed the promotion rule is registered as `@candidate` only, so
`@champion` may not exist: the error then lists the versions that do, with their aliases, and the
flag that picks one, instead of MLflow's "Registered model alias champion not found".
"""

from __future__ import annotations

import re
from pathlib import Path

from voxpipe.errors import StepError
from voxpipe.track.consent_revoke import REVOKED_TAG

REGISTRY_SCHEMES = ("models:/", "runs:/")
_VERSION = re.compile(r"^v?(\d+)$")
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")


def model_uri(spec: str, registered_name: str) -> str | None:
    """The registry URI `spec` names (None: it names a folder)."""
    if spec.startswith(REGISTRY_SCHEMES):
        return spec
    if spec.startswith("@") and len(spec) > 1:
        return f"models:/{registered_name}{spec}"
    if (m := _VERSION.match(spec)) and not Path(spec).exists():
        return f"models:/{registered_name}/{m.group(1)}"
    return None


def _listing(client, name: str) -> str:
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
    if not versions:
        return f"registered model {name!r} has no versions yet"
    aliases: dict[int, list[str]] = {}
    # the registered model carries alias -> version (search results leave the aliases out)
    for alias, version in sorted((client.get_registered_model(name).aliases or {}).items()):
        aliases.setdefault(int(version), []).append("@" + alias)
    parts = [f"{v}" + (f" ({', '.join(aliases[v])})" if v in aliases else "") for v in versions]
    return f"versions of {name!r}: {', '.join(parts)}"


def check_registered(client, uri: str, key: str = "synthesize.model") -> str:
    """The version `uri` names, pinned (`models:/NAME/VERSION`: what was spoken with is said exactly, and
    an alias moving meanwhile changes nothing); a one-paragraph StepError when `uri` names an alias,
    version or model the registry does not have."""
    from mlflow.exceptions import MlflowException

    m = _MODELS_URI.match(uri)
    if m is None:
        return uri  # runs:/ and other MLflow spellings: MLflow's own errors name them
    name, alias, version = m.group("name", "alias", "version")
    try:
        client.get_registered_model(name)
    except MlflowException:
        raise StepError(
            f"{key} {uri}: no registered model {name!r} in this registry. `voxpipe register` (the "
            "last stage of `make demo`) creates it; or give a checkpoint folder: --model work/train/export"
        ) from None
    try:
        if alias:
            found = client.get_model_version_by_alias(name, alias)
        else:
            found = client.get_model_version(name, version)
    except MlflowException:
        missing = f"no @{alias}" if alias else f"no version {version}"
        why = (" (no version has passed the promotion rule yet: a fine-tune that does not is registered "
               "as @candidate only, docs/evaluation.md)") if alias == "champion" else ""
        raise StepError(
            f"{key} {uri}: {name!r} has {missing}{why}; {_listing(client, name)}. Choose one with "
            "--model @candidate (an alias), --model N (a version number) or --model FOLDER (a checkpoint "
            "folder such as work/train/export)"
        ) from None
    if revoked := found.tags.get(REVOKED_TAG):
        raise StepError(
            f"{key} {uri}: version {found.version} of {name!r} was trained on a voice whose consent was "
            f"revoked ({revoked[:80]}), and is not served or spoken with. Choose another version with "
            f"--model N or @champion (consent-revoke moved it off this one); {_listing(client, name)}"
        )
    return f"models:/{name}/{found.version}"
