"""The params schema as a list of keys: what the CLI's flags and docs/params.md are generated from.

Each key is described once, in its schema field (voxpipe/params.py); this module only walks the
schema, so a new field shows up as a flag and in the reference without being written down again.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from voxpipe.params import Params


@dataclass(frozen=True)
class Key:
    key: str  # dotted: "train.lora.r"
    annotation: Any  # the field's type, Optional included
    default: Any
    description: str


def _attr(model: type[BaseModel], name: str) -> str:
    """The field of `model` that `name` (as written in params.yaml) is: `validate` is `validate_`."""
    for attr, info in model.model_fields.items():
        if name in (attr, info.alias):
            return attr
    raise KeyError(name)


def _section_doc(model: type[BaseModel]) -> str:
    doc = model.__doc__ or ""
    return "" if doc.startswith(("A base class", "Usage docs")) else " ".join(doc.split())


def section_doc(section: str) -> str:
    """The one-paragraph docstring of a section's schema class."""
    return _section_doc(Params.model_fields[_attr(Params, section)].annotation)


def sections() -> list[str]:
    """Section names as params.yaml spells them, in schema order."""
    return [info.alias or attr for attr, info in Params.model_fields.items()]


def _walk(model: type[BaseModel], prefix: str) -> list[Key]:
    out = []
    for attr, info in model.model_fields.items():
        name = f"{prefix}{info.alias or attr}"
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += _walk(annotation, name + ".")
        else:
            default = info.get_default(call_default_factory=True)
            out.append(Key(name, annotation, default, " ".join((info.description or "").split())))
    return out


def keys(prefix: str = "") -> list[Key]:
    """Every leaf key under `prefix` ("" = all, "train", "train.lora" or one key "train.lr")."""
    found = [k for k in _walk(Params, "") if not prefix or k.key == prefix or k.key.startswith(prefix + ".")]
    if not found:
        raise KeyError(f"no params key {prefix!r}")
    return found


def base_type(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return (args[0] if len(args) == 1 else annotation), True
    return annotation, False


def type_name(annotation: Any) -> str:
    """A short readable type: `int`, `list[str]`, `auto | cpu | cuda | npu`, `float | null`."""
    inner, optional = base_type(annotation)
    if typing.get_origin(inner) is Literal:
        text = " | ".join(str(a) for a in typing.get_args(inner))
    elif typing.get_origin(inner) is not None:
        text = str(inner).replace("typing.", "")
    else:
        text = getattr(inner, "__name__", str(inner))
    return f"{text} | null" if optional else text
