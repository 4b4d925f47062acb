"""A backend with a setting is its registry entry and its settings model: the schema composes every
registered one's settings, so a new one's key reaches params, `--set` and its step's flags with no
schema edit (voxpipe/backends.py)."""

import subprocess
import sys
import typing

from voxpipe.backends import ASR, SPEAKER
from voxpipe.steps.evaluate import EvaluateParams

# registers a throwaway ASR backend with a setting before the schema is imported
PROBE = """
import sys
from pydantic import Field
from voxpipe import backends
from voxpipe.section import Section

class ProbeAsr(Section):
    probe_model: str | None = Field(None, description="probe recogniser's folder")

Backend = backends.Backend
backends.ASR["probe"] = Backend("probe", "voxpipe.evaluate.asr:Whisper", ProbeAsr, about="probe_model")

from voxpipe.cli import main
from voxpipe.params import load_params

p = load_params(sys.argv[1], overrides=["evaluate.asr=[probe]", "evaluate.probe_model=m/probe"])
print("params", p.evaluate.asr, p.evaluate.probe_model)
main(["evaluate", "--help"])
"""


def test_a_new_backend_with_a_setting_needs_no_schema_edit():
    out = subprocess.run([sys.executable, "-c", PROBE, "params.yaml"], capture_output=True, text=True,
                         check=True).stdout
    assert "params ['probe'] m/probe" in out
    help_text = " ".join(out.split())  # argparse wraps the help
    flag = "--probe-model PROBE_MODEL probe recogniser's folder [evaluate.probe_model, default null]"
    assert flag in help_text


def test_the_schema_holds_every_registered_setting_and_choice():
    for registry in (ASR, SPEAKER):
        for backend in registry.values():
            assert set(backend.fields) <= set(EvaluateParams.model_fields), backend.name
    assert typing.get_args(EvaluateParams.model_fields["speaker"].annotation) == tuple(SPEAKER)
