"""`consent`: its settings (`voxpipe consent-revoke`)."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Step


class ConsentParams(Section):
    """`consent`: withdraw a voice's consent: its record, its registered versions, its training rows."""

    id: str = Field("", max_length=120, description="the consent record's id (voices.yaml) to revoke "
                    "(required)")
    reason: str = Field("", max_length=500, description="why it is revoked, recorded in voices.yaml and on "
                        "every model version trained on the voice (required)")


ORDER = 122
SECTIONS = {"consent": ConsentParams}

STEPS = (
    Step("consent-revoke", "revoke a voice's consent: voices.yaml marks it (the next `dvc repro` quarantines "
         "its rows), every version trained on it is tagged revoked and loses @champion, serve refuses them",
         target="voxpipe.track.consent_revoke:consent_revoke",
         reads=("consent", "register.model_name", "register.lock_timeout_s", "ingest.input", "tracking"),
         hide=("register.model_name", "ingest.input"), out_folder=False),
)
