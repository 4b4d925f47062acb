"""`asr`: where each recogniser's model is, for both steps that recognise speech (no step of its own).

ingest transcribes rows without text with the recognisers `ingest.asr` names, evaluate scores generated
clips with those `evaluate.asr` names; both lists name backends of voxpipe/backends.py's `ASR`, and each
backend's settings (its model folder) are composed here from that registry, said once. So ingest's DVC
stage tracks these keys and this module, not evaluate's section.
"""

from __future__ import annotations

from voxpipe.backends import ASR, backend_settings
from voxpipe.section import Section


class AsrParams(*backend_settings(ASR), Section):  # type: ignore[misc]
    """`asr`: the recognisers' local model folders (nothing downloads), read by ingest and evaluate."""


ORDER = 15
SECTIONS = {"asr": AsrParams}
# where these keys were before (evaluate.*): an older params file still loads (voxpipe/params.py)
MOVED = {f"evaluate.{name}": f"asr.{name}" for name in ("whisper_model", "paraformer_model")}
