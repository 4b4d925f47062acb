"""Provenance in the file: a C2PA manifest (content credentials, `c2pa-python`) in every non-streamed WAV and
MP3 that synthesize and serve write, saying it was made by a trained model (the IPTC digital source type
trainedAlgorithmicMedia, as the EU AI Act's Article 50 asks of synthetic audio), by which voxpipe, model
version and consent id.

The manifest is signed with the team's key and certificate, given by reference (`synthesize.c2pa_key`,
`synthesize.c2pa_cert`: a file path or `env:NAME`), never by value. Without them no manifest is added and
the caller says so (`unsigned`); the PerTh watermark (marks.py) is in the audio either way.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxpipe import __version__
from voxpipe.errors import StepError

TRAINED_ALGORITHMIC_MEDIA = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
ASSERTION = "org.voxpipe.synthesis"  # the model version, consent id and watermark of the clip
MIME = {"wav": "audio/wav", "mp3": "audio/mpeg"}
UNSIGNED = "unsigned (no key)"


@dataclass(frozen=True)
class Credentials:
    """The PEM key and certificate chain, read from their references."""

    key: bytes
    cert: bytes


def _resolve(reference: str, key: str) -> bytes:
    """A reference's PEM: `env:NAME` reads the variable, anything else is a file path."""
    if reference.startswith("env:"):
        name = reference[4:]
        value = os.environ.get(name, "")
        if not value.strip():
            raise StepError(f"synthesize.{key} names the environment variable {name[:80]}, which is unset or "
                            "empty: export the PEM in it, or set synthesize.c2pa_key and c2pa_cert to \"\" "
                            "to write clips without a C2PA manifest")
        return value.encode()
    path = Path(reference)
    if not path.is_file():
        raise StepError(f"synthesize.{key} {reference[:80]}: no such PEM file; give the file's path or "
                        "env:NAME, or \"\" to write clips without a C2PA manifest")
    return path.read_bytes()


def credentials(key: str, cert: str) -> Credentials | None:
    """The signing credentials, or None when neither reference is set (clips go out unsigned)."""
    if not key and not cert:
        return None
    if not key or not cert:
        missing = "c2pa_cert" if key else "c2pa_key"
        raise StepError(f"synthesize.{missing} is empty while its pair is set: a C2PA manifest needs both "
                        "the key and its certificate chain; set both, or neither for unsigned clips")
    return Credentials(_resolve(key, "c2pa_key"), _resolve(cert, "c2pa_cert"))


def manifest(title: str, mime: str, model_version: str, consent_id: str | None, watermark: str) -> dict:
    return {
        "claim_generator_info": [{"name": "voxpipe", "version": __version__}],
        "title": title,
        "format": mime,
        "assertions": [
            {"label": "c2pa.actions", "data": {"actions": [{
                "action": "c2pa.created", "digitalSourceType": TRAINED_ALGORITHMIC_MEDIA,
                "softwareAgent": {"name": "voxpipe", "version": __version__}}]}},
            {"label": ASSERTION, "data": {"model_version": model_version, "consent_id": consent_id,
                                          "watermark": watermark}},
        ],
    }


def sign(data: bytes, fmt: str, creds: Credentials, title: str, model_version: str,
         consent_id: str | None, watermark: str) -> bytes:
    """The encoded clip (wav or mp3) with a signed C2PA manifest embedded."""
    import c2pa

    mime = MIME[fmt]
    info = c2pa.C2paSignerInfo(c2pa.C2paSigningAlg.ES256, creds.cert, creds.key, None)
    try:
        with c2pa.Signer.from_info(info) as signer, \
                c2pa.Builder(manifest(title, mime, model_version, consent_id, watermark)) as builder:
            out = io.BytesIO()
            builder.sign(signer, mime, io.BytesIO(data), out)
            return out.getvalue()
    except c2pa.C2paError as e:
        raise StepError(f"signing the C2PA manifest failed ({str(e)[:200]}): synthesize.c2pa_key must be an "
                        "ES256 (P-256) private key in PEM and synthesize.c2pa_cert its certificate chain, "
                        "signer first, with the digitalSignature key usage and an extended key usage "
                        "(emailProtection or documentSigning)") from None


def read(path: Path) -> dict[str, Any]:
    """The file's C2PA manifest as `voxpipe detect` reports it: present, valid, signer, model version."""
    import c2pa

    mime = MIME.get(path.suffix.lower().lstrip("."))
    if mime is None:
        return {"present": False, "why": f"{path.suffix or 'no suffix'}: C2PA is read from WAV and MP3 here"}
    try:
        with path.open("rb") as f, c2pa.Reader(mime, f) as reader:
            active = reader.get_active_manifest() or {}
            state = reader.get_validation_state()
    except c2pa.C2paError as e:
        if type(e).__name__.endswith("ManifestNotFound") or "ManifestNotFound" in str(e):
            return {"present": False, "why": "no C2PA manifest in the file"}
        return {"present": True, "valid": False, "why": str(e)[:200]}
    ours = next((a.get("data", {}) for a in active.get("assertions", []) if a.get("label") == ASSERTION), {})
    signature = active.get("signature_info") or {}
    generator = (active.get("claim_generator_info") or [{}])[0]
    return {
        "present": True,
        "valid": state in ("Valid", "Trusted"),
        "validation_state": state,
        "signer": signature.get("common_name") or signature.get("issuer"),
        "claim_generator": f"{generator.get('name')}/{generator.get('version')}",
        "model_version": ours.get("model_version"),
        "consent_id": ours.get("consent_id"),
    }

