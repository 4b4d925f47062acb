"""One typed schema for every step's parameters, composed from each step's own section.

params.yaml, `--set section.key=value` overrides and step flags all land here, so DVC stages,
KFP components and make targets see the same validated values. Unknown keys and wrong types are
rejected with a message that names the key.

The sections are the models of voxpipe/steps/ (each beside the steps that own it), composed here in
pipeline order; a field's marks are voxpipe/section.py's.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from voxpipe import steps
from voxpipe.errors import StepError, quoted
from voxpipe.section import Section

DEFAULT_PARAMS = Path("params.yaml")
MODEL_NAME_CHARS = 100  # a registered model name derived from the data is cut here
RECIPE_DIRS = (Path("recipes"), Path(__file__).resolve().parents[1] / "recipes")


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2 floats: PyYAML's 1.1 rules read `3e-4` (no dot) as a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


class _Root(Section):
    """What every composed schema can do; its fields are the sections of voxpipe/steps/."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    def section(self, name: str) -> Section:
        return getattr(self, _attr(name))

    def registered_model_name(self) -> str:
        """register.model_name, or the voice's own name derived from ingest.input (`voice_model_name`)."""
        return self.register_.model_name or voice_model_name(self.ingest.input)

    def flat(self) -> dict[str, Any]:
        """`section.key` (and `section.sub.key`) → value, for logging params as flat key/value pairs."""
        out: dict[str, Any] = {}

        def walk(prefix: str, node: dict[str, Any]) -> None:
            for key, value in node.items():
                if isinstance(value, dict):
                    walk(f"{prefix}{key}.", value)
                else:
                    out[f"{prefix}{key}"] = value

        walk("", self.model_dump(by_alias=True))
        return out



def _attr(section: str) -> str:
    """The field a section is (`validate` and `register` are BaseModel names: `validate_`, `register_`)."""
    return f"{section}_" if hasattr(BaseModel, section) else section


# the schema: every section of voxpipe/steps/, in pipeline order, composed rather than listed
Params = create_model("Params", __base__=_Root, **{
    _attr(name): (model, Field(default_factory=model, alias=name if _attr(name) != name else None))
    for name, model in steps.sections().items()})

def voice_model_name(inputs: list[str]) -> str:
    """`voxpipe-<voice>`: each input's folder or file name (`data/my-voice` -> my-voice, `s3://b/anna.parquet`
    -> anna; a glob names its folder), joined by `-`, in the characters every MLflow store takes."""
    names = []
    for entry in inputs:
        path = PurePosixPath(entry.rstrip("/").split("://")[-1])
        if any(c in path.name for c in "*?["):
            path = path.parent
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem if path.suffix else path.name).strip("-.")
        if name and name not in names:
            names.append(name)
    return "-".join(["voxpipe", *names])[:MODEL_NAME_CHARS].rstrip("-")


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise StepError(f"--set {quoted(item)}: expected section.key=value")
    parts = key.strip().split(".")
    if len(parts) < 2:
        raise StepError(f"--set {quoted(item)}: the key must be section.key (or section.sub.key), got "
                        f"{quoted(key)}")
    try:
        return parts, _yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        problem = str(e).splitlines()[0]
        raise StepError(f"--set {quoted(item)}: not valid YAML ({problem}); quote the value as a "
                        "string") from None


def _field(loc: tuple[Any, ...] | list[str]) -> Any:
    """The schema's field at `loc` (`("ingest", "input")`), or None when there is no such key."""
    model: Any = Params
    field = None
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = ({f.alias or n: f for n, f in model.model_fields.items()} | model.model_fields).get(str(part))
        if field is None:
            return None
        model = field.annotation
    return field


def _one_value_is_a_list(keys: list[str], value: Any) -> Any:
    """A list key given one value (`--set ingest.input=data/my-voice`) is the list of that one value."""
    field = _field(keys)
    scalar = isinstance(value, str | int | float) and not isinstance(value, bool)
    return [value] if scalar and field is not None and typing.get_origin(field.annotation) is list else value


def _example(loc: tuple[Any, ...]) -> str:
    """`; e.g. KEY: DEFAULT`: the key's default in the params file's own spelling, the shape it takes."""
    field = _field(loc)
    if field is None:
        return ""
    default = field.get_default(call_default_factory=True)
    if default is None or isinstance(default, BaseModel):
        return ""
    shown = yaml.dump(default, Dumper=_FileDumper, default_flow_style=True, width=200).strip()
    shown = shown.removesuffix("...").strip()
    key = ".".join(map(str, loc))
    return f"; the right shape, e.g. {key}: {shown} (on the command line: --set '{key}={shown}')"


