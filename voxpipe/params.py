"""One typed schema for every step's parameters.

params.yaml, `--set section.key=value` overrides and step flags all land here, so DVC stages,
KFP components and make targets see the same validated values. Unknown keys and wrong types are
rejected with a message that names the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from voxpipe.errors import StepError

DEFAULT_PARAMS = Path("params.yaml")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


class IngestParams(Section):
    input: list[str] = Field(default_factory=lambda: ["data/sample"])
    out: str = "work/ingest"
    text_column: str = "text"
    audio_column: str = "audio"
    speaker_column: str = "speaker"
    sample_rate: int = Field(16000, gt=0)
    min_seconds: float = Field(0.3, ge=0)
    max_seconds: float = Field(30.0, gt=0)
    silence_threshold: float = Field(1e-3, ge=0)
    max_bad_fraction: float = Field(0.5, ge=0, le=1)
    workers: int = Field(0, ge=0, description="decode processes; 0 = all cores")


class ManifestParams(Section):
    input: list[str] = Field(default_factory=lambda: ["work/ingest/raw.jsonl"])
    out: str = "work/manifest"
    val_fraction: float = Field(0.05, ge=0, lt=1)
    min_val: int = Field(2, ge=0)
    min_speaker_rows_for_val: int = Field(4, ge=1)
    ref_fraction: float = Field(0.3, ge=0, le=1)
    seed: int = 0


class ValidateParams(Section):
    manifest: str = "work/manifest/train.jsonl"
    sample_rate: int = Field(16000, gt=0)
    min_seconds: float = Field(0.3, ge=0)
    max_seconds: float = Field(30.0, gt=0)


class Params(Section):
    ingest: IngestParams = Field(default_factory=IngestParams)
    manifest: ManifestParams = Field(default_factory=ManifestParams)
    validate_: ValidateParams = Field(default_factory=ValidateParams, alias="validate")

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    def section(self, name: str) -> Section:
        return getattr(self, _attr(name))

    def flat(self) -> dict[str, Any]:
        """`section.key` → value, for logging params as flat key/value pairs."""
        out: dict[str, Any] = {}
        for name, sec in self.model_dump(by_alias=True).items():
            for key, value in sec.items():
                out[f"{name}.{key}"] = value
        return out


def _attr(section: str) -> str:
    return "validate_" if section == "validate" else section


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise StepError(f"--set {item!r}: expected section.key=value")
    parts = key.strip().split(".")
    if len(parts) != 2:
        raise StepError(f"--set {item!r}: the key must be section.key, got {key!r}")
    return parts, yaml.safe_load(raw) if raw.strip() else ""


def _format_error(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
        else:
            lines.append(f"{key}: {e['msg']} (got {e.get('input')!r})")
    return f"invalid params ({origin}):\n  " + "\n  ".join(lines)


def load_params(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> Params:
    """Read params.yaml (if present), then apply `--set` overrides, then explicit step flags.

    `flags` maps `section.key` to a value already typed by argparse; None means "not given".
    """
    explicit = path is not None
    path = Path(path) if path is not None else DEFAULT_PARAMS
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise StepError(f"{path}: not valid YAML: {e}") from e
        if not isinstance(data, dict):
            raise StepError(f"{path}: expected a mapping of sections at the top level")
    elif explicit:
        raise StepError(f"params file {path} does not exist")
    updates = [_parse_override(o) for o in overrides or []]
    updates += [(k.split("."), v) for k, v in (flags or {}).items() if v is not None]
    for (section, key), value in updates:
        sec = data.setdefault(section, {})
        if not isinstance(sec, dict):
            raise StepError(f"{path}: section {section!r} must be a mapping")
        sec[key] = value
    try:
        return Params.model_validate(data)
    except ValidationError as e:
        raise StepError(_format_error(e, str(path))) from None
