"""The params schema as a list of keys: what the CLI's flags and docs/params.md are generated from.

Each key is described once, in its schema field (voxpipe/steps/); this module only walks the
schema, so a new field shows up as a flag and in the reference without being written down again. The
same goes for a field's marks (`json_schema_extra`, voxpipe/section.py's docstring): the keys a resumed
run may change, the per-shard keys, the keys KFP wires and those DVC tracks are read from them here.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from voxpipe.params import Params


@dataclass(frozen=True)
class Key:
    key: str  # dotted: "train.lora.r"
    annotation: Any  # the field's type, Optional included
    default: Any
    description: str
    marks: dict[str, Any] = field(default_factory=dict, compare=False)  # the field's json_schema_extra

    @property
    def changes_result(self) -> bool:
        """Whether the value changes the step's result (unmarked: it does)."""
        return self.marks.get("result", True)

    @property
    def changes_weights(self) -> bool:
        """Whether it changes the weights a checkpoint holds (a result-free key does not)."""
        return self.changes_result and self.marks.get("weights", True)

    @property
    def wired(self) -> bool:
        return bool(self.marks.get("wired"))

    @property
    def shard(self) -> bool:
        return bool(self.marks.get("shard"))


def _attr(model: type[BaseModel], name: str) -> str:
    """The field of `model` that `name` (as written in params.yaml) is: `validate` is `validate_`."""
    for attr, info in model.model_fields.items():
        if name in (attr, info.alias):
            return attr
    raise KeyError(name)


def section_doc(section: str) -> str:
    """The one-paragraph docstring of a section's schema class."""
    return " ".join((Params.model_fields[_attr(Params, section)].annotation.__doc__ or "").split())


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
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            description = " ".join((info.description or "").split())
            out.append(Key(name, annotation, default, description, dict(extra)))
    return out


@functools.cache
def _every_key() -> tuple[Key, ...]:
    """The schema walked once per process: the CLI's parser asks for each step's keys, and each walk calls
    every default factory (half a second of each `voxpipe` start, walked per step)."""
    return tuple(_walk(Params, ""))


def keys(prefix: str = "") -> list[Key]:
    """Every leaf key under `prefix` ("" = all, "train", "train.lora" or one key "train.lr")."""
    found = [k for k in _every_key() if not prefix or k.key == prefix or k.key.startswith(prefix + ".")]
    if not found:
        raise KeyError(f"no params key {prefix!r}")
    return found


def fields(prefix: str) -> dict[str, list[Key]]:
    """The keys under `prefix` grouped by field of their section: `train.lora` is one field of `train` (its
    leaves together, as DVC tracks it: lora.alpha may be absent from a params file)."""
    out: dict[str, list[Key]] = {}
    for k in keys(prefix):
        out.setdefault(".".join(k.key.split(".")[:2]), []).append(k)
    return out


def base_type(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), optional  # noqa: UP007
    return annotation, False


def type_name(annotation: Any) -> str:
    """A short readable type: `int`, `list[str]`, `auto | cpu | cuda | npu`, `float | null`."""
    inner, optional = base_type(annotation)
    if typing.get_origin(inner) is typing.Annotated:  # a constrained type (launch.grace_seconds' int >= 0)
        inner = typing.get_args(inner)[0]
    if typing.get_origin(inner) is Literal:
        text = " | ".join(str(a) for a in typing.get_args(inner))
    elif typing.get_origin(inner) in (typing.Union, types.UnionType):  # ingest.locale: one, or a mapping
        text = " or ".join(type_name(a) for a in typing.get_args(inner))
    elif typing.get_origin(inner) is dict:
        text = f"dict[{', '.join(type_name(a) for a in typing.get_args(inner))}]"
    elif typing.get_origin(inner) is not None:
        text = str(inner).replace("typing.", "")
    else:
        text = getattr(inner, "__name__", str(inner))
    return f"{text} | null" if optional else text



def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return _escape(f"`{value!r}`" if isinstance(value, str) else f"`{value}`")


def reference_markdown() -> str:
    """docs/params.md: every key of every section, its type, default and description (the schema's)."""
    lines = [
        "# Params reference",
        "",
        "Generated from the schema (voxpipe/steps/) by `python -m voxpipe.paramspec docs/params.md`;",
        "tests/test_params_doc.py fails when it is stale. Set a key in params.yaml, with a recipe",
        "(`--recipe NAME`, recipes/), with `--set section.key=value`, or with the step's flag",
        "(`voxpipe <step> --help`); later ones win.",
        "",
    ]
    for section in sections():
        lines += [f"## `{section}`", ""]
        if doc := section_doc(section):
            lines += [doc, ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        for k in keys(section):
            desc = k.description + (" (wired by the pipeline)" if k.wired else "")
            kind, default, desc = _escape(type_name(k.annotation)), _cell(k.default), _escape(desc)
            lines.append(f"| `{k.key}` | {kind} | {default} | {desc} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/params.md")
    out.write_text(reference_markdown(), encoding="utf-8")
