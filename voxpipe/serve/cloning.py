"""Whose voice may be cloned (`serve.cloning`): a reference clip (`reference_audio`) or an uploaded voice
(POST /v1/audio/voices) is a person's voice, so by default (`attested`) the request names the consent record
that allows cloning it (`consent_attestation`: an id of the voices.yaml records of `ingest.input`, valid
today, scope `voice_clone`); `off` refuses every clip, `open` takes any (a closed deployment that checks
consent elsewhere). The records are read once, when the server starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voxpipe.data.consent import ConsentRecord, load_records, today
from voxpipe.errors import quoted
from voxpipe.serve.request import RequestError

FIELD = "consent_attestation"


@dataclass(frozen=True)
class Cloning:
    mode: str = "attested"  # off | attested | open (serve.cloning)
    records: dict[str, ConsentRecord] = field(default_factory=dict)  # by consent id

    @classmethod
    def read(cls, mode: str, inputs: list[str]) -> Cloning:
        return cls(mode, {r.id: r for r, _ in load_records(inputs).values()} if mode == "attested" else {})

    def scope_of(self, speaker: str) -> dict[str, Any] | None:
        """{id, scope} of a speaker's record (GET /v1/audio/voices), None when it has none here."""
        found = next((r for r in self.records.values() if r.speaker == speaker), None)
        return {"id": found.id, "scope": list(found.scope)} if found else None

    def scope_of_id(self, consent_id: str | None) -> dict[str, Any] | None:
        """{id, scope} of an added voice's consent record; None for a voice added with cloning open."""
        found = self.records.get(consent_id or "")
        return {"id": found.id, "scope": list(found.scope)} if found else None

    def allow(self, attestation: Any, what: str) -> str | None:
        """The consent id that allows cloning `what` (None: cloning is open); a RequestError naming
        consent_attestation (or the clip's field when cloning is off) otherwise."""
        if self.mode == "off":
            raise RequestError(f"{what}: cloning a voice from a clip is off on this server (serve.cloning); "
                               "use a voice of GET /v1/audio/voices")
        if self.mode == "open":
            return None
        if not isinstance(attestation, str) or not attestation:
            raise RequestError(f"{FIELD}: {what} clones a person's voice; name the consent record that "
                               "allows it (an id with scope voice_clone, serve.cloning: attested)")
        record = self.records.get(attestation)
        if record is None:
            raise RequestError(f"{FIELD} {quoted(attestation)}: no consent record of that id on this server")
        if problem := record.problem(today(), "voice_clone"):
            raise RequestError(f"{FIELD} {quoted(attestation)}: does not allow cloning: {problem}")
        return record.id
