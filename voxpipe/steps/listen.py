"""`listen-record`'s section and step: a blind listening test's answers into MLflow."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Step


class ListenParams(Section):
    """`listen-record`: a listener's answers to evaluate's blind listening test (listen.html) into MLflow."""

    answers: str | None = Field(
        None, description="the answers file listen.html saved (its 'Save answers' button; required)",
        json_schema_extra={"result": False},
    )
    key: str = Field(
        "work/eval/listen-key.json", description="the sealed key evaluate wrote beside listen.html: which "
        "side of each trial was the fine-tune", json_schema_extra={"result": False},
    )
    registered: str = Field(
        "work/register/registered.json", description="register's registered.json: the run and model "
        "version the answers are logged to", json_schema_extra={"result": False},
    )


ORDER = 125
SECTIONS = {"listen": ListenParams}

STEPS = (
    Step("listen-record", "check a listener's answers to listen.html against its sealed key and log them to "
         "the registered run: preference rate with its binomial interval, mean CMOS with a Wilcoxon p-value; "
         "tags the version (with evaluate.listening required, a passing test moves @champion)",
         target="voxpipe.track.listen:listen_record",
         reads=("listen", "register.lock_timeout_s", "tracking"), out_folder=False),
)
