"""docs/params.md is generated from the schema, so it says what the code does."""

from pathlib import Path

from voxpipe.paramspec import reference_markdown, sections

DOC = Path(__file__).resolve().parents[1] / "docs" / "params.md"


def test_params_reference_is_current():
    assert DOC.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/params.md is stale: run `make generate`"
    )
    assert all(f"## `{s}`" in DOC.read_text(encoding="utf-8") for s in sections())


def test_params_yaml_is_generated_with_every_key():
    """DVC interpolates and tracks keys from params.yaml: every key must be in it, as the schema has it."""
    from voxpipe.params import load_params, params_yaml

    path = DOC.parents[1] / "params.yaml"
    assert path.read_text(encoding="utf-8") == params_yaml(load_params(path)), (
        "params.yaml is stale: run `make generate`"
    )
