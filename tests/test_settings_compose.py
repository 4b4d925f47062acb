"""A backend or launcher with a setting is its registry entry and its settings model: the schema composes
every registered one's settings, so a new one's key reaches params, `--set` and its step's flags with no
schema edit (voxpipe/backends.py, voxpipe/launchers.py)."""

import subprocess
import sys
import typing

from voxpipe.backends import ASR, SPEAKER
from voxpipe.launchers import LAUNCHERS
from voxpipe.params import Params
from voxpipe.steps.asr import AsrParams
from voxpipe.steps.evaluate import EvaluateParams
from voxpipe.steps.launch import LaunchParams

# registers a throwaway ASR backend and launcher, each with a setting, before the schema is imported
PROBE = """
import sys
from pydantic import Field
from voxpipe import backends, launchers
from voxpipe.section import Section

class ProbeAsr(Section):
    probe_model: str | None = Field(None, description="probe recogniser's folder")

class ProbeLauncher(Section):
    probe_every: int = Field(3, ge=1, description="probe launcher only: how often")

Backend = backends.Backend
backends.ASR["probe"] = Backend("probe", "voxpipe.data.asr:Whisper", ProbeAsr, about="probe_model")
launchers.LAUNCHERS["probe"] = Backend("probe", "voxpipe.launch.volcano:VolcanoLauncher", ProbeLauncher)

from voxpipe.cli import main
from voxpipe.params import load_params

p = load_params(sys.argv[1], overrides=["evaluate.asr=[probe]", "asr.probe_model=m/probe",
                                        "launch.backend=probe", "launch.probe_every=4"])
print("params", p.evaluate.asr, p.asr.probe_model, p.launch.backend, p.launch.probe_every)
main(["evaluate", "--help"])
"""


def test_a_new_backend_and_launcher_with_a_setting_need_no_schema_edit():
    out = subprocess.run([sys.executable, "-c", PROBE, "params.yaml"], capture_output=True, text=True,
                         check=True).stdout
    assert "params ['probe'] m/probe probe 4" in out
    help_text = " ".join(out.split())  # argparse wraps the help
    flag = "--asr-probe-model PROBE_MODEL probe recogniser's folder [asr.probe_model, default null]"
    assert flag in help_text


def test_the_schema_holds_every_registered_setting_and_choice():
    for registry, section in ((ASR, AsrParams), (SPEAKER, EvaluateParams), (LAUNCHERS, LaunchParams)):
        for backend in registry.values():
            assert set(backend.fields) <= set(section.model_fields), backend.name
    assert typing.get_args(EvaluateParams.model_fields["speaker"].annotation) == tuple(SPEAKER)
    assert typing.get_args(LaunchParams.model_fields["backend"].annotation) == tuple(LAUNCHERS)
    assert set(Params.model_fields["launch"].annotation.model_fields) >= {"runtime", "progress_every_s"}