def _format_error(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
        else:
            lines.append(f"{key}: {e['msg']} (got {quoted(e.get('input'))}){_example(e['loc'])}")
    return f"invalid params ({origin}):\n  " + "\n  ".join(lines)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = _yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise StepError(f"{path}: not valid YAML: {e}") from e
    except UnicodeDecodeError as e:
        raise StepError(f"{path}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    if not isinstance(data, dict):
        raise StepError(f"{path}: expected a mapping of sections at the top level")
    return data


def recipe_names() -> list[str]:
    """The recipes shipped in recipes/ (found from the working directory, else next to the package)."""
    return sorted({p.stem for folder in RECIPE_DIRS if folder.is_dir() for p in folder.glob("*.yaml")})


def recipe_path(name: str) -> Path:
    """`--recipe NAME`: recipes/NAME.yaml, or a YAML file of the same shape given by its path."""
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    for folder in RECIPE_DIRS:
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    raise StepError(f"no recipe {name!r}: the recipes are {', '.join(recipe_names()) or 'none here'} "
                    "(recipes/*.yaml), or give the path of a .yaml file")


def _merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`overlay` layered on `base`: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in overlay.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


class _FileDumper(yaml.SafeDumper):
    """Mappings as blocks, lists of plain values on one line (`input: [data/sample]`)."""


_FileDumper.add_representer(
    list,
    lambda dumper, value: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", value, flow_style=all(not isinstance(v, dict | list) for v in value)
    ),
)


def file_values(params: Params) -> dict[str, Any]:
    """Every key as a params file should hold it (each section's `file_values`)."""
    return {name: params.section(name).file_values() for name in steps.sections()}


def params_yaml(params: Params) -> str:
    """`params` as a params file (what `voxpipe params` prints and writes)."""
    header = ("# voxpipe params: every key, as `voxpipe params --write params.yaml` writes them. What each\n"
              "# means: docs/params.md or `voxpipe <step> --help`. Recipes (recipes/) layer on this file.\n")
    defaults = Params().flat()
    changed = [f"#   {key}: {value} (default {defaults[key]})\n" for key, value in params.flat().items()
               if defaults.get(key) != value]
    if changed:
        header += "# Not the schema's defaults here:\n" + "".join(changed)
    sections = [yaml.dump({name: values}, Dumper=_FileDumper, sort_keys=False, allow_unicode=True, width=110)
                for name, values in file_values(params).items()]
    return header + "\n".join(sections)


def _moved_keys(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """A key at its old place (`evaluate.whisper_model`) moved to where it is now (`asr.whisper_model`, from
    `steps.moved()`), so an older params file still loads; given at both places with two values: refused."""
    for old, new in steps.moved().items():
        (old_section, old_key), (new_section, new_key) = old.split("."), new.split(".")
        section = data.get(old_section)
        if not isinstance(section, dict) or old_key not in section:
            continue
        value = section.pop(old_key)
        target = data.setdefault(new_section, {})
        if not isinstance(target, dict):
            continue  # the validation names the malformed section
        if target.get(new_key) not in (None, value):
            raise StepError(f"{origin}: {old} (its old place) is {quoted(value)} but {new} is "
                            f"{quoted(target[new_key])}: keep only {new}")
        target[new_key] = value
    return data


def load_params(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
    recipe: str | None = None,
) -> Params:
    """Read params.yaml (if present), layer the recipe over it, then `--set` overrides, then step flags.

    `flags` maps `section.key` to a value already typed by argparse; None means "not given".
    """
    explicit = path is not None
    path = Path(path) if path is not None else DEFAULT_PARAMS
    data: dict[str, Any] = {}
    if path.exists():
        data = _read_yaml(path)
    elif explicit:
        raise StepError(f"params file {path} does not exist")
    origin = str(path)
    if recipe:
        overlay = recipe_path(recipe)
        data = _merge(data, _read_yaml(overlay))
        origin = f"{path} + recipe {overlay}"
    updates = [_parse_override(o) for o in overrides or []]
    updates += [(k.split("."), v) for k, v in (flags or {}).items() if v is not None]
    for keys, value in updates:
        node = data
        for depth, name in enumerate(keys[:-1]):
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise StepError(f"{path}: {'.'.join(keys[: depth + 1])!r} must be a mapping")
        node[keys[-1]] = _one_value_is_a_list(keys, value)
    try:
        return Params.model_validate(_moved_keys(data, origin))
    except ValidationError as e:
        raise StepError(_format_error(e, origin)) from None
