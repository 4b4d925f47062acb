"""Custom resources checked against their operators' own CRD schemas (copied into tests/data, each folder's
SOURCE.md names the commit), closed the way the API server prunes them."""

from __future__ import annotations

import typing
from pathlib import Path

import jsonschema
import yaml

DATA = Path(__file__).parent / "data"


def closed(schema: typing.Any) -> typing.Any:
    """The CRD schema with unknown fields refused, as the API server prunes them (a misspelt key would
    otherwise pass here and vanish there)."""
    if isinstance(schema, dict):
        schema = {k: closed(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    return [closed(v) for v in schema] if isinstance(schema, list) else schema


def crd_schema(path: Path, kind: str, version: str) -> dict:
    """The closed openAPIV3Schema of `kind` at `version` in the CRD file `path`."""
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["names"]["kind"] == kind
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return closed(found["schema"]["openAPIV3Schema"])


def validator(schema: dict) -> jsonschema.protocols.Validator:
    """A validator for a CRD's schema without `jsonschema.validate`'s check of the schema itself: the
    operator's own file is a valid schema (the API server loads it), and checking KServe's 2 MB one against
    the metaschema takes over half a minute on every call."""
    return jsonschema.validators.validator_for(schema)(schema)
